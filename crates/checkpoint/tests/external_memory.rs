//! Weights MLX uses in place in a mapped file count in the memory figures (`peak_memory` adds
//! them, as mlx-lm's figure counts the weights `mx.load` copies), from load until the last array
//! over them is dropped. Alone in its test binary: the count is process-wide.
use checkpoint::safetensors;

/// A safetensors file of `tensors` f32 tensors of `n` elements each, aligned, back to back.
fn write(path: &std::path::Path, tensors: usize, n: usize) {
    let mut header = serde_json::Map::new();
    for i in 0..tensors {
        let at = i * n * 4;
        header.insert(format!("t{i}"), serde_json::json!({"dtype": "F32", "shape": [n], "data_offsets": [at, at + n * 4]}));
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend((0..tensors * n).flat_map(|i| (i as f32).to_le_bytes()));
    std::fs::write(path, out).unwrap();
}

#[test]
fn weights_used_in_place_count_until_dropped() {
    let dir = std::env::temp_dir().join(format!("mlx-gen-external-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    write(&path, 3, 1000);
    let before = mlx::runtime::external_memory();
    let loaded = safetensors::load(&path).unwrap();
    let held = mlx::runtime::external_memory() - before;
    if mlx_sys::BUILD_BACKEND == "cpu" {
        assert_eq!(loaded.stats.in_place, 3);
        assert_eq!(held, 12_000, "the three tensors' bytes are held in place");
    }
    assert!(mlx::runtime::peak_memory() >= held, "peak memory counts the weights in place");
    let (keep, rest): (Vec<_>, Vec<_>) = loaded.tensors.into_iter().partition(|(name, _)| name == "t0");
    drop(rest);
    if mlx_sys::BUILD_BACKEND == "cpu" {
        assert_eq!(mlx::runtime::external_memory() - before, 4_000, "dropped tensors no longer count");
    }
    drop(keep);
    assert_eq!(mlx::runtime::external_memory(), before, "nothing counts once every array is gone");
    let _ = std::fs::remove_dir_all(&dir);
}
