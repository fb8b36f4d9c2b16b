//! Files mapped into memory read-only, and MLX arrays over their bytes without a copy: the
//! zero-copy half of safetensors loading (the `checkpoint` crate parses the header, in safe code),
//! and [`read_at`] for the tensors a mapping cannot hand over.
//!
//! A [`Mapping`] is the whole file, mapped private and read-only; each array made from it holds an
//! `Arc` of it through MLX's deleter, so the file stays mapped while any array uses its bytes and is
//! unmapped when the last one goes (on whichever thread drops it). The bytes are never written:
//! MLX never donates a buffer it does not own to an operation's output. A file that is truncated
//! or rewritten in place while mapped is undefined behaviour for any mmap reader (SIGBUS at worst):
//! mlx-gen itself replaces model folders by renaming a new one into place, which leaves a mapped
//! file intact.
use crate::{ffi, Handle, Result};
use std::ffi::{c_int, c_void};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// One file mapped read-only into memory (private: never written back).
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and never mutated; its address stays valid until Drop, which
// runs once, after the last Arc (held by arrays on any thread) goes.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the whole of `path` (an empty file gives an empty mapping).
    pub fn open(path: &Path) -> std::io::Result<Arc<Mapping>> {
        let file = File::open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("file larger than the address space"))?;
        if len == 0 {
            return Ok(Arc::new(Mapping { ptr: NonNull::dangling(), len: 0 }));
        }
        // SAFETY: a fresh private read-only mapping of an open file descriptor; the result is
        // checked against MAP_FAILED. The descriptor may close afterwards: the mapping stays.
        let p = unsafe {
            libc::mmap(ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Arc::new(Mapping { ptr, len }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` readable bytes at `ptr` for as long as `self` lives; nothing writes them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `open`, unmapped once; no array uses it any more (each
            // holds an Arc of `self`).
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

unsafe extern "C" fn release_mapping(owner: *mut c_void) {
    // SAFETY: `owner` is the Box made in `from_mapping`, released exactly once by MLX's deleter.
    drop(unsafe { Box::from_raw(owner.cast::<Arc<Mapping>>()) });
}

/// An array over the bytes `offset..offset + bytes` of `map`, row-major `shape` of `dtype`
/// (`itemsize` bytes each), and whether MLX uses them in place (true on the CPU backend and where
/// the backend's allocator can wrap host memory; false where it copied them once). The range must
/// lie inside the mapping, past its first 8 bytes, and start on an element boundary (MLX's kernels
/// read elements in place); anything else is an error, so that no pointer leaves the mapping.
pub fn from_mapping(map: &Arc<Mapping>, offset: usize, shape: &[i32], dtype: i32, itemsize: usize) -> Result<(Handle, bool)> {
    let bytes = byte_len(shape, itemsize)?;
    let end = offset.checked_add(bytes).ok_or("tensor range overflows")?;
    if offset < 8 || end > map.len() {
        return Err(format!("bytes {offset}..{end} are outside the mapped file's {} bytes (past its first 8)", map.len()));
    }
    let addr = map.ptr.as_ptr() as usize + offset;
    if itemsize > 0 && !addr.is_multiple_of(itemsize) {
        return Err(format!("data at offset {offset} is not aligned to its {itemsize}-byte elements"));
    }
    let owner = Box::into_raw(Box::new(Arc::clone(map))).cast::<c_void>();
    let mut zero_copy: c_int = 0;
    // SAFETY: `offset..end` (and the 8 bytes before it) lie inside the live mapping checked above,
    // aligned to the element size; `owner` keeps the mapping alive until MLX calls `release_mapping`
    // on it, once. The data pointer is `*mut` only because MLX's constructor takes one: it is never
    // written through.
    let h = crate::make(|o| unsafe {
        ffi::mlxs_array_from_external(
            o,
            map.ptr.as_ptr().add(offset).cast(),
            bytes,
            shape.as_ptr(),
            crate::len_i32(shape.len()),
            dtype,
            owner,
            release_mapping,
            &mut zero_copy,
        )
    })?;
    Ok((h, zero_copy != 0))
}

/// One tensor's place in a mapping, for [`from_mapping_many`]: as [`from_mapping`]'s arguments.
pub struct MappedRange<'a> {
    pub offset: usize,
    pub shape: &'a [i32],
    pub dtype: i32,
    pub itemsize: usize,
}

/// A fresh array handle moved from the thread that made it to the caller's.
struct Made(Handle);

// SAFETY: the handle is the only owner of a new MLX array (a reference-counted descriptor whose
// count is atomic), made on a worker thread and handed over once; no other thread touches it.
unsafe impl Send for Made {}

/// [`from_mapping`] for many tensors of one mapping, made on up to `threads` threads at once, the
/// results in `ranges`' order. Where the backend copies the bytes (CUDA) each array's construction
/// reads the mapped pages and writes memory the device sees; one thread does that at a fraction of
/// the host's bandwidth (a 19.5 GB checkpoint: 17-21 s on an H100 host where MLX's own reader,
/// which reads a file on several threads, took 7). Where MLX uses the bytes in place it is cheap
/// either way.
pub fn from_mapping_many(map: &Arc<Mapping>, ranges: &[MappedRange<'_>], threads: usize) -> Vec<Result<(Handle, bool)>> {
    on_threads(ranges.len(), threads, |i| {
        let r = &ranges[i];
        from_mapping(map, r.offset, r.shape, r.dtype, r.itemsize)
    })
}

/// One tensor's place in a file, for [`read_many`]: as [`read_at`]'s arguments.
pub struct FileRange<'a> {
    pub offset: u64,
    pub shape: &'a [i32],
    pub dtype: i32,
}

/// [`read_at`] for many tensors of one file, read on up to `threads` threads at once, the results
/// in `ranges`' order: the tensors of a file MLX wrote (its header unpadded, so no tensor starts on
/// an element boundary and none can be used in place) read in parallel, as MLX's own reader does.
pub fn read_many(file: &File, ranges: &[FileRange<'_>], threads: usize) -> Vec<Result<Handle>> {
    let made = on_threads(ranges.len(), threads, |i| {
        let r = &ranges[i];
        read_at(file, r.offset, r.shape, r.dtype).map(|h| (h, false))
    });
    made.into_iter().map(|r| r.map(|(h, _)| h)).collect()
}

/// `make(i)` for every i below `n` on up to `threads` threads, the results in order.
fn on_threads(n: usize, threads: usize, make: impl Fn(usize) -> Result<(Handle, bool)> + Sync) -> Vec<Result<(Handle, bool)>> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        return (0..n).map(make).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut made: Vec<(usize, Result<(Made, bool)>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut got = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            break got;
                        }
                        got.push((i, make(i).map(|(h, flag)| (Made(h), flag))));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    made.sort_unstable_by_key(|(i, _)| *i);
    made.into_iter().map(|(_, r)| r.map(|(Made(h), flag)| (h, flag))).collect()
}

/// Bytes of `shape` elements of `itemsize` bytes, checked for overflow and negative dimensions.
fn byte_len(shape: &[i32], itemsize: usize) -> Result<usize> {
    let mut n: usize = itemsize;
    for &d in shape {
        let d = usize::try_from(d).map_err(|_| format!("negative dimension in shape {shape:?}"))?;
        n = n.checked_mul(d).ok_or_else(|| format!("shape {shape:?} overflows"))?;
    }
    Ok(n)
}

/// An array of `shape` elements of `dtype` read from `file` at `offset` (`pread`) straight into a
/// buffer of MLX's allocator, which it then uses as it is on every backend: one copy, for data a
/// mapping cannot hand over (not on an element boundary). The caller has checked that the range
/// lies inside the file; a short read is an error.
pub fn read_at(file: &File, offset: u64, shape: &[i32], dtype: i32) -> Result<Handle> {
    // SAFETY: `shape` outlives the call; the descriptor is open for as long as `file` is borrowed.
    crate::make(|o| unsafe { ffi::mlxs_array_read_file(o, file.as_raw_fd(), offset, shape.as_ptr(), crate::len_i32(shape.len()), dtype) })
}
