//! `trim` on every cache kind: where it works, and the clear error where it cannot.
use super::*;
use mlx::{ops, Dtype};

fn kv(n: i32) -> Array {
    ops::arange(0.0, f64::from(n * 32), 1.0, Dtype::F32).unwrap().reshape(&[1, 1, n, 32]).unwrap()
}

#[test]
fn growing_quantized_and_paged_caches_trim() {
    let spec = QuantSpec::affine(32, 8);
    let pool = PagedPool::new(1, 4, 1 << 20);
    let mut caches: Vec<Box<dyn KvCache>> =
        vec![Box::new(GrowingCache::new()), Box::new(QuantizedCache::new(spec)), pool.new_sequence(&[]).0.remove(0)];
    for c in &mut caches {
        if c.quantization().is_some() {
            c.update_and_fetch_quantized(&kv(10), &kv(10)).unwrap();
        } else {
            c.update_and_fetch(&kv(10), &kv(10)).unwrap();
        }
        assert!(c.is_trimmable());
        assert_eq!(c.trim(3).unwrap(), 3);
        assert_eq!(c.offset(), 7);
        assert_eq!(c.trim(100).unwrap(), 7);
        assert_eq!(c.offset(), 0);
    }
}

#[test]
fn a_wrapped_rotating_cache_refuses_to_trim() {
    let mut c = RotatingCache::new(8, 4);
    c.update_and_fetch(&kv(5), &kv(5)).unwrap();
    assert_eq!(c.trim(2).unwrap(), 2);
    c.update_and_fetch(&kv(6), &kv(6)).unwrap();
    assert!(!c.is_trimmable());
    let e = c.trim(1).unwrap_err().to_string();
    assert!(e.contains("cannot be trimmed"), "{e}");
    let mut all: Vec<Box<dyn KvCache>> = vec![Box::new(c)];
    assert!(trim_prompt_cache(&mut all, 1).is_err());
}

/// A cache list trims both parts, and goes through a prompt-cache file as mlx-lm's `CacheList`
/// (each part's state and class name), coming back with the same offsets and contents.
#[test]
fn a_cache_list_trims_and_round_trips_through_a_file() {
    let parts: Vec<Box<dyn KvCache>> = vec![Box::new(GrowingCache::new()), Box::new(GrowingCache::new())];
    let mut list = ListCache::new(parts).unwrap();
    assert!(list.update_and_fetch(&kv(1), &kv(1)).is_err(), "a list is updated through its parts");
    let parts = list.parts_mut().unwrap();
    parts[0].update_and_fetch(&kv(9), &kv(9)).unwrap();
    parts[1].update_and_fetch(&kv(9), &kv(9).mul_scalar(2.0).unwrap()).unwrap();
    assert_eq!(list.trim(2).unwrap(), 2);
    assert_eq!(list.offset(), 7);
    let path = std::env::temp_dir().join(format!("mlx-gen-cache-list-{}.safetensors", std::process::id()));
    save_prompt_cache(&path, &[Box::new(list) as Box<dyn KvCache>], &[]).unwrap();
    let mut loaded = load_prompt_cache(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let (class, _) = loaded.cache[0].saved_state().unwrap();
    assert_eq!(class, "CacheList");
    let parts = loaded.cache[0].parts_mut().expect("a list again");
    assert_eq!(parts.len(), 2);
    for (i, p) in parts.iter_mut().enumerate() {
        assert_eq!(p.offset(), 7);
        let (_, v) = p.update_and_fetch(&kv(1), &kv(1)).unwrap();
        let want = kv(9).slice_axis(2, 0, 7).unwrap().mul_scalar(if i == 0 { 1.0 } else { 2.0 }).unwrap();
        assert_eq!(v.slice_axis(2, 0, 7).unwrap().to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap(), "part {i}");
    }
}

#[test]
fn a_recurrent_state_refuses_to_trim_and_batches_by_rows() {
    let state = |v: f32| ops::full(&[1, 2, 3], f64::from(v), Dtype::F32).unwrap();
    let mut one = ArraysCache::new(2);
    assert!(one.is_empty());
    one.set(0, state(1.0)).unwrap();
    one.set(1, state(10.0)).unwrap();
    one.advance(5);
    assert_eq!(one.offset(), 5);
    assert!(!one.is_trimmable());
    assert_eq!(one.trim(0).unwrap(), 0);
    let e = one.trim(1).unwrap_err().to_string();
    assert!(e.contains("cannot be trimmed"), "{e}");
    let mut all: Vec<Box<dyn KvCache>> = vec![Box::new(one.clone()), Box::new(GrowingCache::new())];
    let e = trim_prompt_cache(&mut all, 1).unwrap_err().to_string();
    assert!(e.contains("recurrent"), "{e}");
    // Rows: extend concatenates, filter keeps the named ones in order.
    let mut two = ArraysCache::new(2);
    two.set(0, state(2.0)).unwrap();
    two.set(1, state(20.0)).unwrap();
    let mut batch = ArraysCache::batch(2);
    batch.extend(&one).unwrap();
    batch.extend(&two).unwrap();
    assert_eq!(batch.get(1).unwrap().shape(), vec![2, 2, 3]);
    batch.filter(&[1]).unwrap();
    assert_eq!(batch.get(0).unwrap().to_vec::<f32>().unwrap(), vec![2.0; 6]);
    // mlx-lm's state layout: ([conv, recurrent], left_padding, lengths).
    let (class, nodes) = one.saved_state().unwrap();
    assert_eq!(class, "ArraysCache");
    assert!(matches!(nodes.as_slice(), [StateNode::List(s), StateNode::None, StateNode::None] if s.len() == 2));
}
