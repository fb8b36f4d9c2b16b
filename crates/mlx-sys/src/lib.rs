//! Bindings to MLX 0.32.4 through mlx-gen's C++ shim (`shim/`), and the only `unsafe` code of mlx-gen.
//!
//! `ffi` holds the raw declarations; this file wraps each in a safe function over an owning
//! [`Handle`]. Failures come back as the MLX exception text; the `mlx` crate turns them into typed
//! errors. Operation codes (`UNARY_*`, `BINARY_*`, ...) mirror the `switch`es in `shim.cpp`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod distributed;
pub mod ffi;
pub mod mapped;
mod mailbox;
mod memory;
mod safetensors;

pub use mailbox::Mailbox;
pub use memory::*;
pub use safetensors::*;

use std::ffi::{c_int, CStr, CString};
use std::ptr::{self, NonNull};

/// The MLX backend this crate was built against (`cpu`, `cuda` or `metal`).
pub const BUILD_BACKEND: &str = env!("MLX_GEN_BUILD_BACKEND");
/// The folder holding the `libmlx` this crate was linked with.
pub const BUILD_LIB_DIR: &str = env!("MLX_GEN_BUILD_LIB_DIR");
/// The BLAS linked ahead of the wheel's (`MLX_GEN_BLAS` at build time), or `reference ...`.
pub const BUILD_BLAS: &str = env!("MLX_GEN_BUILD_BLAS");

/// An MLX error message.
pub type Result<T> = std::result::Result<T, String>;

/// An owned reference to one `mlx::core::array` (itself a reference-counted graph node).
///
/// Neither `Send` nor `Sync` (the raw pointer makes it so): MLX evaluation is not thread-safe,
/// and two handles to one graph (a `Clone`) on two threads could evaluate it at once. A graph is
/// built, evaluated and dropped on the thread that made it.
pub struct Handle(NonNull<ffi::mlxs_array_>);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: we own this handle, created by the shim, freed once here.
        unsafe { ffi::mlxs_array_free(self.0.as_ptr()) }
    }
}

impl Clone for Handle {
    fn clone(&self) -> Self {
        // Copying an mlx::core::array only bumps a reference count; failure means out of memory.
        make(|o| unsafe { ffi::mlxs_array_clone(o, self.raw()) }).unwrap_or_else(|e| {
            eprintln!("fatal: cannot copy an MLX array handle: {e}");
            std::process::abort()
        })
    }
}

impl Handle {
    fn raw(&self) -> ffi::mlxs_array {
        self.0.as_ptr()
    }
}

fn last_error() -> String {
    // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::mlxs_last_error()) }.to_string_lossy().into_owned()
}

fn check(status: c_int) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

fn make(f: impl FnOnce(*mut ffi::mlxs_array) -> c_int) -> Result<Handle> {
    let mut out: ffi::mlxs_array = ptr::null_mut();
    check(f(&mut out))?;
    NonNull::new(out).map(Handle).ok_or_else(|| "MLX returned no array".to_owned())
}

fn opt(a: Option<&Handle>) -> ffi::mlxs_array {
    a.map_or(ptr::null_mut(), Handle::raw)
}

fn raws(arrays: &[&Handle]) -> Vec<ffi::mlxs_array> {
    arrays.iter().map(|a| a.raw()).collect()
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| format!("string {s:?} contains a NUL byte"))
}

fn len_i32(n: usize) -> c_int {
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

// ---- library and device ----

/// MLX's version string, e.g. `0.32.4`.
pub fn version() -> String {
    // SAFETY: MLX returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::mlxs_version()) }.to_string_lossy().into_owned()
}

pub fn gpu_available() -> bool {
    // SAFETY: no arguments; the shim catches every exception.
    unsafe { ffi::mlxs_gpu_available() != 0 }
}

pub fn set_default_device(gpu: bool) -> Result<()> {
    check(unsafe { ffi::mlxs_set_default_device(c_int::from(gpu)) })
}

/// Whether the default device is the GPU (false for the CPU).
pub fn default_device_is_gpu() -> bool {
    // SAFETY: no arguments; the shim catches every exception.
    unsafe { ffi::mlxs_default_device_is_gpu() != 0 }
}

/// Makes a fresh stream on the default device the default stream (mlx-lm's `generation_stream`).
pub fn new_default_stream() -> Result<()> {
    check(unsafe { ffi::mlxs_new_default_stream() })
}

/// Waits until every queued MLX computation on the default stream has finished.
pub fn synchronize() -> Result<()> {
    check(unsafe { ffi::mlxs_synchronize() })
}

pub fn device_name() -> Result<String> {
    let mut buf = vec![0u8; 256];
    check(unsafe { ffi::mlxs_device_name(buf.as_mut_ptr().cast(), buf.len()) })?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

// ---- arrays ----

/// Copies `data` (raw bytes of `shape` elements of `dtype`) into a new MLX array.
pub fn from_data(data: &[u8], shape: &[i32], dtype: i32, itemsize: usize) -> Result<Handle> {
    let n: usize = shape.iter().map(|&d| usize::try_from(d).unwrap_or(0)).product();
    if data.len() != n * itemsize {
        return Err(format!("{} bytes of data for shape {shape:?} of {itemsize}-byte elements", data.len()));
    }
    make(|o| unsafe { ffi::mlxs_array_from_data(o, data.as_ptr(), shape.as_ptr(), len_i32(shape.len()), dtype) })
}

pub fn scalar(value: f64, dtype: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_array_scalar(o, value, dtype) })
}

pub fn shape(a: &Handle) -> Vec<i32> {
    // SAFETY: `shape` has room for ndim entries.
    unsafe {
        let n = usize::try_from(ffi::mlxs_array_ndim(a.raw())).unwrap_or(0);
        let mut s = vec![0i32; n];
        ffi::mlxs_array_shape(a.raw(), s.as_mut_ptr());
        s
    }
}

pub fn dtype(a: &Handle) -> i32 {
    unsafe { ffi::mlxs_array_dtype(a.raw()) }
}

pub fn size(a: &Handle) -> usize {
    unsafe { ffi::mlxs_array_size(a.raw()) }
}

pub fn nbytes(a: &Handle) -> usize {
    unsafe { ffi::mlxs_array_nbytes(a.raw()) }
}

/// Evaluates `a` converted to `dtype` and copies it, row-major, into `buf`.
pub fn to_host(a: &Handle, dtype: i32, buf: &mut [u8]) -> Result<()> {
    check(unsafe { ffi::mlxs_array_to_host(a.raw(), dtype, buf.as_mut_ptr(), buf.len()) })
}

pub fn eval(arrays: &[&Handle]) -> Result<()> {
    let r = raws(arrays);
    check(unsafe { ffi::mlxs_eval(r.as_ptr(), r.len()) })
}

pub fn async_eval(arrays: &[&Handle]) -> Result<()> {
    let r = raws(arrays);
    check(unsafe { ffi::mlxs_async_eval(r.as_ptr(), r.len()) })
}

/// Writes the graph behind `arrays` (not evaluated) to `path` as Graphviz dot.
pub fn export_to_dot(arrays: &[&Handle], path: &str) -> Result<()> {
    let r = raws(arrays);
    let cpath = cstring(path)?;
    check(unsafe { ffi::mlxs_export_to_dot(r.as_ptr(), r.len(), cpath.as_ptr()) })
}

// ---- operation codes (see shim.cpp) ----
pub const UNARY_EXP: i32 = 0;
pub const UNARY_LOG: i32 = 1;
pub const UNARY_NEG: i32 = 2;
pub const UNARY_SIGMOID: i32 = 3;
pub const UNARY_SQRT: i32 = 4;
pub const UNARY_RSQRT: i32 = 5;
pub const UNARY_ABS: i32 = 6;
pub const UNARY_NOT: i32 = 7;
pub const UNARY_SIN: i32 = 8;
pub const UNARY_COS: i32 = 9;
pub const UNARY_TANH: i32 = 10;
pub const UNARY_SQUARE: i32 = 11;
pub const UNARY_LOG1P: i32 = 12;
pub const UNARY_FLOOR: i32 = 13;
pub const UNARY_ERF: i32 = 14;
pub const UNARY_STOP_GRADIENT: i32 = 15;
pub const UNARY_LOG2: i32 = 16;
pub const UNARY_CEIL: i32 = 17;
pub const UNARY_SIGN: i32 = 18;

pub const BINARY_ADD: i32 = 0;
pub const BINARY_SUB: i32 = 1;
pub const BINARY_MUL: i32 = 2;
pub const BINARY_DIV: i32 = 3;
pub const BINARY_MAX: i32 = 4;
pub const BINARY_MIN: i32 = 5;
pub const BINARY_POW: i32 = 6;
pub const BINARY_EQ: i32 = 7;
pub const BINARY_NE: i32 = 8;
pub const BINARY_LT: i32 = 9;
pub const BINARY_LE: i32 = 10;
pub const BINARY_GT: i32 = 11;
pub const BINARY_GE: i32 = 12;
pub const BINARY_AND: i32 = 13;
pub const BINARY_OR: i32 = 14;
pub const BINARY_FLOOR_DIV: i32 = 15;
pub const BINARY_REM: i32 = 16;
pub const BINARY_LOGADDEXP: i32 = 17;

pub const REDUCE_SUM: i32 = 0;
pub const REDUCE_MAX: i32 = 1;
pub const REDUCE_MIN: i32 = 2;
pub const REDUCE_MEAN: i32 = 3;
pub const REDUCE_PROD: i32 = 4;
pub const REDUCE_LOGSUMEXP: i32 = 5;
pub const REDUCE_ARGMAX: i32 = 6;
pub const REDUCE_ARGMIN: i32 = 7;
pub const REDUCE_ANY: i32 = 8;
pub const REDUCE_ALL: i32 = 9;

pub const SORT_SORT: i32 = 0;
pub const SORT_ARGSORT: i32 = 1;
pub const SORT_PARTITION: i32 = 2;
pub const SORT_ARGPARTITION: i32 = 3;
pub const SORT_TOPK: i32 = 4;

// ---- operations ----

pub fn unary(op: i32, a: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_unary(o, op, a.raw()) })
}

pub fn binary(op: i32, a: &Handle, b: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_binary(o, op, a.raw(), b.raw()) })
}

pub fn where_(cond: &Handle, x: &Handle, y: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_where(o, cond.raw(), x.raw(), y.raw()) })
}

pub fn astype(a: &Handle, dtype: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_astype(o, a.raw(), dtype) })
}

/// Reads uint8 `a` as float8 e4m3 values, converted to `dtype` (`mx.from_fp8`).
pub fn from_fp8(a: &Handle, dtype: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_from_fp8(o, a.raw(), dtype) })
}

/// Float values as float8 e4m3 bytes, uint8 (`mx.to_fp8`).
pub fn to_fp8(a: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_to_fp8(o, a.raw()) })
}

/// The same bytes read as `dtype` (`mx.view`).
pub fn view(a: &Handle, dtype: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_view(o, a.raw(), dtype) })
}

/// Pads axis i with `low[i]` and `high[i]` copies of the scalar `value` (`mx.pad`, constant mode).
pub fn pad(a: &Handle, low: &[i32], high: &[i32], value: &Handle) -> Result<Handle> {
    if low.len() != high.len() {
        return Err(format!("pad: {} low widths but {} high widths", low.len(), high.len()));
    }
    make(|o| unsafe { ffi::mlxs_pad(o, a.raw(), low.as_ptr(), high.as_ptr(), len_i32(low.len()), value.raw()) })
}

pub fn matmul(a: &Handle, b: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_matmul(o, a.raw(), b.raw()) })
}

/// x (M, K) or (1, M, K) @ dequantize(w)ᵀ, as one CUDA kernel for 1-7 rows where it applies (else MLX's
/// quantized_matmul).
pub fn qmm_rows(x: &Handle, w: &Handle, scales: &Handle, biases: Option<&Handle>, group_size: i32, bits: i32, mode: &str) -> Result<Handle> {
    let mode = cstring(mode)?;
    make(|o| unsafe { ffi::mlxs_qmm_rows(o, x.raw(), w.raw(), scales.raw(), opt(biases), group_size, bits, mode.as_ptr()) })
}

/// x @ dequantize(w)ᵀ for 8-256 rows on the tensor cores, as one CUDA kernel where it applies (else
/// MLX's quantized_matmul, transposed).
pub fn qmm_mma(x: &Handle, w: &Handle, scales: &Handle, biases: Option<&Handle>, group_size: i32, bits: i32, mode: &str) -> Result<Handle> {
    let mode = cstring(mode)?;
    make(|o| unsafe { ffi::mlxs_qmm_mma(o, x.raw(), w.raw(), scales.raw(), opt(biases), group_size, bits, mode.as_ptr()) })
}

/// The gathered product of a few tokens, as one CUDA kernel where it applies (else MLX's
/// gather_qmm): x (T or T * k, K), stacked w (E, N, ...), indices (T, k) -> (T, k, N).
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm_rows(
    x: &Handle,
    w: &Handle,
    scales: &Handle,
    biases: Option<&Handle>,
    indices: &Handle,
    group_size: i32,
    bits: i32,
    mode: &str,
) -> Result<Handle> {
    let mode = cstring(mode)?;
    make(|o| unsafe { ffi::mlxs_gather_qmm_rows(o, x.raw(), w.raw(), scales.raw(), opt(biases), indices.raw(), group_size, bits, mode.as_ptr()) })
}

/// Whether [`qmm_rows`] runs its kernel here (the default device is a CUDA GPU).
pub fn qmm_rows_available() -> bool {
    unsafe { ffi::mlxs_qmm_rows_available() == 1 }
}

/// Compiles representative variants of the shim's own CUDA kernels with the NVRTC library at
/// `nvrtc_library` for `sm_<arch>` (no GPU needed); how many compiled.
pub fn jit_check(nvrtc_library: &str, arch: &str) -> Result<usize> {
    let (lib, arch) = (cstring(nvrtc_library)?, cstring(arch)?);
    let mut compiled: c_int = 0;
    // SAFETY: two NUL-terminated strings and an out-pointer; the shim catches every exception.
    check(unsafe { ffi::mlxs_jit_check(lib.as_ptr(), arch.as_ptr(), &mut compiled) })?;
    Ok(usize::try_from(compiled).unwrap_or(0))
}

/// Whether [`sdpa_few`] runs for these inputs (a CUDA GPU, inputs it takes).
pub fn sdpa_few_available(q: &Handle, k: &Handle, v: &Handle) -> bool {
    unsafe { ffi::mlxs_sdpa_few_available(q.raw(), k.raw(), v.raw()) == 1 }
}

/// Attention of a few query positions as one CUDA kernel; `mask` boolean (keep) or additive.
pub fn sdpa_few(q: &Handle, k: &Handle, v: &Handle, scale: f32, mask: Option<&Handle>, causal: bool) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_sdpa_few(o, q.raw(), k.raw(), v.raw(), scale, opt(mask), c_int::from(causal)) })
}

pub fn addmm(c: &Handle, a: &Handle, b: &Handle, alpha: f32, beta: f32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_addmm(o, c.raw(), a.raw(), b.raw(), alpha, beta) })
}

#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul(
    x: &Handle,
    w: &Handle,
    scales: &Handle,
    biases: Option<&Handle>,
    transpose: bool,
    group_size: i32,
    bits: i32,
    mode: &str,
) -> Result<Handle> {
    let mode = cstring(mode)?;
    make(|o| unsafe {
        ffi::mlxs_quantized_matmul(
            o,
            x.raw(),
            w.raw(),
            scales.raw(),
            opt(biases),
            c_int::from(transpose),
            group_size,
            bits,
            mode.as_ptr(),
        )
    })
}

/// Returns (packed weight, scales, biases); biases are absent in modes without them.
pub fn quantize(w: &Handle, group_size: i32, bits: i32, mode: &str) -> Result<(Handle, Handle, Option<Handle>)> {
    let mode = cstring(mode)?;
    let (mut q, mut s, mut b) = (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
    check(unsafe { ffi::mlxs_quantize(&mut q, &mut s, &mut b, w.raw(), group_size, bits, mode.as_ptr()) })?;
    let q = NonNull::new(q).map(Handle).ok_or("MLX returned no array")?;
    let s = NonNull::new(s).map(Handle).ok_or("MLX returned no array")?;
    Ok((q, s, NonNull::new(b).map(Handle)))
}

/// `dtype < 0` keeps MLX's default output dtype (that of the scales).
pub fn dequantize(
    w: &Handle,
    scales: &Handle,
    biases: Option<&Handle>,
    group_size: i32,
    bits: i32,
    mode: &str,
    dtype: i32,
) -> Result<Handle> {
    let mode = cstring(mode)?;
    make(|o| unsafe {
        ffi::mlxs_dequantize(o, w.raw(), scales.raw(), opt(biases), group_size, bits, mode.as_ptr(), dtype)
    })
}

pub fn reshape(a: &Handle, shape: &[i32]) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_reshape(o, a.raw(), shape.as_ptr(), len_i32(shape.len())) })
}

pub fn broadcast_to(a: &Handle, shape: &[i32]) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_broadcast_to(o, a.raw(), shape.as_ptr(), len_i32(shape.len())) })
}

pub fn transpose(a: &Handle, axes: &[i32]) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_transpose(o, a.raw(), axes.as_ptr(), len_i32(axes.len())) })
}

pub fn expand_dims(a: &Handle, axes: &[i32]) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_expand_dims(o, a.raw(), axes.as_ptr(), len_i32(axes.len())) })
}

/// Removes the given axes of size one (all of them when `axes` is empty).
pub fn squeeze(a: &Handle, axes: &[i32]) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_squeeze(o, a.raw(), axes.as_ptr(), len_i32(axes.len())) })
}

pub fn slice(a: &Handle, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Handle> {
    if start.len() != stop.len() || start.len() != strides.len() {
        return Err("slice: start, stop and strides differ in length".into());
    }
    make(|o| unsafe {
        ffi::mlxs_slice(o, a.raw(), start.as_ptr(), stop.as_ptr(), strides.as_ptr(), len_i32(start.len()))
    })
}

pub fn slice_update(src: &Handle, update: &Handle, start: &[i32], stop: &[i32]) -> Result<Handle> {
    if start.len() != stop.len() {
        return Err("slice_update: start and stop differ in length".into());
    }
    make(|o| unsafe {
        ffi::mlxs_slice_update(o, src.raw(), update.raw(), start.as_ptr(), stop.as_ptr(), len_i32(start.len()))
    })
}

pub fn concatenate(arrays: &[&Handle], axis: i32) -> Result<Handle> {
    let r = raws(arrays);
    make(|o| unsafe { ffi::mlxs_concatenate(o, r.as_ptr(), r.len(), axis) })
}

pub fn stack(arrays: &[&Handle], axis: i32) -> Result<Handle> {
    let r = raws(arrays);
    make(|o| unsafe { ffi::mlxs_stack(o, r.as_ptr(), r.len(), axis) })
}

pub fn take(a: &Handle, indices: &Handle, axis: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_take(o, a.raw(), indices.raw(), axis) })
}

pub fn take_along_axis(a: &Handle, indices: &Handle, axis: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_take_along_axis(o, a.raw(), indices.raw(), axis) })
}

pub fn put_along_axis(a: &Handle, indices: &Handle, values: &Handle, axis: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_put_along_axis(o, a.raw(), indices.raw(), values.raw(), axis) })
}

pub fn scatter_add_axis(a: &Handle, indices: &Handle, values: &Handle, axis: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_scatter_add_axis(o, a.raw(), indices.raw(), values.raw(), axis) })
}

pub fn arange(start: f64, stop: f64, step: f64, dtype: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_arange(o, start, stop, step, dtype) })
}

pub fn full(shape: &[i32], value: &Handle, dtype: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_full(o, shape.as_ptr(), len_i32(shape.len()), value.raw(), dtype) })
}

pub fn contiguous(a: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_contiguous(o, a.raw()) })
}

/// A reduction over `axes` (all axes when empty).
pub fn reduce(op: i32, a: &Handle, axes: &[i32], keepdims: bool) -> Result<Handle> {
    make(|o| unsafe {
        ffi::mlxs_reduce(o, op, a.raw(), axes.as_ptr(), len_i32(axes.len()), c_int::from(keepdims))
    })
}

pub fn softmax(a: &Handle, axes: &[i32], precise: bool) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_softmax(o, a.raw(), axes.as_ptr(), len_i32(axes.len()), c_int::from(precise)) })
}

pub fn sort_op(op: i32, a: &Handle, axis: i32, k: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_sort_op(o, op, a.raw(), axis, k) })
}

pub fn cumsum(a: &Handle, axis: i32, reverse: bool, inclusive: bool) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_cumsum(o, a.raw(), axis, c_int::from(reverse), c_int::from(inclusive)) })
}

pub fn swiglu(gate: &Handle, up: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_swiglu(o, gate.raw(), up.raw()) })
}

pub fn conv1d(x: &Handle, w: &Handle, stride: i32, padding: i32, dilation: i32, groups: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_conv1d(o, x.raw(), w.raw(), stride, padding, dilation, groups) })
}

pub fn repeat(a: &Handle, repeats: i32, axis: i32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_repeat(o, a.raw(), repeats, axis) })
}

pub fn gated_delta_g(a_log: &Handle, a: &Handle, dt_bias: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_gated_delta_g(o, a_log.raw(), a.raw(), dt_bias.raw()) })
}

/// Whether [`GatedDelta::Kernel`] can run: the default device is a GPU (CUDA or Metal).
pub fn gated_delta_kernel_available() -> bool {
    unsafe { ffi::mlxs_gated_delta_kernel_available() == 1 }
}

/// (x + y, rms_norm(x + y, w, eps)); `kernel`: as one GPU kernel where it runs.
pub fn add_rms_norm(x: &Handle, y: &Handle, w: &Handle, eps: f32, kernel: bool) -> Result<(Handle, Handle)> {
    let mut out: ffi::mlxs_array = ptr::null_mut();
    let h = make(|o| unsafe { ffi::mlxs_add_rms_norm(o, &mut out, x.raw(), y.raw(), w.raw(), eps, c_int::from(kernel)) })?;
    let out = NonNull::new(out).map(Handle).ok_or_else(|| "MLX returned no normed array".to_owned())?;
    Ok((h, out))
}

/// logits (rows, vocab) with every token whose bit is clear in `words` (rows x ceil(vocab / 32),
/// bit t % 32 of word t / 32) set to -inf, as one CUDA kernel; `None` where it does not run (not a
/// CUDA GPU, `MLX_GEN_MASK_KERNEL=0`, logits not 2-D floats).
pub fn mask_tokens(logits: &Handle, words: &[u32]) -> Result<Option<Handle>> {
    let mut out: ffi::mlxs_array = ptr::null_mut();
    check(unsafe { ffi::mlxs_mask_tokens(&mut out, logits.raw(), words.as_ptr(), words.len()) })?;
    Ok(NonNull::new(out).map(Handle))
}

/// A mixture-of-experts router's choice as one CUDA kernel: (expert indices, weights), each
/// (..., k); `None` where the kernel does not run. `select_first`: the k largest logits, then their
/// softmax (else softmax, the k largest, `normalize`d where asked), times `scale`; `from_top`:
/// qwen3_moe's order.
pub fn moe_route(logits: &Handle, k: i32, select_first: bool, from_top: bool, normalize: bool, scale: f32) -> Result<Option<(Handle, Handle)>> {
    let (mut inds, mut weights): (ffi::mlxs_array, ffi::mlxs_array) = (ptr::null_mut(), ptr::null_mut());
    let (mode, top, norm) = (c_int::from(select_first), c_int::from(from_top), c_int::from(normalize));
    check(unsafe { ffi::mlxs_moe_route(&mut inds, &mut weights, logits.raw(), k, mode, top, norm, scale) })?;
    Ok(NonNull::new(inds).map(Handle).zip(NonNull::new(weights).map(Handle)))
}

/// The value of function `name` in the symbol table of the ELF file at `path` (0: none), as the
/// shim finds MLX's device allocator in libmlx.
pub fn elf_function_value(path: &str, name: &str) -> Result<u64> {
    let (path, name) = (cstring(path)?, cstring(name)?);
    let mut value = 0u64;
    check(unsafe { ffi::mlxs_elf_function_value(path.as_ptr(), name.as_ptr(), &mut value) })?;
    Ok(value)
}

/// Which gated-delta function [`gated_delta`] calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedDelta {
    /// One compiled step (q, k (B, H, Dk), ...).
    Step,
    /// The recurrence over all positions as one GPU kernel (q, k (B, T, Hk, Dk), ...).
    Kernel,
}

/// A gated-delta step or the whole recurrence (see [`GatedDelta`]): (y, new state).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta(
    how: GatedDelta,
    q: &Handle,
    k: &Handle,
    v: &Handle,
    g: &Handle,
    beta: &Handle,
    state: &Handle,
    mask: Option<&Handle>,
) -> Result<(Handle, Handle)> {
    let f = match how {
        GatedDelta::Step => ffi::mlxs_gated_delta_step,
        GatedDelta::Kernel => ffi::mlxs_gated_delta_kernel,
    };
    let mut state_out: ffi::mlxs_array = ptr::null_mut();
    let y = make(|o| unsafe { f(o, &mut state_out, q.raw(), k.raw(), v.raw(), g.raw(), beta.raw(), state.raw(), opt(mask)) })?;
    let state = NonNull::new(state_out).map(Handle).ok_or_else(|| "MLX returned no state".to_owned())?;
    Ok((y, state))
}

pub fn precise_swiglu(h: &Handle, gate: &Handle, x: &Handle) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_precise_swiglu(o, h.raw(), gate.raw(), x.raw()) })
}

pub fn rms_norm(x: &Handle, weight: Option<&Handle>, eps: f32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_rms_norm(o, x.raw(), opt(weight), eps) })
}

pub fn layer_norm(x: &Handle, weight: Option<&Handle>, bias: Option<&Handle>, eps: f32) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_layer_norm(o, x.raw(), opt(weight), opt(bias), eps) })
}

/// Where [`rope`]'s positions start: one offset, or one per batch row ((B,) int32).
#[derive(Clone, Copy)]
pub enum RopeOffset<'a> {
    Same(i32),
    Rows(&'a Handle),
}

pub fn rope(
    x: &Handle,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: RopeOffset<'_>,
    freqs: Option<&Handle>,
) -> Result<Handle> {
    let (same, rows) = match offset {
        RopeOffset::Same(o) => (o, None),
        RopeOffset::Rows(r) => (0, Some(r)),
    };
    make(|o| unsafe {
        ffi::mlxs_rope(
            o,
            x.raw(),
            dims,
            c_int::from(traditional),
            c_int::from(base.is_some()),
            base.unwrap_or(0.0),
            scale,
            same,
            opt(rows),
            opt(freqs),
        )
    })
}

pub fn sdpa(
    q: &Handle,
    k: &Handle,
    v: &Handle,
    scale: f32,
    mask_mode: &str,
    mask: Option<&Handle>,
    sinks: Option<&Handle>,
) -> Result<Handle> {
    let mode = cstring(mask_mode)?;
    make(|o| unsafe { ffi::mlxs_sdpa(o, q.raw(), k.raw(), v.raw(), scale, mode.as_ptr(), opt(mask), opt(sinks)) })
}

pub fn random_seed(seed: u64) -> Result<()> {
    check(unsafe { ffi::mlxs_random_seed(seed) })
}

/// Sets environment variable `name` (one MLX reads) to `value` unless it is set already. Call it
/// before MLX first reads it (before the first evaluation).
pub fn setenv_default(name: &str, value: &str) -> Result<()> {
    let (n, v) = (cstring(name)?, cstring(value)?);
    check(unsafe { ffi::mlxs_setenv_default(n.as_ptr(), v.as_ptr()) })
}

pub fn random_key(seed: u64) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_random_key(o, seed) })
}

/// `mx.random.split(key)`: two new keys.
pub fn random_split(key: &Handle) -> Result<(Handle, Handle)> {
    let mut b: ffi::mlxs_array = ptr::null_mut();
    let a = make(|o| unsafe { ffi::mlxs_random_split(o, &mut b, key.raw()) })?;
    let b = NonNull::new(b).map(Handle).ok_or_else(|| "MLX returned no array".to_owned())?;
    Ok((a, b))
}

pub fn random_categorical(logits: &Handle, axis: i32, key: Option<&Handle>) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_random_categorical(o, logits.raw(), axis, opt(key)) })
}

pub fn random_uniform(shape: &[i32], dtype: i32, key: Option<&Handle>) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_random_uniform(o, shape.as_ptr(), len_i32(shape.len()), dtype, opt(key)) })
}

pub fn random_randint(low: i64, high: i64, shape: &[i32], dtype: i32, key: Option<&Handle>) -> Result<Handle> {
    make(|o| unsafe { ffi::mlxs_random_randint(o, low, high, shape.as_ptr(), len_i32(shape.len()), dtype, opt(key)) })
}

// ---- gathered matmuls ----

/// `mx::gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices)`.
pub fn gather_mm(
    a: &Handle,
    b: &Handle,
    lhs_indices: Option<&Handle>,
    rhs_indices: Option<&Handle>,
    sorted_indices: bool,
) -> Result<Handle> {
    make(|o| unsafe {
        ffi::mlxs_gather_mm(o, a.raw(), b.raw(), opt(lhs_indices), opt(rhs_indices), c_int::from(sorted_indices))
    })
}

/// `mx::gather_qmm(x, w, scales, biases, lhs_indices, rhs_indices, transpose, group_size, bits, mode,
/// sorted_indices)`.
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm(
    x: &Handle,
    w: &Handle,
    scales: &Handle,
    biases: Option<&Handle>,
    lhs_indices: Option<&Handle>,
    rhs_indices: Option<&Handle>,
    transpose: bool,
    group_size: i32,
    bits: i32,
    mode: &str,
    sorted_indices: bool,
) -> Result<Handle> {
    let mode = cstring(mode)?;
    make(|o| unsafe {
        ffi::mlxs_gather_qmm(
            o,
            x.raw(),
            w.raw(),
            scales.raw(),
            opt(biases),
            opt(lhs_indices),
            opt(rhs_indices),
            c_int::from(transpose),
            group_size,
            bits,
            mode.as_ptr(),
            c_int::from(sorted_indices),
        )
    })
}

