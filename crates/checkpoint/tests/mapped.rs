//! Memory-mapped safetensors loading: every dtype used in place equals MLX's own (copying) reader,
//! misaligned data still loads (copied), and truncated or corrupt files are errors naming the file.
use checkpoint::safetensors;
use mlx::Array;
use std::path::{Path, PathBuf};

/// One tensor as stored: safetensors dtype name, shape, raw bytes.
struct T<'a>(&'a str, &'a str, Vec<u64>, Vec<u8>);

/// Writes a safetensors file, header padded to 8 bytes, each tensor starting on a multiple of
/// `align` bytes plus `gap` into the data section (`align` 8, `gap` 0: every tensor aligned;
/// `align` 1, `gap` 1: back to back from an odd start, most wider than a byte misaligned).
fn write(path: &Path, tensors: &[T], align: u64, gap: u64) {
    let mut header = serde_json::Map::new();
    let mut data = vec![0u8; gap as usize];
    for T(name, dtype, shape, bytes) in tensors {
        while data.len() as u64 % align != gap % align {
            data.push(0);
        }
        let at = data.len() as u64;
        data.extend(bytes);
        header.insert((*name).into(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, data.len()]}));
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "mlx"}));
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx-gen-mapped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// One tensor of every dtype MLX reads (float16/bfloat16 bit patterns kept finite, packed U32 quant
/// weights as in an MLX 4-bit checkpoint).
fn every_dtype() -> Vec<T<'static>> {
    let halves = |n: usize| -> Vec<u8> { (0..n).flat_map(|i| (0x3c00u16 + i as u16).to_le_bytes()).collect() };
    vec![
        T("f32", "F32", vec![3, 5], (0..15).flat_map(|i| (i as f32 * 0.25 - 1.0).to_le_bytes()).collect()),
        T("f16", "F16", vec![4, 3], halves(12)),
        T("bf16", "BF16", vec![2, 7], halves(14)),
        T("q.weight", "U32", vec![4, 2], bytes(32, 7)),
        T("u8", "U8", vec![5], bytes(5, 1)),
        T("i8", "I8", vec![3], bytes(3, 2)),
        T("u16", "U16", vec![3], bytes(6, 3)),
        T("i16", "I16", vec![2], bytes(4, 4)),
        T("i32", "I32", vec![2, 2], bytes(16, 5)),
        T("i64", "I64", vec![3], bytes(24, 6)),
        T("u64", "U64", vec![1], bytes(8, 8)),
        T("bool", "BOOL", vec![4], vec![0, 1, 1, 0]),
        T("fp8", "F8_E4M3", vec![6], bytes(6, 9)),
        T("empty", "F32", vec![0, 4], vec![]),
        T("scalar", "F32", vec![], 2.5f32.to_le_bytes().to_vec()),
    ]
}

fn by_name(tensors: Vec<(String, Array)>) -> std::collections::BTreeMap<String, Array> {
    tensors.into_iter().collect()
}

/// Each loaded tensor has the stored shape and bytes, and equals MLX's own reader's.
fn check_against_mlx(path: &Path, stored: &[T]) -> safetensors::LoadStats {
    let loaded = safetensors::load(path).unwrap();
    let stats = loaded.stats;
    let ours = by_name(loaded.tensors);
    let theirs = by_name(mlx::io::load_safetensors(path).unwrap().tensors);
    assert_eq!(ours.len(), stored.len());
    for T(name, _, shape, data) in stored {
        let (a, b) = (&ours[*name], &theirs[*name]);
        let shape: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        assert_eq!(a.shape(), shape, "{name}");
        assert_eq!(a.dtype(), b.dtype(), "{name}");
        assert_eq!(&a.to_bytes().unwrap(), data, "{name}");
        assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap(), "{name}");
    }
    stats
}

/// Every dtype written as `write(.., align, gap)` and checked against MLX's reader.
fn every_dtype_written(name: &str, align: u64, gap: u64) -> (Vec<T<'static>>, safetensors::LoadStats) {
    let path = tmp(name);
    let stored = every_dtype();
    write(&path, &stored, align, gap);
    let stats = check_against_mlx(&path, &stored);
    (stored, stats)
}

#[test]
fn every_dtype_in_place_equals_the_copied_one() {
    let (stored, stats) = every_dtype_written("aligned.safetensors", 8, 0);
    let nonempty = stored.iter().filter(|t| !t.3.is_empty()).count();
    assert_eq!(stats.bytes, stored.iter().map(|t| t.3.len() as u64).sum::<u64>());
    if mlx_sys::BUILD_BACKEND == "cpu" {
        assert_eq!((stats.in_place, stats.copied), (nonempty, 1), "only the empty tensor is copied on the CPU");
    }
}

#[test]
fn misaligned_data_loads_by_copy() {
    let (_, stats) = every_dtype_written("misaligned.safetensors", 1, 1);
    assert!(stats.copied >= 8, "{stats:?}");
}

#[test]
fn arrays_outlive_the_loader_and_the_file_name() {
    let path = tmp("outlive.safetensors");
    let stored = every_dtype();
    write(&path, &stored, 8, 0);
    let a = by_name(safetensors::load(&path).unwrap().tensors).remove("f32").unwrap();
    std::fs::remove_file(&path).unwrap();
    // The mapping lives on in the array: an op over it, after everything else is gone.
    let doubled = a.mul_scalar(2.0).unwrap();
    let want: Vec<f32> = (0..15).map(|i| (i as f32 * 0.25 - 1.0) * 2.0).collect();
    assert_eq!(doubled.to_vec::<f32>().unwrap(), want);
}

fn load_error(name: &str, file: &[u8]) -> String {
    let path = tmp(name);
    std::fs::write(&path, file).unwrap();
    let err = safetensors::load(&path).err().expect("a broken file must not load").to_string();
    assert!(err.contains(name), "{err}");
    err
}

#[test]
fn truncated_and_corrupt_files_are_typed_errors() {
    let path = tmp("good.safetensors");
    write(&path, &every_dtype(), 8, 0);
    let good = std::fs::read(&path).unwrap();
    // Cut inside the tensor data, inside the header, inside the length.
    assert!(load_error("cut-data.safetensors", &good[..good.len() - 3]).contains("truncated"));
    assert!(load_error("cut-header.safetensors", &good[..20]).contains("header length"));
    assert!(load_error("cut-length.safetensors", &good[..5]).contains("shorter than its header"));
    assert!(load_error("empty.safetensors", &[]).contains("shorter than its header"));
    // A header length past the end, and one absurdly large.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(load_error("huge-header.safetensors", &huge).contains("header length"));
    // Header bytes that are not JSON.
    let mut garbage = good.clone();
    garbage[8] = b'#';
    assert!(load_error("garbage.safetensors", &garbage).contains("JSON"));
    // Entries that lie: a size that does not match the shape, offsets reversed, an unknown dtype.
    let entry = |e: serde_json::Value| {
        let h = serde_json::to_vec(&serde_json::json!({ "x": e })).unwrap();
        let mut f = (h.len() as u64).to_le_bytes().to_vec();
        f.extend(h);
        f.extend([0u8; 16]);
        f
    };
    let e = load_error("size.safetensors", &entry(serde_json::json!({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})));
    assert!(e.contains("8 bytes for shape [3]"), "{e}");
    let e = load_error("reversed.safetensors", &entry(serde_json::json!({"dtype": "F32", "shape": [0], "data_offsets": [8, 4]})));
    assert!(e.contains("truncated or corrupt"), "{e}");
    let e = load_error("dtype.safetensors", &entry(serde_json::json!({"dtype": "F64", "shape": [2], "data_offsets": [0, 16]})));
    assert!(e.contains("unsupported dtype F64"), "{e}");
    let e = load_error("shape.safetensors", &entry(serde_json::json!({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})));
    assert!(e.contains("shape"), "{e}");
    let e = load_error("overflow.safetensors", &entry(serde_json::json!({"dtype": "F32", "shape": [2147483647, 2147483647, 2147483647], "data_offsets": [0, 4]})));
    assert!(e.contains("bytes for shape"), "{e}");
}
