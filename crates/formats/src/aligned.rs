//! Writing safetensors files whose tensor data start page-aligned, so that a reader mapping the
//! file hands each tensor to MLX in place: on the CPU any element-aligned tensor qualifies, Metal
//! wraps host memory only at page boundaries (16 KiB on Apple silicon, so 16 KiB here, which also
//! covers 4 KiB pages).
//!
//! Still the safetensors layout that MLX's `mx.load` (and so mlx-lm) reads: the header JSON is
//! padded with trailing spaces, as the format allows, so that the data section starts on a page,
//! and each tensor's `data_offsets` start on a page, the bytes between tensors zero. (The Hugging
//! Face `safetensors` library's own validation also asks that tensors be back to back, with no such
//! gaps; MLX's reader does not.)
use crate::{FormatError, Result};
use mlx::{Array, Dtype};
use std::io::Write;
use std::path::Path;

/// Where tensor data start: a multiple of this many bytes from the start of the file.
pub const ALIGN: usize = 16384;

fn dtype_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::Bool => "BOOL",
        Dtype::U8 => "U8",
        Dtype::U16 => "U16",
        Dtype::U32 => "U32",
        Dtype::U64 => "U64",
        Dtype::I8 => "I8",
        Dtype::I16 => "I16",
        Dtype::I32 => "I32",
        Dtype::I64 => "I64",
        Dtype::F16 => "F16",
        Dtype::F32 => "F32",
        Dtype::BF16 => "BF16",
        Dtype::C64 => "C64",
        Dtype::F64 => return None,
    })
}

fn round_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// The header (padded so that the data start on a page) and each tensor's offset in the data.
fn layout(tensors: &[(&str, &Array)], metadata: &[(&str, &str)]) -> Result<(Vec<u8>, Vec<usize>)> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = metadata.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        header.insert("__metadata__".into(), meta.into());
    }
    let mut starts = Vec::with_capacity(tensors.len());
    let mut at = 0usize;
    for (name, a) in tensors {
        let dtype = dtype_name(a.dtype()).ok_or_else(|| FormatError::Invalid(format!("tensor {name}: safetensors cannot hold {}", a.dtype())))?;
        let start = round_up(at);
        let end = start + a.nbytes();
        header.insert((*name).into(), serde_json::json!({"dtype": dtype, "shape": a.shape(), "data_offsets": [start, end]}));
        starts.push(start);
        at = end;
    }
    let mut json = serde_json::to_vec(&header).map_err(|e| FormatError::Invalid(e.to_string()))?;
    json.resize(round_up(8 + json.len()) - 8, b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    Ok((out, starts))
}

/// Writes `tensors` (evaluated one at a time) to `path` with page-aligned data.
pub fn save(path: &Path, tensors: &[(&str, &Array)], metadata: &[(&str, &str)]) -> Result<()> {
    let io = |e: std::io::Error| FormatError::file(path, e);
    let (header, starts) = layout(tensors, metadata)?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).map_err(io)?);
    f.write_all(&header).map_err(io)?;
    let mut at = 0usize;
    for ((name, a), start) in tensors.iter().zip(starts) {
        f.write_all(&vec![0u8; start - at]).map_err(io)?;
        let bytes = a.to_bytes().map_err(|e| FormatError::Invalid(format!("tensor {name}: {}", e.message)))?;
        f.write_all(&bytes).map_err(io)?;
        at = start + bytes.len();
    }
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_every_tensor_start_on_a_page() {
        let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let b = Array::from_slice(&[7u32; 5000], &[5000]).unwrap();
        let (header, starts) = layout(&[("a", &a), ("b", &b), ("c", &a)], &[("format", "mlx")]).unwrap();
        assert_eq!(header.len() % ALIGN, 0);
        assert_eq!(starts, [0, ALIGN, 3 * ALIGN], "b takes 20000 bytes: c starts on the page after it");
        let n = u64::from_le_bytes(header[..8].try_into().unwrap()) as usize;
        let json: serde_json::Value = serde_json::from_slice(&header[8..8 + n]).unwrap();
        assert_eq!(json["b"]["data_offsets"], serde_json::json!([ALIGN, ALIGN + 20000]));
        assert_eq!(json["__metadata__"]["format"], "mlx");
    }
}
