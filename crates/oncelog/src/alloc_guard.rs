//! A global allocator that keeps a hostile length field from aborting the
//! broker.
//!
//! The wire codec pre-sizes a decoded array from its declared element count
//! before it knows whether the frame holds that many elements. A 30-byte
//! request claiming two billion topics therefore asks for hundreds of
//! gigabytes; the system allocator refuses, and Rust aborts the process.
//! No legitimate allocation in oncelog comes near [`HUGE`] (frames are capped
//! at `socket.request.max.bytes`), so requests at or above it are served from
//! an anonymous `MAP_NORESERVE` mapping: address space only, no memory is
//! committed until touched, and the decoder fails on the short frame long
//! before it touches more than the frame's own size. Everything else goes to
//! the system allocator unchanged.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of this size or more are mapped lazily.
const HUGE: usize = 1 << 32;

pub struct Guard;

unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= HUGE && layout.align() <= 4096 {
            // SAFETY: an anonymous private mapping has no preconditions; a
            // failed mapping is reported as null, as GlobalAlloc requires.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    layout.size(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return std::ptr::null_mut();
            }
            return p as *mut u8;
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= HUGE && layout.align() <= 4096 {
            // SAFETY: anonymous mappings are zero-filled.
            return unsafe { self.alloc(layout) };
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= HUGE && layout.align() <= 4096 {
            // SAFETY: `ptr` came from the mmap above with this same size,
            // because alloc routed by the same layout.
            unsafe {
                libc::munmap(ptr as *mut libc::c_void, layout.size());
            }
            return;
        }
        // SAFETY: `ptr` came from System with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Keeps glibc malloc from returning request-sized buffers to the kernel
/// after every request.
///
/// A produce frame is about a megabyte. glibc serves that from a fresh
/// `mmap` (or trims it back off the heap top) and the next frame faults the
/// same amount in again, page by page, zeroed: under a produce load that was
/// about a third of the broker's CPU. Raising the mmap and trim thresholds
/// keeps such buffers in the heap for reuse; memory stays bounded by the
/// connections' in-flight requests. `MALLOC_MMAP_THRESHOLD_` /
/// `MALLOC_TRIM_THRESHOLD_` in the environment still win.
pub fn keep_request_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        const TRIM_THRESHOLD: libc::c_int = 128 << 20;
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: mallopt only adjusts allocator parameters; it is
            // called before the runtime starts its threads.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        }
        if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none() {
            // SAFETY: as above.
            unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) };
        }
    }
}
