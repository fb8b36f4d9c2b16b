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
/// data), else copied once (CUDA), several tensors at a time on up to 8 threads. The mapping stays
/// alive while an array needs it.
#[track_caller]
pub fn from_mapping_many(map: &std::sync::Arc<Mapping>, tensors: &[(usize, &[i32], Dtype)]) -> Vec<Result<(Array, bool)>> {
    let ranges: Vec<_> = tensors
        .iter()
        .map(|&(offset, shape, dtype)| mlx_sys::mapped::MappedRange { offset, shape, dtype: dtype.code(), itemsize: dtype.size() })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    mlx_sys::mapped::from_mapping_many(map, &ranges, threads)
        .into_iter()
        .map(|r| ctx("array from mapped file", r).map(|(h, in_place)| (Array::from_handle(h), in_place)))
        .collect()
}

/// An array of `shape` elements of `dtype` read from `file` at byte `offset`, in one copy into a
/// buffer MLX uses as it is (for data a mapping cannot hand over: not on an element boundary).
#[track_caller]
pub fn read_at(file: &std::fs::File, offset: u64, shape: &[i32], dtype: Dtype) -> Result<Array> {
    ctx("array read from file", mlx_sys::mapped::read_at(file, offset, shape, dtype.code(), dtype.size())).map(Array::from_handle)
}
