//! Writing safetensors files whose tensor data are aligned, so that a reader mapping the file
//! hands each tensor to MLX in place: the header JSON is padded with trailing spaces, as the format
//! allows, so that the data section starts on a page (16 KiB, Apple silicon's, which also covers
//! 4 KiB pages), and the tensors follow back to back (the format allows no holes: the Hugging Face
//! `safetensors` library refuses a file with gaps) in order of falling element size, so that every
//! tensor starts on a multiple of its element size: the CPU uses each in place. (Metal wraps host
//! memory only at page boundaries: there only the first tensor is used in place, the rest copied
//! once.)
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

/// The tensors' order in the data: by falling element size (each tensor's bytes are a multiple of
/// its element size, so every later, smaller-element tensor stays aligned), else as given.
fn write_order(tensors: &[(&str, &Array)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(tensors[i].1.dtype().size()));
    order
}

/// The header (padded so that the data start on a page) and each tensor's offset in the data.
fn layout(tensors: &[(&str, &Array)], metadata: &[(&str, &str)]) -> Result<(Vec<u8>, Vec<usize>)> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = metadata.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        header.insert("__metadata__".into(), meta.into());
    }
    let mut starts = vec![0usize; tensors.len()];
    let mut at = 0usize;
    for i in write_order(tensors) {
        let (name, a) = tensors[i];
        let dtype = dtype_name(a.dtype()).ok_or_else(|| FormatError::Invalid(format!("tensor {name}: safetensors cannot hold {}", a.dtype())))?;
        let end = at + a.nbytes();
        header.insert(name.into(), serde_json::json!({"dtype": dtype, "shape": a.shape(), "data_offsets": [at, end]}));
        starts[i] = at;
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
    for i in write_order(tensors) {
        let (name, a) = tensors[i];
        debug_assert_eq!(starts[i], at);
        let bytes = a.to_bytes().map_err(|e| FormatError::Invalid(format!("tensor {name}: {}", e.message)))?;
        f.write_all(&bytes).map_err(io)?;
        at += bytes.len();
    }
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_start_on_a_page_and_tensors_back_to_back_aligned() {
        let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let h = Array::from_slice(&[1u16; 3], &[3]).unwrap();
        let b = Array::from_slice(&[7u32; 5000], &[5000]).unwrap();
        let c = Array::from_slice(&[1u8; 5], &[5]).unwrap();
        let (header, starts) = layout(&[("h", &h), ("a", &a), ("c", &c), ("b", &b)], &[("format", "mlx")]).unwrap();
        assert_eq!(header.len() % ALIGN, 0);
        // 4-byte tensors first (a, then b), then h, then c; no holes.
        assert_eq!(starts, [12 + 20000, 0, 12 + 20000 + 6, 12], "offsets of h, a, c, b");
        let n = u64::from_le_bytes(header[..8].try_into().unwrap()) as usize;
        let json: serde_json::Value = serde_json::from_slice(&header[8..8 + n]).unwrap();
        assert_eq!(json["b"]["data_offsets"], serde_json::json!([12, 20012]));
        assert_eq!(json["__metadata__"]["format"], "mlx");
    }
}
