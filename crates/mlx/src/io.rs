//! Reading and writing safetensors files through MLX.
use crate::array::Array;
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
