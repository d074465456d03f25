//! Owned, page-aligned I/O buffers and the per-core pools they return to.
//!
//! An [`IoBuf`] is a page-aligned byte buffer (so it can be used for
//! `O_DIRECT` and registered with io_uring or RDMA) with a length that may be
//! less than its capacity. Dropping a pooled buffer hands it back to its
//! [`BufPool`]; the pool's free list is lock-free, so a buffer may be dropped on
//! any thread. An [`SgList`] is the scatter-gather list that travels from a
//! fabric to the core to a backend and back: it owns its segments.
//!
//! A buffer's memory can carry one [`Attachment`]: what a device made of
//! that memory, such as the memory regions an RDMA provider registered it
//! as. It lives exactly as long as the allocation: a pooled buffer takes it
//! back to the pool and on to its next user, so memory is registered once
//! for its life rather than once per transfer, and it is dropped (the
//! memory deregistered) just before the memory is freed.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use smallvec::SmallVec;

/// Alignment of every [`IoBuf`]: enough for `O_DIRECT` on 4 KiB-sector devices.
pub const BUF_ALIGN: usize = 4096;

/// The most idle memory a [`BufPool`] keeps per size class (at least four
/// buffers of the class are kept whatever their size).
pub const MAX_IDLE_BYTES_PER_CLASS: usize = 8 << 20;

/// What lives as long as a buffer's memory (see the module doc).
pub type Attachment = Box<dyn Any + Send + Sync>;

/// Raw aligned allocation. Owns `cap` bytes at `ptr`.
struct RawBuf {
    ptr: NonNull<u8>,
    cap: usize,
    /// All `cap` bytes are known to be zero: nothing has had a way to write
    /// them since they were allocated or last zeroed.
    zero: bool,
    /// Dropped before the memory is freed.
    attached: Option<Attachment>,
}

// SAFETY: RawBuf uniquely owns its heap allocation; no aliasing pointers exist.
unsafe impl Send for RawBuf {}
// SAFETY: shared references only allow reads of initialised bytes.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    fn new(cap: usize) -> RawBuf {
        let cap = cap.max(1).next_multiple_of(BUF_ALIGN);
        let layout = Self::layout(cap);
        // SAFETY: layout has a non-zero size (cap >= BUF_ALIGN).
        let ptr = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        RawBuf {
            ptr,
            cap,
            zero: true,
            attached: None,
        }
    }

    fn layout(cap: usize) -> Layout {
        match Layout::from_size_align(cap, BUF_ALIGN) {
            Ok(l) => l,
            // cap is a multiple of BUF_ALIGN and far below isize::MAX in practice.
            Err(_) => panic!("buffer of {cap} bytes cannot be laid out"),
        }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // A device registration of the memory goes before the memory does.
        drop(self.attached.take());
        // SAFETY: ptr was allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

struct PoolShared {
    /// One free list per size class: `class_size(i)` bytes, the last class
    /// being `buf_size`.
    free: Box<[ArrayQueue<RawBuf>]>,
    buf_size: usize,
}

impl PoolShared {
    /// Bytes of class `i`: BUF_ALIGN doubled `i` times, capped at buf_size.
    fn class_size(&self, i: usize) -> usize {
        BUF_ALIGN
            .checked_shl(i as u32)
            .unwrap_or(usize::MAX)
            .min(self.buf_size)
    }

    /// The smallest class holding `len` bytes.
    fn class_for(&self, len: usize) -> usize {
        let pages = len.max(1).div_ceil(BUF_ALIGN);
        let i = pages.next_power_of_two().trailing_zeros() as usize;
        i.min(self.free.len() - 1)
    }

    fn take(&self, class: usize) -> RawBuf {
        self.free[class]
            .pop()
            .unwrap_or_else(|| RawBuf::new(self.class_size(class)))
    }
}

/// A pool of equal-sized, page-aligned buffers. Cloning shares the pool.
#[derive(Clone)]
pub struct BufPool {
    shared: Arc<PoolShared>,
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("buf_size", &self.shared.buf_size)
            .field("free", &self.idle())
            .finish()
    }
}

impl BufPool {
    /// A pool of buffers of up to `buf_size` bytes. Buffers are allocated on
    /// demand and kept when returned, up to `max_free` idle ones per size
    /// class and [`MAX_IDLE_BYTES_PER_CLASS`] of each class's memory (4 KiB,
    /// 8 KiB, ... doubling up to `buf_size`); more are freed. A 4 KiB command
    /// then holds 4 KiB, not `buf_size`, which keeps the memory of a deep
    /// queue of small I/Os small.
    pub fn new(buf_size: usize, max_free: usize) -> BufPool {
        let buf_size = buf_size.max(1).next_multiple_of(BUF_ALIGN);
        let pages = buf_size / BUF_ALIGN;
        let classes = pages.next_power_of_two().trailing_zeros() as usize + 1;
        // Idle memory is bounded per class too, so that a burst of large
        // buffers is given back to the allocator once it has passed.
        let free = (0..classes)
            .map(|i| {
                let size = BUF_ALIGN
                    .checked_shl(i as u32)
                    .unwrap_or(usize::MAX)
                    .min(buf_size);
                let by_bytes = (MAX_IDLE_BYTES_PER_CLASS / size).max(4);
                ArrayQueue::new(max_free.min(by_bytes).max(1))
            })
            .collect();
        BufPool {
            shared: Arc::new(PoolShared { free, buf_size }),
        }
    }

    /// Size of each buffer of this pool.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    /// Idle buffers currently held.
    pub fn idle(&self) -> usize {
        self.shared.free.iter().map(ArrayQueue::len).sum()
    }

    /// A buffer of the pool's size with length `len` (clamped to the size).
    /// The contents are whatever the previous user left there.
    pub fn get(&self, len: usize) -> IoBuf {
        let raw = self.shared.take(self.shared.free.len() - 1);
        IoBuf {
            raw: Some(raw),
            len: len.min(self.shared.buf_size),
            pool: Some(self.shared.clone()),
        }
    }

    /// An [`SgList`] of `len` bytes made of this pool's buffers: full-size
    /// buffers, then the smallest class that holds the rest.
    pub fn sg(&self, len: usize) -> SgList {
        let mut sg = SgList::new();
        let mut left = len;
        while left > 0 {
            let n = left.min(self.shared.buf_size);
            let raw = self.shared.take(self.shared.class_for(n));
            sg.push(IoBuf {
                raw: Some(raw),
                len: n,
                pool: Some(self.shared.clone()),
            });
            left -= n;
        }
        sg
    }
}

/// An owned, page-aligned byte buffer. Derefs to its first `len` bytes.
pub struct IoBuf {
    raw: Option<RawBuf>,
    len: usize,
    pool: Option<Arc<PoolShared>>,
}

impl IoBuf {
    /// A fresh zeroed buffer of `len` bytes that belongs to no pool.
    pub fn new(len: usize) -> IoBuf {
        IoBuf {
            raw: Some(RawBuf::new(len)),
            len,
            pool: None,
        }
    }

    /// A buffer holding a copy of `data` (for control-path payloads).
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::new(data.len());
        b.copy_from_slice(data);
        b
    }

    /// Bytes available in the allocation.
    pub fn capacity(&self) -> usize {
        self.raw.as_ref().map_or(0, |r| r.cap)
    }

    /// Sets the visible length; clamped to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// Pointer to the first byte, for registering with io_uring or RDMA.
    pub fn as_ptr(&self) -> *const u8 {
        self.raw
            .as_ref()
            .map_or(NonNull::dangling().as_ptr(), |r| r.ptr.as_ptr())
    }

    /// Mutable pointer to the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.raw {
            Some(r) => {
                r.zero = false;
                r.ptr.as_ptr()
            }
            None => NonNull::dangling().as_ptr(),
        }
    }

    /// The attachment of this buffer's memory, if it is a `T`.
    pub fn attachment<T: Any>(&self) -> Option<&T> {
        self.raw.as_ref()?.attached.as_ref()?.downcast_ref()
    }

    /// The attachment of this buffer's memory as a `T`, made by `init` when
    /// there is none or it is of another type (which is dropped first).
    /// `None` only for a buffer without memory.
    pub fn attachment_or_insert_with<T: Any + Send + Sync>(
        &mut self,
        init: impl FnOnce() -> T,
    ) -> Option<&mut T> {
        let raw = self.raw.as_mut()?;
        if !raw.attached.as_ref().is_some_and(|a| a.is::<T>()) {
            raw.attached = None;
            raw.attached = Some(Box::new(init()));
        }
        raw.attached.as_mut()?.downcast_mut()
    }

    /// Zeroes the visible bytes. A buffer nothing has written since it was
    /// allocated or last zeroed whole (pool buffers that carried zeroes
    /// before, the common case for reads of unwritten storage) is left as
    /// it is.
    pub fn fill_zero(&mut self) {
        let Some(r) = &mut self.raw else {
            return;
        };
        if r.zero {
            return;
        }
        let whole = self.len == r.cap;
        // SAFETY: as in `deref_mut`.
        unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr(), self.len) }.fill(0);
        r.zero = whole;
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.raw {
            // SAFETY: ptr is valid for cap >= len initialised (zeroed at
            // allocation) bytes, uniquely owned by self, and lives as long as self.
            Some(r) => unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), self.len) },
            None => &[],
        }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.raw {
            Some(r) => {
                r.zero = false;
                // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
                unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr(), self.len) }
            }
            None => &mut [],
        }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let (Some(raw), Some(pool)) = (self.raw.take(), self.pool.take()) {
            let class = pool.class_for(raw.cap);
            if pool.class_size(class) == raw.cap {
                // A full free list simply frees the buffer.
                let _ = pool.free[class].push(raw);
            }
        }
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IoBuf(len={}, cap={})", self.len, self.capacity())
    }
}

/// A scatter-gather list of owned buffers; its length is the sum of the
/// segments' lengths.
#[derive(Default)]
pub struct SgList {
    segs: SmallVec<[IoBuf; 1]>,
}

impl fmt::Debug for SgList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SgList(len={}, segs={})", self.len(), self.segs.len())
    }
}

impl From<IoBuf> for SgList {
    fn from(b: IoBuf) -> SgList {
        let mut sg = SgList::new();
        sg.push(b);
        sg
    }
}

impl SgList {
    /// An empty list.
    pub fn new() -> SgList {
        SgList {
            segs: SmallVec::new(),
        }
    }

    /// A list of one unpooled buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> SgList {
        IoBuf::new(len).into()
    }

    /// Appends a segment.
    pub fn push(&mut self, b: IoBuf) {
        self.segs.push(b);
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.segs.iter().map(|s| s.len()).sum()
    }

    /// True when the list holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments.
    pub fn segments(&self) -> &[IoBuf] {
        &self.segs
    }

    /// The segments, mutably.
    pub fn segments_mut(&mut self) -> &mut [IoBuf] {
        &mut self.segs
    }

    /// Copies `src` into the list starting at byte `offset`. Returns the number
    /// of bytes copied (less than `src.len()` only if the list is too short).
    pub fn copy_in(&mut self, offset: usize, src: &[u8]) -> usize {
        let mut skip = offset;
        let mut done = 0;
        for seg in self.segs.iter_mut() {
            if done == src.len() {
                break;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                continue;
            }
            let n = (seg.len() - skip).min(src.len() - done);
            seg[skip..skip + n].copy_from_slice(&src[done..done + n]);
            done += n;
            skip = 0;
        }
        done
    }

    /// Copies bytes starting at `offset` into `dst`. Returns the number copied.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> usize {
        let mut skip = offset;
        let mut done = 0;
        for seg in self.segs.iter() {
            if done == dst.len() {
                break;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                continue;
            }
            let n = (seg.len() - skip).min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&seg[skip..skip + n]);
            done += n;
            skip = 0;
        }
        done
    }

    /// The byte ranges covering `[offset, offset+len)`, as slices, in order.
    pub fn slices(&self, offset: usize, len: usize) -> impl Iterator<Item = &[u8]> {
        let mut skip = offset;
        let mut left = len;
        self.segs.iter().filter_map(move |seg| {
            if left == 0 {
                return None;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                return None;
            }
            let n = (seg.len() - skip).min(left);
            let s = &seg[skip..skip + n];
            skip = 0;
            left -= n;
            Some(s)
        })
    }

    /// Shortens the list to `len` bytes (trailing segments are dropped).
    pub fn truncate(&mut self, len: usize) {
        let mut left = len;
        let mut keep = 0;
        for seg in self.segs.iter_mut() {
            if left == 0 {
                break;
            }
            let n = seg.len().min(left);
            seg.set_len(n);
            left -= n;
            keep += 1;
        }
        self.segs.truncate(keep);
    }

    /// Copies the whole list into one `Vec` (control path and tests only).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.copy_out(0, &mut v);
        v
    }
}

/// Hands the allocator's free memory back to the kernel (glibc's
/// `malloc_trim`): buffers freed after a burst otherwise stay in the
/// process's heaps, counted in its RSS. True if anything was released.
/// Costs a walk over the heaps; the daemon calls it when a burst of
/// buffer memory has passed, not per buffer.
pub fn release_free_memory() -> bool {
    // SAFETY: malloc_trim only touches the allocator's own free lists.
    unsafe { libc::malloc_trim(0) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_pooled() {
        let pool = BufPool::new(8192, 4);
        let b = pool.get(100);
        assert_eq!(b.len(), 100);
        assert_eq!(b.as_ptr() as usize % BUF_ALIGN, 0);
        drop(b);
        assert_eq!(pool.idle(), 1);
        let _b2 = pool.get(8192);
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn fill_zero_after_any_write() {
        let pool = BufPool::new(8192, 4);
        // Written through a slice, returned, reused: zeroed again.
        let mut b = pool.get(8192);
        b[17] = 9;
        drop(b);
        let mut b = pool.get(8192);
        assert_eq!(b[17], 9);
        b.fill_zero();
        assert!(b.iter().all(|&x| x == 0));
        // Written through the raw pointer (how the kernel and RDMA write).
        let p = b.as_mut_ptr();
        // SAFETY: p points at 8192 bytes owned by b.
        unsafe { p.add(4000).write(5) };
        b.fill_zero();
        assert_eq!(b[4000], 0);
        // Zeroing a prefix does not make the rest known zero.
        b[8000] = 1;
        b.set_len(4096);
        b.fill_zero();
        b.set_len(8192);
        assert_eq!(b[8000], 1);
        b.fill_zero();
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn sg_copy_round_trip() {
        let pool = BufPool::new(4096, 8);
        let mut sg = pool.sg(10000);
        assert_eq!(sg.segments().len(), 3);
        let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        assert_eq!(sg.copy_in(3000, &data), 6000);
        let mut out = vec![0u8; 6000];
        assert_eq!(sg.copy_out(3000, &mut out), 6000);
        assert_eq!(out, data);
        let joined: Vec<u8> = sg.slices(3000, 6000).flatten().copied().collect();
        assert_eq!(joined, data);
        sg.truncate(5000);
        assert_eq!(sg.len(), 5000);
        assert_eq!(sg.segments().len(), 2);
    }

    #[test]
    fn small_lists_use_small_classes() {
        let pool = BufPool::new(256 * 1024, 4);
        let sg = pool.sg(4096);
        assert_eq!(sg.segments()[0].capacity(), 4096);
        let sg2 = pool.sg(300 * 1024);
        let caps: Vec<usize> = sg2.segments().iter().map(IoBuf::capacity).collect();
        assert_eq!(caps, vec![256 * 1024, 64 * 1024]);
        drop(sg);
        drop(sg2);
        assert_eq!(pool.idle(), 3);
        // A returned 4 KiB buffer is reused for the next 4 KiB list.
        let again = pool.sg(100);
        assert_eq!(again.segments()[0].capacity(), 4096);
        assert_eq!(pool.idle(), 2);
        // get() still hands out full-size buffers.
        assert_eq!(pool.get(10).capacity(), 256 * 1024);
    }

    #[test]
    fn attachments_follow_the_memory_through_the_pool() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DROPPED: AtomicUsize = AtomicUsize::new(0);
        struct Reg(u32);
        impl Drop for Reg {
            fn drop(&mut self) {
                DROPPED.fetch_add(1, Ordering::SeqCst);
            }
        }
        let pool = BufPool::new(4096, 1);
        let mut b = pool.get(4096);
        assert!(b.attachment::<Reg>().is_none());
        let mut made = 0;
        b.attachment_or_insert_with(|| {
            made += 1;
            Reg(7)
        });
        let ptr = b.as_ptr();
        drop(b);
        // Back from the pool: the same memory, still attached.
        let mut b = pool.get(100);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(b.attachment::<Reg>().map(|r| r.0), Some(7));
        b.attachment_or_insert_with(|| {
            made += 1;
            Reg(8)
        });
        assert_eq!(made, 1, "an existing attachment is reused");
        assert_eq!(DROPPED.load(Ordering::SeqCst), 0);
        // A second buffer does not fit the pool's free list (max_free 1):
        // its memory is freed on drop, and its attachment dropped with it.
        let mut c = pool.get(10);
        c.attachment_or_insert_with(|| Reg(9));
        drop(b);
        drop(c);
        assert_eq!(DROPPED.load(Ordering::SeqCst), 1);
        drop(pool);
        assert_eq!(DROPPED.load(Ordering::SeqCst), 2, "the pool frees the rest");
        // Unpooled memory drops its attachment with the buffer.
        let mut u = IoBuf::new(10);
        u.attachment_or_insert_with(|| Reg(1));
        drop(u);
        assert_eq!(DROPPED.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn odd_pool_size_is_its_own_last_class() {
        let pool = BufPool::new(12 * 1024, 2);
        let sg = pool.sg(20 * 1024);
        let caps: Vec<usize> = sg.segments().iter().map(IoBuf::capacity).collect();
        assert_eq!(caps, vec![12 * 1024, 8 * 1024]);
        drop(sg);
        assert_eq!(pool.idle(), 2);
    }
}
