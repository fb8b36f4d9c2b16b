//! Reading and writing safetensors files through MLX.
use crate::array::{Array, Dtype};
use crate::error::{ctx, Result};
use std::path::Path;

/// The tensors of one safetensors file, in file order, and its metadata.
pub struct SafeTensors {
    pub tensors: Vec<(String, Array)>,
    pub metadata: Vec<(String, String)>,
}

/// Loads a safetensors file (tensors are read when first evaluated).
#[track_caller]
pub fn load_safetensors(path: &Path) -> Result<SafeTensors> {
    let loaded = ctx("load_safetensors", mlx_sys::load_safetensors(&path.to_string_lossy()))?;
    Ok(SafeTensors {
        tensors: loaded.tensors.into_iter().map(|(n, h)| (n, Array::from_handle(h))).collect(),
        metadata: loaded.metadata,
    })
}

#[track_caller]
pub fn save_safetensors(path: &Path, tensors: &[(&str, &Array)], metadata: &[(&str, &str)]) -> Result<()> {
    let t: Vec<(&str, &mlx_sys::Handle)> = tensors.iter().map(|(n, a)| (*n, a.handle())).collect();
    ctx("save_safetensors", mlx_sys::save_safetensors(&path.to_string_lossy(), &t, metadata))
}

/// A file mapped read-only into memory, whose bytes arrays can use in place ([`from_mapping_many`]).
pub use mlx_sys::mapped::Mapping;

/// Arrays over `map`'s bytes, one for each `(offset, shape, dtype)` tensor (row-major, the range
/// inside the mapping, past its first 8 bytes, aligned to the element size), in the order given,
/// each with whether it is used in place: where the backend can (the CPU; Metal for page-aligned
/// data), else copied once (CUDA), several tensors at a time on up to 8 threads
/// (`MLX_GEN_LOAD_THREADS=N` sets how many: a copy into CUDA's managed memory faults its pages in
/// on the host, and how many threads pay is what to measure). The mapping stays alive while an
/// array needs it.
#[track_caller]
pub fn from_mapping_many(map: &std::sync::Arc<Mapping>, tensors: &[(usize, &[i32], Dtype)]) -> Vec<Result<(Array, bool)>> {
    let ranges: Vec<_> = tensors
        .iter()
        .map(|&(offset, shape, dtype)| mlx_sys::mapped::MappedRange { offset, shape, dtype: dtype.code(), itemsize: dtype.size() })
        .collect();
    let made = load_threads().map(|threads| mlx_sys::mapped::from_mapping_many(map, &ranges, threads));
    each(made, tensors.len()).into_iter().map(|r| ctx("array from mapped file", r).map(|(h, in_place)| (Array::from_handle(h), in_place))).collect()
}

/// Threads copying a file's tensors: `MLX_GEN_LOAD_THREADS` (a whole number from 1), else the
/// machine's cores up to 8.
fn load_threads() -> std::result::Result<usize, String> {
    match std::env::var("MLX_GEN_LOAD_THREADS") {
        Ok(v) => v.trim().parse::<usize>().ok().filter(|&n| n >= 1).ok_or(format!("MLX_GEN_LOAD_THREADS={v:?} is not a whole number from 1")),
        Err(_) => Ok(std::thread::available_parallelism().map_or(1, |n| n.get().min(8))),
    }
}

/// The results of `n` tensors made on the loader's threads, or the thread count's error for each.
fn each<T>(made: std::result::Result<Vec<mlx_sys::Result<T>>, String>, n: usize) -> Vec<mlx_sys::Result<T>> {
    made.unwrap_or_else(|message| (0..n).map(|_| Err(message.clone())).collect())
}

/// Arrays of `(offset, shape, dtype)` tensors read from `file`, each in one copy into a buffer MLX
/// uses as it is (for data a mapping cannot hand over: not on an element boundary, as in every file
/// MLX's own `save_safetensors` writes), several at a time on [`from_mapping_many`]'s threads, in
/// the order given.
#[track_caller]
pub fn read_many(file: &std::fs::File, tensors: &[(u64, &[i32], Dtype)]) -> Vec<Result<Array>> {
    let ranges: Vec<_> = tensors.iter().map(|&(offset, shape, dtype)| mlx_sys::mapped::FileRange { offset, shape, dtype: dtype.code() }).collect();
    let read = load_threads().map(|threads| mlx_sys::mapped::read_many(file, &ranges, threads));
    each(read, tensors.len()).into_iter().map(|r| ctx("array read from file", r).map(Array::from_handle)).collect()
}
