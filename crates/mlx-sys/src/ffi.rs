//! `extern "C"` declarations of `shim/shim.h`, one for one. Declarations only.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_double, c_float, c_int, c_void};

#[repr(C)]
pub struct mlxs_array_ {
    _private: [u8; 0],
}
#[repr(C)]
pub struct mlxs_tensors_ {
    _private: [u8; 0],
}
pub type mlxs_array = *mut mlxs_array_;
pub type mlxs_tensors = *mut mlxs_tensors_;
#[repr(C)]
pub struct mlxs_mailbox_ {
    _private: [u8; 0],
}
pub type mlxs_mailbox = *mut mlxs_mailbox_;
#[repr(C)]
pub struct mlxs_group_ {
    _private: [u8; 0],
}
pub type mlxs_group = *mut mlxs_group_;

extern "C" {
    pub fn mlxs_last_error() -> *const c_char;

    pub fn mlxs_version() -> *const c_char;
    pub fn mlxs_gpu_available() -> c_int;
    pub fn mlxs_set_default_device(gpu: c_int) -> c_int;
    pub fn mlxs_device_name(buf: *mut c_char, len: usize) -> c_int;
    pub fn mlxs_new_default_stream() -> c_int;
    pub fn mlxs_synchronize() -> c_int;
    pub fn mlxs_default_device_is_gpu() -> c_int;

    pub fn mlxs_array_free(a: mlxs_array);
    pub fn mlxs_array_clone(out: *mut mlxs_array, a: mlxs_array) -> c_int;
    pub fn mlxs_array_from_data(
        out: *mut mlxs_array,
        data: *const u8,
        shape: *const i32,
        ndim: c_int,
        dtype: c_int,
    ) -> c_int;
    pub fn mlxs_array_read_file(out: *mut mlxs_array, fd: c_int, offset: u64, shape: *const i32, ndim: c_int, dtype: c_int) -> c_int;
    pub fn mlxs_array_from_external(
        out: *mut mlxs_array,
        data: *mut c_void,
        bytes: usize,
        shape: *const i32,
        ndim: c_int,
        dtype: c_int,
        owner: *mut c_void,
        release: unsafe extern "C" fn(*mut c_void),
        zero_copy: *mut c_int,
    ) -> c_int;
    pub fn mlxs_array_scalar(out: *mut mlxs_array, value: c_double, dtype: c_int) -> c_int;
    pub fn mlxs_array_ndim(a: mlxs_array) -> c_int;
    pub fn mlxs_array_shape(a: mlxs_array, shape: *mut i32) -> c_int;
    pub fn mlxs_array_dtype(a: mlxs_array) -> c_int;
    pub fn mlxs_array_size(a: mlxs_array) -> usize;
    pub fn mlxs_array_nbytes(a: mlxs_array) -> usize;
    pub fn mlxs_array_to_host(a: mlxs_array, dtype: c_int, buf: *mut u8, nbytes: usize) -> c_int;
    pub fn mlxs_eval(arrays: *const mlxs_array, n: usize) -> c_int;
    pub fn mlxs_async_eval(arrays: *const mlxs_array, n: usize) -> c_int;
    pub fn mlxs_export_to_dot(arrays: *const mlxs_array, n: usize, path: *const c_char) -> c_int;

    pub fn mlxs_unary(out: *mut mlxs_array, op: c_int, a: mlxs_array) -> c_int;
    pub fn mlxs_binary(out: *mut mlxs_array, op: c_int, a: mlxs_array, b: mlxs_array) -> c_int;
    pub fn mlxs_where(out: *mut mlxs_array, cond: mlxs_array, x: mlxs_array, y: mlxs_array) -> c_int;
    pub fn mlxs_astype(out: *mut mlxs_array, a: mlxs_array, dtype: c_int) -> c_int;
    pub fn mlxs_from_fp8(out: *mut mlxs_array, a: mlxs_array, dtype: c_int) -> c_int;
    pub fn mlxs_to_fp8(out: *mut mlxs_array, a: mlxs_array) -> c_int;
    pub fn mlxs_view(out: *mut mlxs_array, a: mlxs_array, dtype: c_int) -> c_int;
    pub fn mlxs_pad(
        out: *mut mlxs_array,
        a: mlxs_array,
        low: *const i32,
        high: *const i32,
        n: c_int,
        value: mlxs_array,
    ) -> c_int;

    pub fn mlxs_matmul(out: *mut mlxs_array, a: mlxs_array, b: mlxs_array) -> c_int;
    pub fn mlxs_addmm(
        out: *mut mlxs_array,
        c: mlxs_array,
        a: mlxs_array,
        b: mlxs_array,
        alpha: c_float,
        beta: c_float,
    ) -> c_int;
    pub fn mlxs_quantized_matmul(
        out: *mut mlxs_array,
        x: mlxs_array,
        w: mlxs_array,
        scales: mlxs_array,
        biases: mlxs_array,
        transpose: c_int,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
    ) -> c_int;
    pub fn mlxs_qmm_rows(
        out: *mut mlxs_array,
        x: mlxs_array,
        w: mlxs_array,
        scales: mlxs_array,
        biases: mlxs_array,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
    ) -> c_int;
    pub fn mlxs_gather_qmm_rows(
        out: *mut mlxs_array,
        x: mlxs_array,
        w: mlxs_array,
        scales: mlxs_array,
        biases: mlxs_array,
        indices: mlxs_array,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
    ) -> c_int;
    pub fn mlxs_qmm_rows_available() -> c_int;
    pub fn mlxs_jit_check(nvrtc_library: *const c_char, arch: *const c_char, compiled: *mut c_int) -> c_int;
    pub fn mlxs_sdpa_few_available(q: mlxs_array, k: mlxs_array, v: mlxs_array) -> c_int;
    pub fn mlxs_sdpa_few(out: *mut mlxs_array, q: mlxs_array, k: mlxs_array, v: mlxs_array, scale: f32, mask: mlxs_array, causal: c_int) -> c_int;
    pub fn mlxs_quantize(
        w_out: *mut mlxs_array,
        scales_out: *mut mlxs_array,
        biases_out: *mut mlxs_array,
        w: mlxs_array,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
    ) -> c_int;
    pub fn mlxs_dequantize(
        out: *mut mlxs_array,
        w: mlxs_array,
        scales: mlxs_array,
        biases: mlxs_array,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
        dtype: c_int,
    ) -> c_int;

    pub fn mlxs_reshape(out: *mut mlxs_array, a: mlxs_array, shape: *const i32, ndim: c_int) -> c_int;
    pub fn mlxs_broadcast_to(out: *mut mlxs_array, a: mlxs_array, shape: *const i32, ndim: c_int) -> c_int;
    pub fn mlxs_transpose(out: *mut mlxs_array, a: mlxs_array, axes: *const i32, n: c_int) -> c_int;
    pub fn mlxs_expand_dims(out: *mut mlxs_array, a: mlxs_array, axes: *const i32, n: c_int) -> c_int;
    pub fn mlxs_squeeze(out: *mut mlxs_array, a: mlxs_array, axes: *const i32, n: c_int) -> c_int;
    pub fn mlxs_slice(
        out: *mut mlxs_array,
        a: mlxs_array,
        start: *const i32,
        stop: *const i32,
        strides: *const i32,
        n: c_int,
    ) -> c_int;
    pub fn mlxs_slice_update(
        out: *mut mlxs_array,
        src: mlxs_array,
        update: mlxs_array,
        start: *const i32,
        stop: *const i32,
        n: c_int,
    ) -> c_int;
    pub fn mlxs_concatenate(out: *mut mlxs_array, arrays: *const mlxs_array, n: usize, axis: c_int) -> c_int;
    pub fn mlxs_stack(out: *mut mlxs_array, arrays: *const mlxs_array, n: usize, axis: c_int) -> c_int;
    pub fn mlxs_take(out: *mut mlxs_array, a: mlxs_array, indices: mlxs_array, axis: c_int) -> c_int;
    pub fn mlxs_take_along_axis(out: *mut mlxs_array, a: mlxs_array, indices: mlxs_array, axis: c_int) -> c_int;
    pub fn mlxs_put_along_axis(
        out: *mut mlxs_array,
        a: mlxs_array,
        indices: mlxs_array,
        values: mlxs_array,
        axis: c_int,
    ) -> c_int;
    pub fn mlxs_scatter_add_axis(
        out: *mut mlxs_array,
        a: mlxs_array,
        indices: mlxs_array,
        values: mlxs_array,
        axis: c_int,
    ) -> c_int;
    pub fn mlxs_arange(out: *mut mlxs_array, start: c_double, stop: c_double, step: c_double, dtype: c_int)
        -> c_int;
    pub fn mlxs_full(out: *mut mlxs_array, shape: *const i32, ndim: c_int, value: mlxs_array, dtype: c_int)
        -> c_int;
    pub fn mlxs_contiguous(out: *mut mlxs_array, a: mlxs_array) -> c_int;

    pub fn mlxs_reduce(
        out: *mut mlxs_array,
        op: c_int,
        a: mlxs_array,
        axes: *const i32,
        n: c_int,
        keepdims: c_int,
    ) -> c_int;
    pub fn mlxs_softmax(out: *mut mlxs_array, a: mlxs_array, axes: *const i32, n: c_int, precise: c_int) -> c_int;
    pub fn mlxs_sort_op(out: *mut mlxs_array, op: c_int, a: mlxs_array, axis: c_int, k: c_int) -> c_int;
    pub fn mlxs_cumsum(out: *mut mlxs_array, a: mlxs_array, axis: c_int, reverse: c_int, inclusive: c_int)
        -> c_int;

    pub fn mlxs_swiglu(out: *mut mlxs_array, gate: mlxs_array, up: mlxs_array) -> c_int;
    pub fn mlxs_conv1d(out: *mut mlxs_array, x: mlxs_array, w: mlxs_array, stride: c_int, padding: c_int, dilation: c_int, groups: c_int)
        -> c_int;
    pub fn mlxs_repeat(out: *mut mlxs_array, a: mlxs_array, repeats: c_int, axis: c_int) -> c_int;
    pub fn mlxs_gated_delta_g(out: *mut mlxs_array, a_log: mlxs_array, a: mlxs_array, dt_bias: mlxs_array) -> c_int;
    pub fn mlxs_gated_delta_kernel_available() -> c_int;
    pub fn mlxs_add_rms_norm(
        h: *mut mlxs_array,
        out: *mut mlxs_array,
        x: mlxs_array,
        y: mlxs_array,
        w: mlxs_array,
        eps: f32,
        kernel: c_int,
    ) -> c_int;
    pub fn mlxs_mask_tokens(out: *mut mlxs_array, logits: mlxs_array, words: *const u32, n_words: usize) -> c_int;
    pub fn mlxs_mailbox_new(out: *mut mlxs_mailbox) -> c_int;
    pub fn mlxs_mailbox_free(m: mlxs_mailbox);
    pub fn mlxs_mailbox_post(out: *mut mlxs_array, seq: *mut u32, m: mlxs_mailbox, tokens: mlxs_array) -> c_int;
    pub fn mlxs_mailbox_wait(got: *mut c_int, m: mlxs_mailbox, seq: u32, posted: mlxs_array, dst: *mut u32, n: usize) -> c_int;
    pub fn mlxs_qmm_mma(
        out: *mut mlxs_array,
        x: mlxs_array,
        w: mlxs_array,
        scales: mlxs_array,
        biases: mlxs_array,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
    ) -> c_int;
    pub fn mlxs_moe_route(
        inds: *mut mlxs_array,
        weights: *mut mlxs_array,
        logits: mlxs_array,
        k: c_int,
        mode: c_int,
        from_top: c_int,
        normalize: c_int,
        scale: f32,
    ) -> c_int;
    pub fn mlxs_elf_function_value(path: *const c_char, name: *const c_char, value: *mut u64) -> c_int;
    pub fn mlxs_gated_delta_kernel(
        y: *mut mlxs_array,
        state_out: *mut mlxs_array,
        q: mlxs_array,
        k: mlxs_array,
        v: mlxs_array,
        g: mlxs_array,
        beta: mlxs_array,
        state: mlxs_array,
        mask: mlxs_array,
    ) -> c_int;
    pub fn mlxs_gated_delta_step(
        y: *mut mlxs_array,
        state_out: *mut mlxs_array,
        q: mlxs_array,
        k: mlxs_array,
        v: mlxs_array,
        g: mlxs_array,
        beta: mlxs_array,
        state: mlxs_array,
        mask: mlxs_array,
    ) -> c_int;
    pub fn mlxs_precise_swiglu(out: *mut mlxs_array, h: mlxs_array, gate: mlxs_array, x: mlxs_array) -> c_int;
    pub fn mlxs_rms_norm(out: *mut mlxs_array, x: mlxs_array, weight: mlxs_array, eps: c_float) -> c_int;
    pub fn mlxs_layer_norm(
        out: *mut mlxs_array,
        x: mlxs_array,
        weight: mlxs_array,
        bias: mlxs_array,
        eps: c_float,
    ) -> c_int;
    pub fn mlxs_rope(
        out: *mut mlxs_array,
        x: mlxs_array,
        dims: c_int,
        traditional: c_int,
        has_base: c_int,
        base: c_float,
        scale: c_float,
        offset: c_int,
        offsets: mlxs_array,
        freqs: mlxs_array,
    ) -> c_int;
    pub fn mlxs_sdpa(
        out: *mut mlxs_array,
        q: mlxs_array,
        k: mlxs_array,
        v: mlxs_array,
        scale: c_float,
        mask_mode: *const c_char,
        mask: mlxs_array,
        sinks: mlxs_array,
    ) -> c_int;

    pub fn mlxs_random_seed(seed: u64) -> c_int;
    pub fn mlxs_setenv_default(name: *const c_char, value: *const c_char) -> c_int;
    pub fn mlxs_random_key(out: *mut mlxs_array, seed: u64) -> c_int;
    pub fn mlxs_random_split(first: *mut mlxs_array, second: *mut mlxs_array, key: mlxs_array) -> c_int;
    pub fn mlxs_random_categorical(out: *mut mlxs_array, logits: mlxs_array, axis: c_int, key: mlxs_array) -> c_int;
    pub fn mlxs_random_uniform(
        out: *mut mlxs_array,
        shape: *const i32,
        ndim: c_int,
        dtype: c_int,
        key: mlxs_array,
    ) -> c_int;

    pub fn mlxs_random_randint(
        out: *mut mlxs_array,
        low: i64,
        high: i64,
        shape: *const i32,
        ndim: c_int,
        dtype: c_int,
        key: mlxs_array,
    ) -> c_int;

    pub fn mlxs_safetensors_load(out: *mut mlxs_tensors, path: *const c_char) -> c_int;
    pub fn mlxs_tensors_free(t: mlxs_tensors);
    pub fn mlxs_tensors_len(t: mlxs_tensors) -> usize;
    pub fn mlxs_tensors_name(t: mlxs_tensors, i: usize) -> *const c_char;
    pub fn mlxs_tensors_array(out: *mut mlxs_array, t: mlxs_tensors, i: usize) -> c_int;
    pub fn mlxs_tensors_meta_len(t: mlxs_tensors) -> usize;
    pub fn mlxs_tensors_meta_key(t: mlxs_tensors, i: usize) -> *const c_char;
    pub fn mlxs_tensors_meta_value(t: mlxs_tensors, i: usize) -> *const c_char;
    pub fn mlxs_safetensors_save(
        path: *const c_char,
        names: *const *const c_char,
        arrays: *const mlxs_array,
        n: usize,
        meta_keys: *const *const c_char,
        meta_values: *const *const c_char,
        m: usize,
    ) -> c_int;

    pub fn mlxs_active_memory() -> usize;
    pub fn mlxs_peak_memory() -> usize;
    pub fn mlxs_external_memory() -> usize;
    pub fn mlxs_cache_memory() -> usize;
    pub fn mlxs_reset_peak_memory();
    pub fn mlxs_clear_cache();
    pub fn mlxs_set_cache_limit(limit: usize) -> usize;
    pub fn mlxs_set_memory_limit(limit: usize) -> usize;

    pub fn mlxs_gather_mm(
        out: *mut mlxs_array,
        a: mlxs_array,
        b: mlxs_array,
        lhs_indices: mlxs_array,
        rhs_indices: mlxs_array,
        sorted_indices: c_int,
    ) -> c_int;
    pub fn mlxs_gather_qmm(
        out: *mut mlxs_array,
        x: mlxs_array,
        w: mlxs_array,
        scales: mlxs_array,
        biases: mlxs_array,
        lhs_indices: mlxs_array,
        rhs_indices: mlxs_array,
        transpose: c_int,
        group_size: c_int,
        bits: c_int,
        mode: *const c_char,
        sorted_indices: c_int,
    ) -> c_int;

    pub fn mlxs_dist_last_error() -> *const c_char;
    pub fn mlxs_dist_is_available(backend: *const c_char) -> c_int;
    pub fn mlxs_dist_init(out: *mut mlxs_group, strict: c_int, backend: *const c_char) -> c_int;
    pub fn mlxs_group_free(g: mlxs_group);
    pub fn mlxs_group_rank(g: mlxs_group) -> c_int;
    pub fn mlxs_group_size(g: mlxs_group) -> c_int;
    pub fn mlxs_group_split(out: *mut mlxs_group, g: mlxs_group, color: c_int, key: c_int) -> c_int;
    pub fn mlxs_dist_all_sum(out: *mut mlxs_array, x: mlxs_array, g: mlxs_group) -> c_int;
    pub fn mlxs_dist_all_gather(out: *mut mlxs_array, x: mlxs_array, g: mlxs_group) -> c_int;
    pub fn mlxs_dist_send(out: *mut mlxs_array, x: mlxs_array, dst: c_int, g: mlxs_group) -> c_int;
    pub fn mlxs_dist_recv_like(out: *mut mlxs_array, like: mlxs_array, src: c_int, g: mlxs_group) -> c_int;
}
