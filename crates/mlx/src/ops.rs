//! Array operations: arithmetic, comparison, shape, indexing, reductions and sorting.
//!
//! Scalars follow Python MLX's weak typing: `a.mul_scalar(0.5)` creates the scalar in `a`'s dtype,
//! exactly as `a * 0.5` does in mlx-lm, so bf16 stays bf16.
use crate::array::{Array, Dtype};
use crate::error::{ctx, Error, Result};
use mlx_sys as sys;

macro_rules! unary {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Array {
            $(
                #[track_caller]
                pub fn $name(&self) -> Result<Array> {
                    ctx(stringify!($name), sys::unary(sys::$op, self.handle())).map(Array::from_handle)
                }
            )*
        }
    };
}

unary! {
    exp => UNARY_EXP, log => UNARY_LOG, neg => UNARY_NEG, sigmoid => UNARY_SIGMOID,
    sqrt => UNARY_SQRT, rsqrt => UNARY_RSQRT, abs => UNARY_ABS, logical_not => UNARY_NOT,
    sin => UNARY_SIN, cos => UNARY_COS, tanh => UNARY_TANH, square => UNARY_SQUARE,
    log1p => UNARY_LOG1P, floor => UNARY_FLOOR, erf => UNARY_ERF, stop_gradient => UNARY_STOP_GRADIENT,
    log2 => UNARY_LOG2, ceil => UNARY_CEIL, sign => UNARY_SIGN,
}

macro_rules! binary {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Array {
            $(
                #[track_caller]
                pub fn $name(&self, other: &Array) -> Result<Array> {
                    ctx(stringify!($name), sys::binary(sys::$op, self.handle(), other.handle()))
                        .map(Array::from_handle)
                }

                /// With a scalar in this array's dtype (Python's weak scalar typing).
                #[track_caller]
                pub fn $scalar(&self, value: f64) -> Result<Array> {
                    let s = Array::scalar(value, self.dtype())?;
                    self.$name(&s)
                }
            )*
        }
    };
}

binary! {
    add, add_scalar => BINARY_ADD,
    sub, sub_scalar => BINARY_SUB,
    mul, mul_scalar => BINARY_MUL,
    div, div_scalar => BINARY_DIV,
    maximum, maximum_scalar => BINARY_MAX,
    minimum, minimum_scalar => BINARY_MIN,
    power, power_scalar => BINARY_POW,
    eq, eq_scalar => BINARY_EQ,
    ne, ne_scalar => BINARY_NE,
    lt, lt_scalar => BINARY_LT,
    le, le_scalar => BINARY_LE,
    gt, gt_scalar => BINARY_GT,
    ge, ge_scalar => BINARY_GE,
    logical_and, logical_and_scalar => BINARY_AND,
    logical_or, logical_or_scalar => BINARY_OR,
    floor_divide, floor_divide_scalar => BINARY_FLOOR_DIV,
    remainder, remainder_scalar => BINARY_REM,
    logaddexp, logaddexp_scalar => BINARY_LOGADDEXP,
}

fn axis_index(axis: i32, ndim: usize) -> Result<usize> {
    let n = ndim as i32;
    let a = if axis < 0 { axis + n } else { axis };
    if a < 0 || a >= n {
        Err(Error::new("axis", format!("axis {axis} is out of range for {ndim} dimensions")))
    } else {
        Ok(a as usize)
    }
}

impl Array {
    #[track_caller]
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        ctx("astype", sys::astype(self.handle(), dtype.code())).map(Array::from_handle)
    }

    /// This uint8 array's bytes as float8 e4m3 values, converted to `dtype` (`mx.from_fp8`;
    /// safetensors' `F8_E4M3` tensors load as uint8).
    #[track_caller]
    pub fn from_fp8(&self, dtype: Dtype) -> Result<Array> {
        ctx("from_fp8", sys::from_fp8(self.handle(), dtype.code())).map(Array::from_handle)
    }

    /// Float values as float8 e4m3 bytes (uint8), as `mx.to_fp8`.
    #[track_caller]
    pub fn to_fp8(&self) -> Result<Array> {
        ctx("to_fp8", sys::to_fp8(self.handle())).map(Array::from_handle)
    }

    /// The same bytes read as `dtype`, as `mx.view` (the last axis scales by the size ratio).
    #[track_caller]
    pub fn view(&self, dtype: Dtype) -> Result<Array> {
        ctx("view", sys::view(self.handle(), dtype.code())).map(Array::from_handle)
    }

    /// `mx.pad(a, widths, value)`: `(before, after)` copies of `value` (in this array's dtype) on
    /// each axis, in axis order.
    #[track_caller]
    pub fn pad(&self, widths: &[(i32, i32)], value: f64) -> Result<Array> {
        let (low, high): (Vec<i32>, Vec<i32>) = widths.iter().copied().unzip();
        let v = Array::scalar(value, self.dtype())?;
        ctx("pad", sys::pad(self.handle(), &low, &high, v.handle())).map(Array::from_handle)
    }

    /// `x * sigmoid(x)`, as `mlx.nn.silu`.
    #[track_caller]
    pub fn silu(&self) -> Result<Array> {
        self.mul(&self.sigmoid()?)
    }

    /// `mx.conv1d(self, weight, stride, padding, dilation, groups)`: self (B, L, C_in), weight
    /// (C_out, K, C_in / groups) -> (B, L_out, C_out).
    #[track_caller]
    pub fn conv1d(&self, weight: &Array, stride: i32, padding: i32, dilation: i32, groups: i32) -> Result<Array> {
        ctx("conv1d", sys::conv1d(self.handle(), weight.handle(), stride, padding, dilation, groups)).map(Array::from_handle)
    }

    /// `mx.repeat(self, repeats, axis)`: each element `repeats` times in a row along `axis`.
    #[track_caller]
    pub fn repeat(&self, repeats: i32, axis: i32) -> Result<Array> {
        ctx("repeat", sys::repeat(self.handle(), repeats, axis)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        ctx("matmul", sys::matmul(self.handle(), other.handle())).map(Array::from_handle)
    }

    /// `mx.broadcast_to(self, shape)`: a view of `shape` (no copy until an operation needs one).
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        ctx("broadcast_to", sys::broadcast_to(self.handle(), shape)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        ctx("reshape", sys::reshape(self.handle(), shape)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        ctx("transpose", sys::transpose(self.handle(), axes)).map(Array::from_handle)
    }

    /// Reverses all axes (`.T` in Python).
    #[track_caller]
    pub fn t(&self) -> Result<Array> {
        let axes: Vec<i32> = (0..self.ndim() as i32).rev().collect();
        self.transpose(&axes)
    }

    #[track_caller]
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        let n = self.ndim();
        let (a, b) = (axis_index(a, n)?, axis_index(b, n)?);
        let mut axes: Vec<i32> = (0..n as i32).collect();
        axes.swap(a, b);
        self.transpose(&axes)
    }

    #[track_caller]
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        ctx("expand_dims", sys::expand_dims(self.handle(), axes)).map(Array::from_handle)
    }

    /// Removes the given unit axes, or all unit axes when `axes` is empty.
    #[track_caller]
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        ctx("squeeze", sys::squeeze(self.handle(), axes)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        ctx("slice", sys::slice(self.handle(), start, stop, strides)).map(Array::from_handle)
    }

    /// `self[..., start:stop, ...]` along one axis (negative bounds count from the end).
    #[track_caller]
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let ax = axis_index(axis, shape.len())?;
        let len = shape[ax];
        let fix = |i: i32| if i < 0 { (i + len).max(0) } else { i.min(len) };
        let mut lo = vec![0; shape.len()];
        let mut hi = shape.clone();
        lo[ax] = fix(start);
        hi[ax] = fix(stop);
        self.slice(&lo, &hi, &vec![1; shape.len()])
    }

    /// A copy of `self` with `update` written at `start..stop`.
    #[track_caller]
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
        ctx("slice_update", sys::slice_update(self.handle(), update.handle(), start, stop)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        ctx("take", sys::take(self.handle(), indices.handle(), axis)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        ctx("take_along_axis", sys::take_along_axis(self.handle(), indices.handle(), axis)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        ctx("put_along_axis", sys::put_along_axis(self.handle(), indices.handle(), values.handle(), axis))
            .map(Array::from_handle)
    }

    /// Adds `values` at `indices` along `axis`, accumulating repeated indices in order (`mx.scatter_add_axis`).
    #[track_caller]
    pub fn scatter_add_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        ctx("scatter_add_axis", sys::scatter_add_axis(self.handle(), indices.handle(), values.handle(), axis))
            .map(Array::from_handle)
    }

    /// Forces a row-major copy.
    #[track_caller]
    pub fn contiguous(&self) -> Result<Array> {
        ctx("contiguous", sys::contiguous(self.handle())).map(Array::from_handle)
    }

    #[track_caller]
    fn reduce(&self, what: &'static str, op: i32, axes: &[i32], keepdims: bool) -> Result<Array> {
        ctx(what, sys::reduce(op, self.handle(), axes, keepdims)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn sum(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce("sum", sys::REDUCE_SUM, axes, keepdims)
    }

    #[track_caller]
    pub fn max(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce("max", sys::REDUCE_MAX, axes, keepdims)
    }

    #[track_caller]
    pub fn min(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce("min", sys::REDUCE_MIN, axes, keepdims)
    }

    #[track_caller]
    pub fn mean(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce("mean", sys::REDUCE_MEAN, axes, keepdims)
    }

    #[track_caller]
    pub fn logsumexp(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce("logsumexp", sys::REDUCE_LOGSUMEXP, axes, keepdims)
    }

    #[track_caller]
    pub fn any(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce("any", sys::REDUCE_ANY, axes, keepdims)
    }

    #[track_caller]
    pub fn all(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce("all", sys::REDUCE_ALL, axes, keepdims)
    }

    #[track_caller]
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        self.reduce("argmax", sys::REDUCE_ARGMAX, &[axis], keepdims)
    }

    #[track_caller]
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        self.reduce("argmin", sys::REDUCE_ARGMIN, &[axis], keepdims)
    }

    #[track_caller]
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        ctx("softmax", sys::softmax(self.handle(), axes, precise)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn sort(&self, axis: i32) -> Result<Array> {
        ctx("sort", sys::sort_op(sys::SORT_SORT, self.handle(), axis, 0)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        ctx("argsort", sys::sort_op(sys::SORT_ARGSORT, self.handle(), axis, 0)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn partition(&self, kth: i32, axis: i32) -> Result<Array> {
        ctx("partition", sys::sort_op(sys::SORT_PARTITION, self.handle(), axis, kth)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        ctx("argpartition", sys::sort_op(sys::SORT_ARGPARTITION, self.handle(), axis, kth)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn topk(&self, k: i32, axis: i32) -> Result<Array> {
        ctx("topk", sys::sort_op(sys::SORT_TOPK, self.handle(), axis, k)).map(Array::from_handle)
    }

    #[track_caller]
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        ctx("cumsum", sys::cumsum(self.handle(), axis, reverse, inclusive)).map(Array::from_handle)
    }
}

/// `cond ? x : y`, elementwise with broadcasting.
#[track_caller]
pub fn where_(cond: &Array, x: &Array, y: &Array) -> Result<Array> {
    ctx("where", sys::where_(cond.handle(), x.handle(), y.handle())).map(Array::from_handle)
}

/// `beta * c + alpha * (a @ b)`, as `mx.addmm` (what `nn.Linear` with a bias computes).
#[track_caller]
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
    ctx("addmm", sys::addmm(c.handle(), a.handle(), b.handle(), alpha, beta)).map(Array::from_handle)
}

#[track_caller]
pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
    let h: Vec<_> = arrays.iter().map(|a| a.handle()).collect();
    ctx("concatenate", sys::concatenate(&h, axis)).map(Array::from_handle)
}

#[track_caller]
pub fn stack(arrays: &[&Array], axis: i32) -> Result<Array> {
    let h: Vec<_> = arrays.iter().map(|a| a.handle()).collect();
    ctx("stack", sys::stack(&h, axis)).map(Array::from_handle)
}

/// `[start, stop)` in steps of `step`.
#[track_caller]
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
    ctx("arange", sys::arange(start, stop, step, dtype.code())).map(Array::from_handle)
}

/// An array of `shape` filled with `value` (converted to `dtype`).
#[track_caller]
pub fn full(shape: &[i32], value: f64, dtype: Dtype) -> Result<Array> {
    let v = Array::scalar(value, dtype)?;
    ctx("full", sys::full(shape, v.handle(), dtype.code())).map(Array::from_handle)
}

#[track_caller]
pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
    full(shape, 0.0, dtype)
}

/// MLX's quantization modes: `affine` (scales and biases per group, any of 2-8 bits) and the
/// microscaling float formats `mxfp4`, `nvfp4`, `mxfp8` (scales only, fixed group size and bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum QuantMode {
    #[default]
    Affine,
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

impl QuantMode {
    pub const ALL: [QuantMode; 4] = [QuantMode::Affine, QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8];

    /// The name MLX and config.json use.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Nvfp4 => "nvfp4",
            QuantMode::Mxfp8 => "mxfp8",
        }
    }

    pub fn parse(name: &str) -> Option<QuantMode> {
        QuantMode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether the mode stores a bias per group besides the scale.
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }

    /// The (group size, bits) a layer gets when none are given (mlx-lm's `defaults_for_mode`,
    /// and `nn.QuantizedLinear`'s for a `None` group size).
    pub fn defaults(self) -> QuantSpec {
        let (group_size, bits) = match self {
            QuantMode::Affine => (64, 4),
            QuantMode::Mxfp4 => (32, 4),
            QuantMode::Nvfp4 => (16, 4),
            QuantMode::Mxfp8 => (32, 8),
        };
        QuantSpec { group_size, bits, mode: self }
    }

    /// Whether MLX quantizes with these parameters in this mode: affine takes bits 2, 3, 4, 5, 6
    /// or 8 and group size 32, 64 or 128; the float modes only their own group size and bits.
    pub fn supports(self, group_size: i32, bits: i32) -> bool {
        match self {
            QuantMode::Affine => [2, 3, 4, 5, 6, 8].contains(&bits) && [32, 64, 128].contains(&group_size),
            _ => self.defaults() == QuantSpec { group_size, bits, mode: self },
        }
    }
}

impl std::fmt::Display for QuantMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Quantization parameters of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
}

impl QuantSpec {
    /// Affine quantization with `group_size` and `bits`.
    pub const fn affine(group_size: i32, bits: i32) -> QuantSpec {
        QuantSpec { group_size, bits, mode: QuantMode::Affine }
    }
}

/// `x @ dequantize(w).T` (or without the transpose) in one kernel, as `mx.quantized_matmul`.
#[track_caller]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    q: QuantSpec,
) -> Result<Array> {
    ctx(
        "quantized_matmul",
        sys::quantized_matmul(
            x.handle(),
            w.handle(),
            scales.handle(),
            biases.map(Array::handle),
            transpose,
            q.group_size,
            q.bits,
            q.mode.name(),
        ),
    )
    .map(Array::from_handle)
}

/// Quantization along the last axis: (packed uint32 weight, scales, biases); the biases are
/// there exactly when the mode has them.
#[track_caller]
pub fn quantize(w: &Array, q: QuantSpec) -> Result<(Array, Array, Option<Array>)> {
    let (w, s, b) = ctx("quantize", sys::quantize(w.handle(), q.group_size, q.bits, q.mode.name()))?;
    if b.is_some() != q.mode.has_biases() {
        return Err(Error::new("quantize", format!("{} quantization returned the wrong number of arrays", q.mode)));
    }
    Ok((Array::from_handle(w), Array::from_handle(s), b.map(Array::from_handle)))
}

/// [`quantize`] in a mode with biases (affine): (packed weight, scales, biases).
#[track_caller]
pub fn quantize_affine(w: &Array, q: QuantSpec) -> Result<(Array, Array, Array)> {
    match quantize(w, q)? {
        (w, s, Some(b)) => Ok((w, s, b)),
        _ => Err(Error::new("quantize", format!("{} quantization has no biases", q.mode))),
    }
}

#[track_caller]
pub fn dequantize(w: &Array, scales: &Array, biases: Option<&Array>, q: QuantSpec) -> Result<Array> {
    ctx(
        "dequantize",
        sys::dequantize(w.handle(), scales.handle(), biases.map(Array::handle), q.group_size, q.bits, q.mode.name(), -1),
    )
    .map(Array::from_handle)
}

/// `mx.gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices)`: matmuls of `a` and `b` rows
/// picked by the indices (mlx-lm's `SwitchLinear`).
#[track_caller]
pub fn gather_mm(
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    sorted_indices: bool,
) -> Result<Array> {
    ctx(
        "gather_mm",
        sys::gather_mm(a.handle(), b.handle(), lhs_indices.map(Array::handle), rhs_indices.map(Array::handle), sorted_indices),
    )
    .map(Array::from_handle)
}

/// `mx.gather_qmm(x, w, scales, biases, rhs_indices=..., transpose, group_size, bits, mode,
/// sorted_indices)`: the quantized `gather_mm` (mlx-lm's `QuantizedSwitchLinear`), reading only
/// the chosen experts' weights.
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    q: QuantSpec,
    sorted_indices: bool,
) -> Result<Array> {
    ctx(
        "gather_qmm",
        sys::gather_qmm(
            x.handle(),
            w.handle(),
            scales.handle(),
            biases.map(Array::handle),
            None,
            rhs_indices.map(Array::handle),
            transpose,
            q.group_size,
            q.bits,
            q.mode.name(),
            sorted_indices,
        ),
    )
    .map(Array::from_handle)
}
