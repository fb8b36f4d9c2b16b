//! The GGUF container (versions 2 and 3, little-endian): metadata of every value type, tensor infos
//! and the data section, with every length and offset checked against the file size.
use super::quants::GgmlType;
use super::GgufError;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's name, ggml dimensions (fastest-moving first), type and place in the data section.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of the tensor's data.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape as row-major frameworks write it (ggml's dimensions reversed).
    pub fn shape(&self) -> Vec<i32> {
        self.dims.iter().rev().map(|&d| d as i32).collect()
    }
}

/// A parsed GGUF file: its metadata and tensor infos; tensor data is read on demand.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section.
    pub data_start: u64,
    pub file_len: u64,
}

/// A reader that knows how many bytes remain, so no length in the file can make it allocate or
/// read past the end.
struct Cursor<R> {
    r: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Cursor<R> {
    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, GgufError> {
        if n > self.len.saturating_sub(self.pos) {
            return Err(GgufError::Corrupt(format!(
                "{what} needs {n} bytes at offset {} but the file has {} bytes (truncated or corrupt)",
                self.pos, self.len
            )));
        }
        let mut buf = vec![0u8; n as usize];
        self.r
            .read_exact(&mut buf)
            .map_err(|e| GgufError::Corrupt(format!("reading {what} at offset {}: {e}", self.pos)))?;
        self.pos += n;
        Ok(buf)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let b = self.bytes(N as u64, what)?;
        Ok(b.try_into().unwrap_or([0; N]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        let b = self.bytes(n, what)?;
        Ok(String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(key)?[0]),
            1 => Value::I8(self.arr::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(key)?)),
            7 => match self.arr::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(GgufError::Corrupt(format!("metadata {key}: boolean byte {b} is neither 0 nor 1"))),
            },
            8 => Value::Str(self.string(key)?),
            9 => {
                if depth > 4 {
                    return Err(GgufError::Corrupt(format!("metadata {key}: arrays nested too deeply")));
                }
                let elem = self.u32(key)?;
                let n = self.u64(key)?;
                // Every element takes at least one byte: a count beyond the rest of the file is corrupt.
                if n > self.len.saturating_sub(self.pos) {
                    return Err(GgufError::Corrupt(format!("metadata {key}: array of {n} elements exceeds the file")));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(key)?)),
            t => return Err(GgufError::Corrupt(format!("metadata {key}: unknown value type {t}"))),
        })
    }
}

impl GgufFile {
    /// Parses the header, metadata and tensor infos of `path`, validating every tensor's extent.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let file = File::open(path).map_err(|e| GgufError::Io(format!("{}: {e}", path.display())))?;
        let len = file.metadata().map_err(|e| GgufError::Io(format!("{}: {e}", path.display())))?.len();
        let mut c = Cursor { r: BufReader::with_capacity(1 << 20, file), pos: 0, len };
        let magic = c
            .bytes(4, "the GGUF magic")
            .map_err(|_| GgufError::NotGguf(format!("{}: shorter than a GGUF header", path.display())))?;
        if magic != b"GGUF" {
            return Err(GgufError::NotGguf(format!("{}: does not start with the GGUF magic", path.display())));
        }
        let version = c.u32("the version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::Unsupported(format!("GGUF version {version} (only 2 and 3 are supported)")));
        }
        let n_tensors = c.u64("the tensor count")?;
        let n_kv = c.u64("the metadata count")?;
        if n_tensors > len || n_kv > len {
            return Err(GgufError::Corrupt(format!(
                "implausible counts: {n_tensors} tensors, {n_kv} metadata entries"
            )));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("a metadata key")?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, &key, 0)?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = c.string("a tensor name")?;
            let n_dims = c.u32(&name)?;
            if n_dims == 0 || n_dims > 4 {
                return Err(GgufError::Corrupt(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = c.u64(&name)?;
                if d == 0 || d > i32::MAX as u64 {
                    return Err(GgufError::Corrupt(format!("tensor {name}: dimension {d}")));
                }
                dims.push(d);
            }
            let code = c.u32(&name)?;
            let ggml_type = GgmlType::from_code(code)
                .ok_or_else(|| GgufError::Unsupported(format!("tensor {name}: unknown ggml type {code}")))?;
            let offset = c.u64(&name)?;
            let (block, bytes) = ggml_type.block();
            if dims[0] % block != 0 {
                return Err(GgufError::Corrupt(format!(
                    "tensor {name}: row length {} is not a multiple of {ggml_type:?}'s block of {block}",
                    dims[0]
                )));
            }
            let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let size = n.and_then(|n| (n / block).checked_mul(bytes));
            let size = size.ok_or_else(|| GgufError::Corrupt(format!("tensor {name}: size overflows")))?;
            tensors.push(TensorInfo { name, dims, ggml_type, offset, size });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => return Err(GgufError::Corrupt(format!("general.alignment {v:?} is not a power of two"))),
            },
        };
        let data_start = c.pos.div_ceil(alignment) * alignment;
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(GgufError::Corrupt(format!(
                    "tensor {}: offset {} is not aligned to {alignment}",
                    t.name, t.offset
                )));
            }
            let end = data_start.checked_add(t.offset).and_then(|s| s.checked_add(t.size));
            if end.is_none_or(|e| e > len) {
                return Err(GgufError::Corrupt(format!(
                    "tensor {} ({} bytes at data offset {}) extends past the end of the {len}-byte file (truncated?)",
                    t.name, t.size, t.offset
                )));
            }
        }
        Ok(GgufFile { path: path.to_owned(), version, metadata, tensors, data_start, file_len: len })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Reads one tensor's raw bytes from `file` (the opened GGUF).
    pub fn read_tensor(&self, file: &mut File, t: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        let at = self.data_start + t.offset;
        file.seek(SeekFrom::Start(at)).map_err(|e| GgufError::Io(format!("seeking to tensor {}: {e}", t.name)))?;
        let mut buf = vec![0u8; t.size as usize];
        file.read_exact(&mut buf).map_err(|e| GgufError::Corrupt(format!("reading tensor {}: {e}", t.name)))?;
        Ok(buf)
    }
}
