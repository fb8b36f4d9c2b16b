//! The MLX runtime: version, devices and the memory allocator's counters.
use crate::error::{ctx, Error, Result};

/// MLX's version, e.g. `0.32.4`.
pub fn mlx_version() -> String {
    mlx_sys::version()
}

/// The MLX package this binary was built against: `cpu`, `cuda` or `metal`.
pub fn build_backend() -> &'static str {
    mlx_sys::BUILD_BACKEND
}

/// Where the linked `libmlx` was found at build time.
pub fn build_lib_dir() -> &'static str {
    mlx_sys::BUILD_LIB_DIR
}

/// The BLAS behind MLX's float32 matrix products on the CPU (see mlx-sys's build script).
pub fn build_blas() -> &'static str {
    mlx_sys::BUILD_BLAS
}

/// Whether MLX has a GPU (Metal or CUDA) device here.
pub fn gpu_available() -> bool {
    mlx_sys::gpu_available()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

/// Makes `device` the default for every following operation.
#[track_caller]
pub fn set_default_device(device: Device) -> Result<()> {
    if device == Device::Gpu && !gpu_available() {
        return Err(Error::new(
            "set device",
            format!("no GPU is available to MLX here (this build uses the {} backend)", build_backend()),
        ));
    }
    ctx("set device", mlx_sys::set_default_device(device == Device::Gpu))
}

/// The device following operations run on by default.
pub fn default_device() -> Device {
    if mlx_sys::default_device_is_gpu() {
        Device::Gpu
    } else {
        Device::Cpu
    }
}

/// Sends all following work to a new stream of the default device, as mlx-lm's generation stream.
#[track_caller]
pub fn use_new_stream() -> Result<()> {
    ctx("new stream", mlx_sys::new_default_stream())
}

/// Waits for all queued work of the default stream (e.g. a step queued ahead and never read).
#[track_caller]
pub fn synchronize() -> Result<()> {
    ctx("synchronize", mlx_sys::synchronize())
}

/// The name of the current default device as MLX reports it.
#[track_caller]
pub fn device_name() -> Result<String> {
    ctx("device name", mlx_sys::device_name())
}

pub fn active_memory() -> usize {
    mlx_sys::active_memory()
}

/// MLX's peak since the last reset plus the bytes it uses in place outside its allocator now
/// (weights in mapped files, on the CPU backend): the figure mlx-lm's would be, where `mx.load`
/// copies every weight into MLX's allocator.
pub fn peak_memory() -> usize {
    mlx_sys::peak_memory() + mlx_sys::external_memory()
}

/// Bytes MLX uses in place outside its allocator: weights in mapped files, host buffers.
pub fn external_memory() -> usize {
    mlx_sys::external_memory()
}

pub fn cache_memory() -> usize {
    mlx_sys::cache_memory()
}

pub fn reset_peak_memory() {
    mlx_sys::reset_peak_memory()
}

/// Releases MLX's cached buffers (`mx.clear_cache`).
pub fn clear_cache() {
    mlx_sys::clear_cache()
}

/// Returns the host heap's free memory to the OS (glibc; a no-op elsewhere), e.g. after loading.
pub fn trim_host_heap() {
    mlx_sys::trim_host_heap()
}

pub fn set_cache_limit(bytes: usize) -> usize {
    mlx_sys::set_cache_limit(bytes)
}

pub fn set_memory_limit(bytes: usize) -> usize {
    mlx_sys::set_memory_limit(bytes)
}

/// Sets environment variable `name`, one MLX reads, to `value` unless the user set it; call it
/// before the first evaluation (MLX reads its tuning variables once).
pub fn set_env_default(name: &str, value: &str) -> Result<()> {
    ctx("setenv", mlx_sys::setenv_default(name, value))
}
