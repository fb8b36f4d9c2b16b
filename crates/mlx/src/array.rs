//! [`Array`]: one owned reference to a lazily evaluated MLX array, and its [`Dtype`].
use crate::error::{ctx, Error, Result};
use mlx_sys::Handle;
use std::fmt;

/// Element types, numbered as MLX's `Dtype::Val`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool = 0,
    U8 = 1,
    U16 = 2,
    U32 = 3,
    U64 = 4,
    I8 = 5,
    I16 = 6,
    I32 = 7,
    I64 = 8,
    F16 = 9,
    F32 = 10,
    F64 = 11,
    BF16 = 12,
    C64 = 13,
}

impl Dtype {
    const ALL: [Dtype; 14] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::F16,
        Dtype::F32,
        Dtype::F64,
        Dtype::BF16,
        Dtype::C64,
    ];

    pub fn from_code(code: i32) -> Option<Dtype> {
        usize::try_from(code).ok().and_then(|i| Self::ALL.get(i).copied())
    }

    pub fn code(self) -> i32 {
        self as i32
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::C64 => 8,
        }
    }

    /// `mx.finfo(dtype).min` for a floating type (float32's for the others).
    pub fn finfo_min(self) -> f64 {
        match self {
            Dtype::F16 => -65504.0,
            Dtype::BF16 => -3.389_531_389_251_535_5e38,
            Dtype::F64 => f64::MIN,
            _ => f64::from(f32::MIN),
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64 | Dtype::BF16)
    }

    /// The name used by safetensors, numpy and Hugging Face configs.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::BF16 => "bfloat16",
            Dtype::C64 => "complex64",
        }
    }

    /// Parses `float16`/`f16`, `bfloat16`/`bf16`, `float32`/`f32` (as `--dtype` and configs spell them).
    pub fn parse_float(s: &str) -> Option<Dtype> {
        match s {
            "float16" | "f16" | "half" => Some(Dtype::F16),
            "bfloat16" | "bf16" => Some(Dtype::BF16),
            "float32" | "f32" | "float" => Some(Dtype::F32),
            _ => None,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Host element types that can move into and out of arrays.
pub trait Element: Copy + Default + 'static {
    const DTYPE: Dtype;
    fn to_bytes(data: &[Self]) -> Vec<u8>;
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: Dtype = $d;
            fn to_bytes(data: &[Self]) -> Vec<u8> {
                data.iter().flat_map(|v| v.to_ne_bytes()).collect()
            }
            fn from_bytes(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_ne_bytes(c.try_into().expect("chunk of element size")))
                    .collect()
            }
        }
    };
}
element!(f32, Dtype::F32);
element!(f64, Dtype::F64);
element!(i32, Dtype::I32);
element!(i64, Dtype::I64);
element!(u32, Dtype::U32);
element!(u8, Dtype::U8);
element!(u16, Dtype::U16);

/// A lazily evaluated MLX array. `Clone` shares the same graph node.
///
/// An `Array` stays on the thread that made it: it is neither `Send` nor `Sync`, because MLX's
/// evaluation is not thread-safe and a clone sent elsewhere would let two threads evaluate one
/// graph at once. Model work therefore runs on one thread (the server loads its model on its
/// engine thread and talks to it through channels carrying token ids and text, never arrays).
/// The compiler refuses both ways round:
///
/// ```compile_fail
/// let a = mlx::Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
/// let b = a.clone();
/// // error: `NonNull<...>` cannot be sent between threads safely
/// std::thread::spawn(move || b.eval()).join().unwrap().unwrap();
/// a.eval().unwrap();
/// ```
///
/// ```compile_fail
/// let a = mlx::Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
/// // error: `NonNull<...>` cannot be shared between threads safely
/// std::thread::scope(|s| {
///     s.spawn(|| a.eval());
///     a.eval().unwrap();
/// });
/// ```
///
/// while evaluating on the thread that built the graph compiles:
///
/// ```
/// let a = mlx::Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
/// let b = a.clone();
/// b.eval().unwrap();
/// assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
/// ```
#[derive(Clone)]
pub struct Array(pub(crate) Handle);

impl Array {
    pub(crate) fn from_handle(h: Handle) -> Self {
        Array(h)
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.0
    }

    /// Copies host data of the given shape into a new array.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let bytes = T::to_bytes(data);
        ctx("array from host data", mlx_sys::from_data(&bytes, shape, T::DTYPE.code(), T::DTYPE.size()))
            .map(Array)
    }

    /// Copies raw little-endian bytes of `dtype` elements (e.g. bf16 weights) into a new array.
    #[track_caller]
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        ctx("array from host bytes", mlx_sys::from_data(bytes, shape, dtype.code(), dtype.size())).map(Array)
    }

    /// A 0-d array holding `value` converted to `dtype` (how a Python scalar meets an array of that dtype).
    #[track_caller]
    pub fn scalar(value: f64, dtype: Dtype) -> Result<Array> {
        ctx("scalar", mlx_sys::scalar(value, dtype.code())).map(Array)
    }

    pub fn shape(&self) -> Vec<i32> {
        mlx_sys::shape(&self.0)
    }

    /// Size of axis `axis` (negative counts from the end); 0 if out of range.
    pub fn dim(&self, axis: i32) -> i32 {
        let s = self.shape();
        let n = s.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            0
        } else {
            s[a as usize]
        }
    }

    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    pub fn dtype(&self) -> Dtype {
        Dtype::from_code(mlx_sys::dtype(&self.0)).unwrap_or(Dtype::F32)
    }

    pub fn size(&self) -> usize {
        mlx_sys::size(&self.0)
    }

    pub fn nbytes(&self) -> usize {
        mlx_sys::nbytes(&self.0)
    }

    /// Evaluates the array (and what it depends on).
    #[track_caller]
    pub fn eval(&self) -> Result<()> {
        count_wait();
        ctx("eval", mlx_sys::eval(&[&self.0]))
    }

    /// Evaluates, converts to `T` and copies the elements out in row-major order.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        count_wait();
        let mut buf = vec![0u8; self.size() * T::DTYPE.size()];
        ctx("copy to host", mlx_sys::to_host(&self.0, T::DTYPE.code(), &mut buf))?;
        Ok(T::from_bytes(&buf))
    }

    /// Evaluates and copies the raw bytes out in the array's own dtype.
    #[track_caller]
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        count_wait();
        let mut buf = vec![0u8; self.nbytes()];
        ctx("copy to host", mlx_sys::to_host(&self.0, self.dtype().code(), &mut buf))?;
        Ok(buf)
    }

    /// The single element of a one-element array.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let v = self.to_vec::<T>()?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(Error::new("item", format!("array of shape {:?} has {} elements", self.shape(), v.len()))),
        }
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?}, {})", self.shape(), self.dtype())
    }
}

/// Calls that wait for the device (evaluations and copies to the host), counted for the traces.
static HOST_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn count_wait() {
    HOST_WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many calls so far could wait for the device: `eval`, `to_vec`, `to_bytes`, `item` (each
/// counts, whether or not its arrays were evaluated already): an upper bound on a step's or a
/// round's host syncs, for the traces.
pub fn host_waits() -> u64 {
    HOST_WAITS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Evaluates several arrays together.
#[track_caller]
pub fn eval(arrays: &[&Array]) -> Result<()> {
    count_wait();
    let h: Vec<&Handle> = arrays.iter().map(|a| &a.0).collect();
    ctx("eval", mlx_sys::eval(&h))
}

/// Writes the graph that evaluating `arrays` would run to `path` in Graphviz dot, as Python's
/// `mx.export_to_dot` (one rectangle per primitive): for counting the operations of a step.
#[track_caller]
pub fn export_to_dot(arrays: &[&Array], path: &str) -> Result<()> {
    let h: Vec<&Handle> = arrays.iter().map(|a| &a.0).collect();
    ctx("export_to_dot", mlx_sys::export_to_dot(&h, path))
}

/// Schedules evaluation without waiting for it.
#[track_caller]
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    let h: Vec<&Handle> = arrays.iter().map(|a| &a.0).collect();
    ctx("async_eval", mlx_sys::async_eval(&h))
}
