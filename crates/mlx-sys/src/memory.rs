//! MLX's memory figures (active, peak, cached, and the bytes it uses in place outside its allocator)
//! and limits, and the host heap's trim after a load.

use crate::ffi;

pub fn active_memory() -> usize {
    unsafe { ffi::mlxs_active_memory() }
}
pub fn peak_memory() -> usize {
    unsafe { ffi::mlxs_peak_memory() }
}
/// Bytes MLX uses in place outside its allocator (mapped weights, host buffers), not in its figures.
pub fn external_memory() -> usize {
    unsafe { ffi::mlxs_external_memory() }
}
pub fn cache_memory() -> usize {
    unsafe { ffi::mlxs_cache_memory() }
}
pub fn reset_peak_memory() {
    unsafe { ffi::mlxs_reset_peak_memory() }
}
pub fn clear_cache() {
    unsafe { ffi::mlxs_clear_cache() }
}
/// Hands the C heap's free memory back to the OS (glibc's `malloc_trim`, every arena; a no-op
/// elsewhere): after a load whose temporary allocations (a tokenizer's parse, on another thread)
/// would otherwise stay resident.
pub fn trim_host_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}
pub fn set_cache_limit(limit: usize) -> usize {
    unsafe { ffi::mlxs_set_cache_limit(limit) }
}
pub fn set_memory_limit(limit: usize) -> usize {
    unsafe { ffi::mlxs_set_memory_limit(limit) }
}
