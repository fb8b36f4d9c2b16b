//! Safetensors files through MLX's own reader and writer: every tensor of a file lazily read (the
//! loader's fallback and the tests' reference), and a file written from arrays with metadata.

use crate::{check, cstring, ffi, make, Handle, Result};
use std::ffi::CStr;
use std::ptr;

/// Tensors (lazily read) and metadata of one safetensors file.
pub struct Loaded {
    pub tensors: Vec<(String, Handle)>,
    pub metadata: Vec<(String, String)>,
}

pub fn load_safetensors(path: &str) -> Result<Loaded> {
    let cpath = cstring(path)?;
    let mut t: ffi::mlxs_tensors = ptr::null_mut();
    check(unsafe { ffi::mlxs_safetensors_load(&mut t, cpath.as_ptr()) })?;
    if t.is_null() {
        return Err("MLX returned no tensors".into());
    }
    let text = |p: *const std::ffi::c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    let result = (|| {
        let n = unsafe { ffi::mlxs_tensors_len(t) };
        let mut tensors = Vec::with_capacity(n);
        for i in 0..n {
            let name = text(unsafe { ffi::mlxs_tensors_name(t, i) });
            let a = make(|o| unsafe { ffi::mlxs_tensors_array(o, t, i) })?;
            tensors.push((name, a));
        }
        let m = unsafe { ffi::mlxs_tensors_meta_len(t) };
        let metadata = (0..m)
            .map(|i| unsafe { (text(ffi::mlxs_tensors_meta_key(t, i)), text(ffi::mlxs_tensors_meta_value(t, i))) })
            .collect();
        Ok(Loaded { tensors, metadata })
    })();
    // SAFETY: `t` was created by the shim and is not used after this.
    unsafe { ffi::mlxs_tensors_free(t) };
    result
}

pub fn save_safetensors(path: &str, tensors: &[(&str, &Handle)], metadata: &[(&str, &str)]) -> Result<()> {
    let cpath = cstring(path)?;
    let names = tensors.iter().map(|(n, _)| cstring(n)).collect::<Result<Vec<_>>>()?;
    let name_ptrs: Vec<_> = names.iter().map(|n| n.as_ptr()).collect();
    let arrays: Vec<_> = tensors.iter().map(|(_, a)| a.raw()).collect();
    let keys = metadata.iter().map(|(k, _)| cstring(k)).collect::<Result<Vec<_>>>()?;
    let vals = metadata.iter().map(|(_, v)| cstring(v)).collect::<Result<Vec<_>>>()?;
    let key_ptrs: Vec<_> = keys.iter().map(|k| k.as_ptr()).collect();
    let val_ptrs: Vec<_> = vals.iter().map(|v| v.as_ptr()).collect();
    check(unsafe {
        ffi::mlxs_safetensors_save(
            cpath.as_ptr(),
            name_ptrs.as_ptr(),
            arrays.as_ptr(),
            arrays.len(),
            key_ptrs.as_ptr(),
            val_ptrs.as_ptr(),
            key_ptrs.len(),
        )
    })
}
