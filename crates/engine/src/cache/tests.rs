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
