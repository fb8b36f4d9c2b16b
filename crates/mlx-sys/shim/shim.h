/* mlx-gen's C ABI over the MLX C++ API (pinned to 0.32.4).
 *
 * Every function returns 0 on success and non-zero on failure; on failure the
 * MLX exception text is kept per thread and read with mlxs_last_error().
 * Arrays are opaque heap handles owned by the caller (free with mlxs_array_free).
 * Results come back through out-parameters. Optional arrays are passed as NULL. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlxs_array_* mlxs_array;
typedef struct mlxs_tensors_* mlxs_tensors;

const char* mlxs_last_error(void);

/* library and device */
const char* mlxs_version(void);
int mlxs_gpu_available(void);
int mlxs_set_default_device(int gpu);
int mlxs_device_name(char* buf, size_t len);
int mlxs_new_default_stream(void);
int mlxs_synchronize(void);
/* sets an environment variable MLX reads, unless it is already set */
int mlxs_setenv_default(const char* name, const char* value);
int mlxs_default_device_is_gpu(void);

/* array lifecycle and host access */
void mlxs_array_free(mlxs_array a);
int mlxs_array_clone(mlxs_array* out, const mlxs_array a);
int mlxs_array_from_data(mlxs_array* out, const void* data, const int32_t* shape, int ndim, int dtype);
/* An array over `bytes` bytes at `data` (row-major `shape` of `dtype`) that the caller owns:
 * release(owner) runs once MLX no longer needs them (at once if MLX copied them). *zero_copy is 1
 * when the array uses the bytes in place. The 8 bytes before `data` must be readable. */
int mlxs_array_from_external(mlxs_array* out, void* data, size_t bytes, const int32_t* shape, int ndim,
                             int dtype, void* owner, void (*release)(void*), int* zero_copy);
/* A row-major `shape` of `dtype` read from file descriptor `fd` at byte `offset` (pread) into a buffer
 * of MLX's allocator, which the array then owns; a short read is an error. */
int mlxs_array_read_file(mlxs_array* out, int fd, uint64_t offset, const int32_t* shape, int ndim, int dtype);
int mlxs_array_scalar(mlxs_array* out, double value, int dtype);
int mlxs_array_ndim(const mlxs_array a);
int mlxs_array_shape(const mlxs_array a, int32_t* shape);
int mlxs_array_dtype(const mlxs_array a);
size_t mlxs_array_size(const mlxs_array a);
size_t mlxs_array_nbytes(const mlxs_array a);
int mlxs_array_to_host(const mlxs_array a, int dtype, void* buf, size_t nbytes);
int mlxs_eval(const mlxs_array* arrays, size_t n);
int mlxs_async_eval(const mlxs_array* arrays, size_t n);
/* The unevaluated graph behind `arrays` in Graphviz dot (mx::export_to_dot), written to `path`. */
int mlxs_export_to_dot(const mlxs_array* arrays, size_t n, const char* path);

/* elementwise */
int mlxs_unary(mlxs_array* out, int op, const mlxs_array a);
int mlxs_binary(mlxs_array* out, int op, const mlxs_array a, const mlxs_array b);
int mlxs_where(mlxs_array* out, const mlxs_array cond, const mlxs_array x, const mlxs_array y);
int mlxs_astype(mlxs_array* out, const mlxs_array a, int dtype);
int mlxs_from_fp8(mlxs_array* out, const mlxs_array a, int dtype);
int mlxs_to_fp8(mlxs_array* out, const mlxs_array a);
int mlxs_view(mlxs_array* out, const mlxs_array a, int dtype);
int mlxs_pad(mlxs_array* out, const mlxs_array a, const int32_t* low, const int32_t* high, int n,
             const mlxs_array value);

/* linear algebra */
int mlxs_matmul(mlxs_array* out, const mlxs_array a, const mlxs_array b);
int mlxs_addmm(mlxs_array* out, const mlxs_array c, const mlxs_array a, const mlxs_array b, float alpha, float beta);
int mlxs_quantized_matmul(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                          const mlxs_array biases, int transpose, int group_size, int bits, const char* mode);
int mlxs_quantize(mlxs_array* w_out, mlxs_array* scales_out, mlxs_array* biases_out, const mlxs_array w,
                  int group_size, int bits, const char* mode);
int mlxs_dequantize(mlxs_array* out, const mlxs_array w, const mlxs_array scales, const mlxs_array biases,
                    int group_size, int bits, const char* mode, int dtype);

/* shapes and indexing */
int mlxs_reshape(mlxs_array* out, const mlxs_array a, const int32_t* shape, int ndim);
int mlxs_broadcast_to(mlxs_array* out, const mlxs_array a, const int32_t* shape, int ndim);
int mlxs_transpose(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n);
int mlxs_expand_dims(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n);
int mlxs_squeeze(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n);
int mlxs_slice(mlxs_array* out, const mlxs_array a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, int n);
int mlxs_slice_update(mlxs_array* out, const mlxs_array src, const mlxs_array update, const int32_t* start,
                      const int32_t* stop, int n);
int mlxs_concatenate(mlxs_array* out, const mlxs_array* arrays, size_t n, int axis);
int mlxs_stack(mlxs_array* out, const mlxs_array* arrays, size_t n, int axis);
int mlxs_take(mlxs_array* out, const mlxs_array a, const mlxs_array indices, int axis);
int mlxs_take_along_axis(mlxs_array* out, const mlxs_array a, const mlxs_array indices, int axis);
int mlxs_put_along_axis(mlxs_array* out, const mlxs_array a, const mlxs_array indices, const mlxs_array values,
                        int axis);
int mlxs_scatter_add_axis(mlxs_array* out, const mlxs_array a, const mlxs_array indices, const mlxs_array values,
                           int axis);
int mlxs_arange(mlxs_array* out, double start, double stop, double step, int dtype);
int mlxs_full(mlxs_array* out, const int32_t* shape, int ndim, const mlxs_array value, int dtype);
int mlxs_contiguous(mlxs_array* out, const mlxs_array a);

/* reductions and sorting (axes == NULL, n == 0: all axes) */
int mlxs_reduce(mlxs_array* out, int op, const mlxs_array a, const int32_t* axes, int n, int keepdims);
int mlxs_softmax(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n, int precise);
int mlxs_sort_op(mlxs_array* out, int op, const mlxs_array a, int axis, int k);
int mlxs_cumsum(mlxs_array* out, const mlxs_array a, int axis, int reverse, int inclusive);

/* fused kernels (mlx::core::fast, and compiled elementwise chains) */
int mlxs_swiglu(mlxs_array* out, const mlxs_array gate, const mlxs_array up);
int mlxs_rms_norm(mlxs_array* out, const mlxs_array x, const mlxs_array weight, float eps);
int mlxs_layer_norm(mlxs_array* out, const mlxs_array x, const mlxs_array weight, const mlxs_array bias, float eps);
/* recurrent layers (recurrent.cpp): mx.conv1d, mx.repeat, and the compiled pieces of mlx-lm's
   gated_delta.py (compute_g, _gated_delta_step_ops with mask == NULL or (B,) bool) and
   activations.precise_swiglu */
int mlxs_conv1d(mlxs_array* out, const mlxs_array x, const mlxs_array w, int stride, int padding, int dilation,
                int groups);
int mlxs_repeat(mlxs_array* out, const mlxs_array a, int repeats, int axis);
int mlxs_gated_delta_g(mlxs_array* out, const mlxs_array a_log, const mlxs_array a, const mlxs_array dt_bias);
int mlxs_gated_delta_step(mlxs_array* y, mlxs_array* state_out, const mlxs_array q, const mlxs_array k,
                          const mlxs_array v, const mlxs_array g, const mlxs_array beta, const mlxs_array state,
                          const mlxs_array mask);
/* the whole recurrence over T positions as one GPU kernel (CUDA or Metal, through MLX's custom
   kernel API): q, k (B, T, Hk, Dk), v (B, T, Hv, Dv), g, beta (B, T, Hv), state (B, Hv, Dv, Dk),
   mask (B, T) bool or NULL -> y (B, T, Hv, Dv), the new state. Available on a GPU default device. */
int mlxs_gated_delta_kernel_available(void);
int mlxs_gated_delta_kernel(mlxs_array* y, mlxs_array* state_out, const mlxs_array q, const mlxs_array k,
                            const mlxs_array v, const mlxs_array g, const mlxs_array beta, const mlxs_array state,
                            const mlxs_array mask);
/* the residual add fused with the RMS norm after it (norm.cpp): h = x + y, out = rms_norm(h, w, eps);
   kernel = 1: one GPU kernel where the default device is a CUDA or Metal GPU and the inputs suit it
   (same shape and a floating dtype for x, y and w, w of length D), else MLX's two operations. */
int mlxs_add_rms_norm(mlxs_array* h, mlxs_array* out, const mlxs_array x, const mlxs_array y, const mlxs_array w,
                      float eps, int kernel);
/* logits (rows, vocab) with each token whose bit is clear in its row's packed words (rows x ceil(vocab / 32)
   words, bit t % 32 of word t / 32) set to -inf, as one CUDA kernel reading the words from page-locked host
   memory (mask.cpp); *out is left null where that kernel does not run (not a CUDA GPU, MLX_GEN_MASK_KERNEL=0,
   logits not 2-D floats). */
int mlxs_mask_tokens(mlxs_array* out, const mlxs_array logits, const uint32_t* words, size_t n_words);
/* Reading sampled tokens before their evaluation ends (mailbox.cpp): a mailbox is a block of host memory
   that a post's primitive writes its tokens and then a sequence number to, on a CUDA GPU (one kernel of
   ours writing to page-locked mapped memory) or on the CPU (a task of MLX's CPU stream); mlxs_mailbox_new
   fails elsewhere (Metal). mlxs_mailbox_post: tokens (n,) uint32 or int32 -> *out, the same tokens, to use
   downstream in their place, and *seq, the post's number. mlxs_mailbox_wait: waits until post `seq` is in
   the block and copies its n tokens to dst (*got = 1), or leaves *got = 0 where the caller must read
   `posted` itself (never queued, or evaluated while a later post holds the block). */
typedef struct mlxs_mailbox_* mlxs_mailbox;
int mlxs_mailbox_new(mlxs_mailbox* out);
void mlxs_mailbox_free(mlxs_mailbox m);
int mlxs_mailbox_post(mlxs_array* out, uint32_t* seq, mlxs_mailbox m, const mlxs_array tokens);
int mlxs_mailbox_wait(int* got, mlxs_mailbox m, uint32_t seq, const mlxs_array posted, uint32_t* dst, size_t n);
/* The value of function `name` in the symbol table (.symtab) of the ELF file at `path`; 0 where it has none
   (elf.cpp: how jit.cpp finds MLX's device allocator for its kernels' outputs). */
int mlxs_elf_function_value(const char* path, const char* name, uint64_t* value);
/* x (M, K) or (1, M, K) @ dequantize(w)ᵀ for 1 <= M <= 7 rows as one CUDA kernel (qmm.cpp) where the default device
   is a CUDA GPU and the product suits it (affine 4- or 8-bit, group 32/64/128, 16-bit floats), else
   MLX's quantized_matmul (transposed). */
int mlxs_qmm_rows(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                  const mlxs_array biases, int group_size, int bits, const char* mode);
/* softmax(q kᵀ · scale + mask) v for a few query positions as one CUDA kernel (attention.cpp): q (B, Hq, L, D),
   k and v (B, Hkv, S, D) read through their strides, mask (null, or boolean keep / additive, broadcastable
   to (B, Hq, L, S)), causal = 1: key s seen by position l iff s <= S - L + l. Available (1) where the
   default device is a CUDA GPU and the inputs suit it; an error otherwise. */
/* mlx-lm's SwitchLinear for a few tokens: out (T, k, N), slot (t, j) = x's row for it @ dequantize(w[indices[t, j]])ᵀ,
   x (T or T * k, K), w (E, N, K * bits / 32), indices (T, k) uint32; as one CUDA kernel (qmm.cpp) where mlxs_qmm_rows'
   kernel would run, else MLX's gather_qmm. */
int mlxs_gather_qmm_rows(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                         const mlxs_array biases, const mlxs_array indices, int group_size, int bits,
                         const char* mode);
/* A mixture-of-experts router's choice as one CUDA kernel (route.cpp): logits (..., E) -> *inds (..., k) uint32 and
   *weights (..., k) in the logits' dtype. mode 0: softmax (precise), the k largest, with normalize each row's
   weights divided by their sum; mode 1: the k largest logits, then softmax over them; then each weight times
   `scale` (1: none) in the dtype. from_top = 1: in
   argpartition(g, kth=-k)[..., -k:]'s order, else argpartition(-g, kth=k-1)[..., :k]'s. Both left null where the
   kernel does not run (not a CUDA GPU, another dtype than 16/32-bit floats, more than 4096 experts or 32 chosen,
   logits not row-contiguous). */
int mlxs_moe_route(mlxs_array* inds, mlxs_array* weights, const mlxs_array logits, int k, int mode, int from_top,
                   int normalize, float scale);
/* x (M, K) or (1, M, K) @ dequantize(w)ᵀ for 8-256 rows on the tensor cores as one CUDA kernel (mma.cpp) where the
   default device is a CUDA GPU of sm_80 or later and the product suits it (affine 4-bit, group 32/64/128, K a
   multiple of 64, 16-bit floats), else MLX's quantized_matmul (transposed). */
int mlxs_qmm_mma(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                 const mlxs_array biases, int group_size, int bits, const char* mode);
/* 1 where mlxs_qmm_rows runs its kernel for products that suit it (the default device is a CUDA GPU and
   NVRTC is loaded), else 0. */
int mlxs_qmm_rows_available(void);
/* Loads the NVRTC library at `nvrtc_library` and compiles representative variants of every kernel
   jit.cpp builds (the few-row and gathered products, the residual add with the RMS norm, attention
   of a few positions, the gated-delta recurrence) for sm_<arch>, no GPU needed; *compiled: how many.
   An error names the first that fails, with NVRTC's log. */
int mlxs_jit_check(const char* nvrtc_library, const char* arch, int* compiled);
int mlxs_sdpa_few_available(const mlxs_array q, const mlxs_array k, const mlxs_array v);
int mlxs_sdpa_few(mlxs_array* out, const mlxs_array q, const mlxs_array k, const mlxs_array v, float scale,
                  const mlxs_array mask, int causal);
int mlxs_precise_swiglu(mlxs_array* out, const mlxs_array h, const mlxs_array gate, const mlxs_array x);
/* rope from position `offset`, or from offsets[b] for batch row b when `offsets` (B,) int32 is given */
int mlxs_rope(mlxs_array* out, const mlxs_array x, int dims, int traditional, int has_base, float base, float scale,
              int offset, const mlxs_array offsets, const mlxs_array freqs);
int mlxs_sdpa(mlxs_array* out, const mlxs_array q, const mlxs_array k, const mlxs_array v, float scale,
              const char* mask_mode, const mlxs_array mask, const mlxs_array sinks);

/* random */
int mlxs_random_seed(uint64_t seed);
int mlxs_random_key(mlxs_array* out, uint64_t seed);
int mlxs_random_split(mlxs_array* first, mlxs_array* second, const mlxs_array key);
int mlxs_random_categorical(mlxs_array* out, const mlxs_array logits, int axis, const mlxs_array key);
int mlxs_random_uniform(mlxs_array* out, const int32_t* shape, int ndim, int dtype, const mlxs_array key);
int mlxs_random_randint(mlxs_array* out, int64_t low, int64_t high, const int32_t* shape, int ndim, int dtype,
                        const mlxs_array key);

/* safetensors */
int mlxs_safetensors_load(mlxs_tensors* out, const char* path);
void mlxs_tensors_free(mlxs_tensors t);
size_t mlxs_tensors_len(const mlxs_tensors t);
const char* mlxs_tensors_name(const mlxs_tensors t, size_t i);
int mlxs_tensors_array(mlxs_array* out, const mlxs_tensors t, size_t i);
size_t mlxs_tensors_meta_len(const mlxs_tensors t);
const char* mlxs_tensors_meta_key(const mlxs_tensors t, size_t i);
const char* mlxs_tensors_meta_value(const mlxs_tensors t, size_t i);
int mlxs_safetensors_save(const char* path, const char* const* names, const mlxs_array* arrays, size_t n,
                          const char* const* meta_keys, const char* const* meta_values, size_t m);

/* memory */
size_t mlxs_active_memory(void);
size_t mlxs_peak_memory(void);
size_t mlxs_external_memory(void);
size_t mlxs_cache_memory(void);
void mlxs_reset_peak_memory(void);
void mlxs_clear_cache(void);
size_t mlxs_set_cache_limit(size_t limit);
size_t mlxs_set_memory_limit(size_t limit);

/* gathered (per-expert) matmuls: mx::gather_mm and mx::gather_qmm; NULL indices: none */
int mlxs_gather_mm(mlxs_array* out, const mlxs_array a, const mlxs_array b, const mlxs_array lhs_indices,
                   const mlxs_array rhs_indices, int sorted_indices);
int mlxs_gather_qmm(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                    const mlxs_array biases, const mlxs_array lhs_indices, const mlxs_array rhs_indices,
                    int transpose, int group_size, int bits, const char* mode, int sorted_indices);

/* distributed (shim/distributed.cpp): groups over a backend ("ring", "mpi", "nccl", "jaccl", "any")
 * and collectives. These report errors through mlxs_dist_last_error(), not mlxs_last_error(). */
typedef struct mlxs_group_* mlxs_group;
const char* mlxs_dist_last_error(void);
int mlxs_dist_is_available(const char* backend);
int mlxs_dist_init(mlxs_group* out, int strict, const char* backend);
void mlxs_group_free(mlxs_group g);
int mlxs_group_rank(const mlxs_group g);
int mlxs_group_size(const mlxs_group g);
int mlxs_group_split(mlxs_group* out, const mlxs_group g, int color, int key);
int mlxs_dist_all_sum(mlxs_array* out, const mlxs_array x, const mlxs_group g);
int mlxs_dist_all_gather(mlxs_array* out, const mlxs_array x, const mlxs_group g);
int mlxs_dist_send(mlxs_array* out, const mlxs_array x, int dst, const mlxs_group g);
int mlxs_dist_recv_like(mlxs_array* out, const mlxs_array like, int src, const mlxs_group g);

#ifdef __cplusplus
}
#endif
