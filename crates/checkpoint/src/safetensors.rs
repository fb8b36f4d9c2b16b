//! Reading one safetensors file through a memory mapping: the header parsed and checked here, each
//! tensor handed to MLX over the mapped bytes (no copy where the backend can use them in place; one
//! copy for a tensor whose data does not start on an element boundary, or where the backend copies).
//!
//! The format: 8 bytes little-endian header length N, N bytes of JSON (`{name: {dtype, shape,
//! data_offsets: [begin, end]}, "__metadata__": {...}}`, possibly padded with spaces), then the data,
//! offsets relative to its start. Every range is checked against the file before any array points
//! into it, so a truncated or corrupt file is an error naming it, never a read outside the mapping.
use crate::{Error, Result};
use mlx::io::Mapping;
use mlx::{Array, Dtype};
use std::path::Path;

/// A header longer than this is refused as corrupt (as MLX's own reader would fail to allocate it).
const MAX_HEADER: u64 = 100_000_000;

/// The tensors of one file, in no particular order, and how they were loaded.
pub struct Loaded {
    pub tensors: Vec<(String, Array)>,
    pub stats: LoadStats,
}

/// How a checkpoint's tensors reached MLX.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Bytes of tensor data in the files.
    pub bytes: u64,
    /// Tensors MLX uses in place, in the mapped file.
    pub in_place: usize,
    /// Tensors copied once (misaligned data, or a backend that copies host memory).
    pub copied: usize,
}

impl LoadStats {
    pub fn add(&mut self, other: LoadStats) {
        self.bytes += other.bytes;
        self.in_place += other.in_place;
        self.copied += other.copied;
    }
}

/// The MLX dtype and element size of a safetensors dtype, as MLX 0.32.4's `load_safetensors`
/// reads them (the float8 formats as raw bytes, for the model to decode).
fn dtype_of(name: &str) -> Option<Dtype> {
    Some(match name {
        "F32" => Dtype::F32,
        "F16" => Dtype::F16,
        "BF16" => Dtype::BF16,
        "I64" => Dtype::I64,
        "I32" => Dtype::I32,
        "I16" => Dtype::I16,
        "I8" => Dtype::I8,
        "U64" => Dtype::U64,
        "U32" => Dtype::U32,
        "U16" => Dtype::U16,
        "U8" | "F8_E4M3" | "F8_E8M0" => Dtype::U8,
        "BOOL" => Dtype::Bool,
        "C64" => Dtype::C64,
        _ => return None,
    })
}

/// One tensor's entry in the header, checked against the file.
struct Entry {
    name: String,
    dtype: Dtype,
    shape: Vec<i32>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// Parses and checks the header of a mapped file: the data start and every tensor's entry.
fn entries(path: &Path, bytes: &[u8]) -> Result<Vec<Entry>> {
    let bad = |m: String| Error::file(path, format!("not a valid safetensors file: {m}"));
    let n: [u8; 8] = bytes.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(|| bad("shorter than its header".into()))?;
    let header_len = u64::from_le_bytes(n);
    let file_len = bytes.len() as u64;
    if header_len > MAX_HEADER || 8 + header_len > file_len {
        return Err(bad(format!("header length {header_len} out of range for a {file_len}-byte file")));
    }
    let data_start = 8 + header_len as usize;
    let json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..data_start]).map_err(|e| bad(format!("header is not a JSON object ({e})")))?;
    let data_len = file_len - data_start as u64;
    let mut out = Vec::with_capacity(json.len());
    for (name, v) in json {
        if name == "__metadata__" {
            continue;
        }
        let field = |f: &str| v.get(f).ok_or_else(|| bad(format!("tensor {name} has no {f}")));
        let dtype_name = field("dtype")?.as_str().ok_or_else(|| bad(format!("tensor {name}: dtype is not a string")))?;
        let dtype = dtype_of(dtype_name).ok_or_else(|| bad(format!("tensor {name}: unsupported dtype {dtype_name}")))?;
        let shape = field("shape")?
            .as_array()
            .and_then(|dims| dims.iter().map(|d| d.as_u64().and_then(|d| i32::try_from(d).ok())).collect::<Option<Vec<i32>>>())
            .ok_or_else(|| bad(format!("tensor {name}: shape is not a list of dimensions")))?;
        let offsets = field("data_offsets")?
            .as_array()
            .and_then(|o| match o.as_slice() {
                [b, e] => Some((b.as_u64()?, e.as_u64()?)),
                _ => None,
            })
            .ok_or_else(|| bad(format!("tensor {name}: data_offsets is not [begin, end]")))?;
        let (begin, end) = offsets;
        if begin > end || end > data_len {
            return Err(bad(format!(
                "truncated or corrupt: tensor {name} spans bytes {begin}..{end} of {data_len} bytes of tensor data"
            )));
        }
        let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        if elements.and_then(|n| n.checked_mul(dtype.size() as u64)) != Some(end - begin) {
            return Err(bad(format!("tensor {name}: {} bytes for shape {shape:?} of {dtype_name}", end - begin)));
        }
        // In range of the mapping (checked above), so these fit in usize.
        out.push(Entry { name, dtype, shape, start: data_start + begin as usize, end: data_start + end as usize });
    }
    Ok(out)
}

/// Maps `path` and makes an array of each of its tensors (those MLX can take over the mapping on
/// several threads: where the backend copies them, the copies run in parallel).
pub fn load(path: &Path) -> Result<Loaded> {
    let file = std::fs::File::open(path).map_err(|e| Error::file(path, e))?;
    let map = Mapping::open(path).map_err(|e| Error::file(path, e))?;
    let mut stats = LoadStats::default();
    let mut tensors = Vec::new();
    let named = |e: &Entry, err: mlx::Error| Error::file(path, format!("tensor {}: {}", e.name, err.message));
    let (mapped, other): (Vec<Entry>, Vec<Entry>) = entries(path, map.bytes())?.into_iter().partition(|e| {
        let bytes = &map.bytes()[e.start..e.end];
        !bytes.is_empty() && (bytes.as_ptr() as usize).is_multiple_of(e.dtype.size())
    });
    // Not on an element boundary (or empty): read, not copied from the mapping (one pass, not two).
    let (empty, unaligned): (Vec<Entry>, Vec<Entry>) = other.into_iter().partition(|e| e.start == e.end);
    for e in empty {
        stats.copied += 1;
        let a = Array::from_bytes(&[], &e.shape, e.dtype).map_err(|err| named(&e, err))?;
        tensors.push((e.name, a));
    }
    let places: Vec<(u64, &[i32], Dtype)> = unaligned.iter().map(|e| (e.start as u64, e.shape.as_slice(), e.dtype)).collect();
    let read = mlx::io::read_many(&file, &places);
    for (e, a) in unaligned.into_iter().zip(read) {
        let a = a.map_err(|err| named(&e, err))?;
        stats.bytes += (e.end - e.start) as u64;
        stats.copied += 1;
        tensors.push((e.name, a));
    }
    let places: Vec<(usize, &[i32], Dtype)> = mapped.iter().map(|e| (e.start, e.shape.as_slice(), e.dtype)).collect();
    let made = mlx::io::from_mapping_many(&map, &places);
    for (e, made) in mapped.into_iter().zip(made) {
        let (a, in_place) = made.map_err(|err| named(&e, err))?;
        stats.bytes += (e.end - e.start) as u64;
        if in_place {
            stats.in_place += 1;
        } else {
            stats.copied += 1;
        }
        tensors.push((e.name, a));
    }
    Ok(Loaded { tensors, stats })
}
