//! The `verbs` provider: libibverbs and librdmacm, opened at run time.
//!
//! The C interface is declared by this crate (the private module `sys`,
//! `verbs/sys.rs`: only the types, constants and entry points used here)
//! and the two libraries are opened with `dlopen` the first time the
//! provider is used, so building needs nothing beyond Rust and the binary
//! links neither. On a host without rdma-core [`devices`],
//! [`Context::open`], [`Context::cm_devices`] and [`VerbsListener::bind`]
//! return [`RdmaError::LibraryMissing`] naming the library (or
//! [`RdmaError::SymbolMissing`] for one too old); the daemon logs that the
//! RDMA fabrics are idle and why, and serves its other fabrics.
//!
//! Thin but real: device discovery and port queries, protection domains,
//! memory registration ([`VerbsPd::reg_sg`]), completion queues with a
//! completion channel whose fd a reactor sleeps on ([`VerbsCq`]), RC queue
//! pairs created on RDMA CM ids ([`VerbsQp`]) with SEND/RECV and RDMA
//! READ/WRITE posting, shared receive queues ([`VerbsSrq`]), and the
//! connection manager: [`VerbsListener`] (listen, connect requests with
//! private data, accept, reject) and [`VerbsQp::connect`].
//!
//! On a machine with rdma-core but without an RDMA device (or without the
//! kernel's RDMA modules) [`devices`] returns an empty list; the daemon then
//! logs `RDMA fabrics idle: no RDMA device found`
//! ([`crate::log_idle_if_empty`]). Only those paths run on this project's
//! build machines and in CI;
//! everything past it has run on soft-RoCE (`rdma_rxe`) in the kernel lab,
//! where the tests that need a device (they skip without one) pass and the
//! Linux SRP initiator logs in to ferrited through it.
//!
//! Queue pairs are made through RDMA CM, whose device contexts are its own:
//! allocate PDs and CQs on [`Context::cm_devices`] (or
//! [`VerbsConnRequest::context`]); a PD from another context is refused.
//!
//! Memory handed to the HCA: a [`VerbsMr`] owns the `SgList` it registered,
//! so the memory outlives the registration; its bytes are read and written
//! through the region ([`MemoryRegion::read_at`], [`MemoryRegion::write_at`])
//! only while no work request that targets it is outstanding, which is the
//! fabric driver's rule (as with any DMA). The data path maps buffers with
//! [`VerbsPd::map_sg`] instead: the memory region is kept on the buffer's
//! memory (its `ferrite_reactor::buf::Attachment`) and dropped just before
//! that memory is freed, so a pool buffer is registered once for its life,
//! not once per transfer.

use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferrite_reactor::buf::SgList;
use smallvec::SmallVec;

mod sys;

use crate::{
    Access, CompletionQueue, ConnEvent, MemoryRegion, MrSeg, PostError, ProtectionDomain, QpState,
    QueuePair, RdmaError, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

/// `ibv_reg_mr` calls this process has made (every registration, data
/// path and rings alike).
static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);

/// How many memory registrations (`ibv_reg_mr`) this process has made: the
/// data path's stays flat once its pool buffers have been seen
/// ([`VerbsPd::map_sg`]).
pub fn memory_registrations() -> u64 {
    REGISTRATIONS.load(Ordering::Relaxed)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn verr(call: &'static str) -> RdmaError {
    RdmaError::Verbs {
        call,
        errno: errno(),
    }
}

/// Sets `O_NONBLOCK` on a provider fd (completion or CM event channel).
fn set_nonblocking(fd: RawFd) -> Result<(), RdmaError> {
    // SAFETY: fcntl on an fd the provider gave us; F_GETFL takes no pointer.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(verr("fcntl"));
    }
    // SAFETY: as above; F_SETFL takes an integer argument.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(verr("fcntl"));
    }
    Ok(())
}

/// What [`devices`] reports about one HCA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    /// Node GUID (host order).
    pub guid: u64,
    pub ports: u8,
}

/// Lists the RDMA devices. An empty list when there are none, including
/// when the kernel has no RDMA support.
pub fn devices() -> Result<Vec<DeviceInfo>, RdmaError> {
    let lib = sys::lib()?;
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned list is freed below.
    let list = unsafe { (lib.ibv_get_device_list)(&mut n) };
    if list.is_null() {
        // ENOSYS and friends: no RDMA support at all. Nothing to drive.
        tracing::debug!(errno = errno(), "ibv_get_device_list returned no list");
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a live device of the list; the name is a
        // NUL-terminated string owned by the library.
        let name = unsafe { CStr::from_ptr((lib.ibv_get_device_name)(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `dev` is a live device of the list.
        let guid = u64::from_be(unsafe { (lib.ibv_get_device_guid)(dev) });
        let ports = match Context::open_raw(lib, dev) {
            Ok(ctx) => ctx.port_count().unwrap_or(0),
            Err(_) => 0,
        };
        out.push(DeviceInfo { name, guid, ports });
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { (lib.ibv_free_device_list)(list) };
    Ok(out)
}

/// An open device (`ibv_context`).
pub struct Context {
    ctx: *mut sys::ibv_context,
    /// Opened by us (closed on drop) or borrowed from a CM id.
    owned: bool,
    lib: &'static sys::Lib,
}

// SAFETY: ibv_context is thread-safe in libibverbs; the pointer is only
// closed in Drop.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "verbs::Context({:p})", self.ctx)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: opened by ibv_open_device and closed exactly once.
            unsafe { (self.lib.ibv_close_device)(self.ctx) };
        }
    }
}

/// A port's state, as `ibv_query_port` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// `IBV_PORT_*` state (4 = ACTIVE).
    pub state: u32,
    pub lid: u16,
    /// `IBV_LINK_LAYER_*` (1 = InfiniBand, 2 = Ethernet).
    pub link_layer: u8,
    pub max_msg_sz: u32,
}

impl Context {
    fn open_raw(lib: &'static sys::Lib, dev: *mut sys::ibv_device) -> Result<Context, RdmaError> {
        // SAFETY: `dev` is a live device pointer from the device list.
        let ctx = unsafe { (lib.ibv_open_device)(dev) };
        if ctx.is_null() {
            return Err(verr("ibv_open_device"));
        }
        Ok(Context {
            ctx,
            owned: true,
            lib,
        })
    }

    /// Opens the device called `name`.
    pub fn open(name: &str) -> Result<Arc<Context>, RdmaError> {
        let lib = sys::lib()?;
        let mut n: libc::c_int = 0;
        // SAFETY: valid out-pointer; list freed below.
        let list = unsafe { (lib.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            return Err(verr("ibv_get_device_list"));
        }
        let mut found = Err(RdmaError::Verbs {
            call: "ibv_open_device",
            errno: libc::ENODEV,
        });
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: as in `devices`.
            let dn = unsafe { CStr::from_ptr((lib.ibv_get_device_name)(dev)) };
            if dn.to_bytes() == name.as_bytes() {
                found = Context::open_raw(lib, dev);
                break;
            }
        }
        // SAFETY: freed once; opened contexts stay valid after the list goes.
        unsafe { (lib.ibv_free_device_list)(list) };
        found.map(Arc::new)
    }

    /// The device contexts the connection manager uses. A PD for queue
    /// pairs made through RDMA CM ([`VerbsQp::for_request`],
    /// [`VerbsQp::connect`]) must come from one of these (or from
    /// [`VerbsConnRequest::context`]), not from [`Context::open`], which
    /// opens a context of its own.
    pub fn cm_devices() -> Result<Vec<Arc<Context>>, RdmaError> {
        let lib = sys::lib()?;
        let mut n: libc::c_int = 0;
        // SAFETY: valid out-pointer; the list is freed below, the contexts
        // stay open (librdmacm owns them until it is unloaded).
        let list = unsafe { (lib.rdma_get_devices)(&mut n) };
        if list.is_null() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` context pointers.
            let ctx = unsafe { *list.add(i) };
            if ctx.is_null() {
                break;
            }
            out.push(Arc::new(Context {
                ctx,
                owned: false,
                lib,
            }));
        }
        // SAFETY: freed once; the contexts themselves stay open.
        unsafe { (lib.rdma_free_devices)(list) };
        Ok(out)
    }

    /// The device's name (`mlx5_0`): what a configuration names it by.
    pub fn name(&self) -> String {
        // SAFETY: a live context's `device` points to its device, whose
        // name is a NUL-terminated string owned by the library.
        unsafe { CStr::from_ptr((self.lib.ibv_get_device_name)((*self.ctx).device)) }
            .to_string_lossy()
            .into_owned()
    }

    fn port_count(&self) -> Result<u8, RdmaError> {
        // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context and a valid out-pointer.
        if unsafe { (self.lib.ibv_query_device)(self.ctx, &mut attr) } != 0 {
            return Err(verr("ibv_query_device"));
        }
        Ok(attr.phys_port_cnt)
    }

    /// Queries port `port` (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortInfo, RdmaError> {
        // SAFETY: plain data; all-zero is valid.
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context and a valid, zeroed out-pointer of the full
        // size (the library fills its first 48 bytes, which hold every
        // field read below).
        if unsafe { (self.lib.ibv_query_port)(self.ctx, port, &mut attr) } != 0 {
            return Err(verr("ibv_query_port"));
        }
        Ok(PortInfo {
            state: attr.state,
            lid: attr.lid,
            link_layer: attr.link_layer,
            max_msg_sz: attr.max_msg_sz,
        })
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<VerbsPd, RdmaError> {
        // SAFETY: live context.
        let pd = unsafe { (self.lib.ibv_alloc_pd)(self.ctx) };
        if pd.is_null() {
            return Err(verr("ibv_alloc_pd"));
        }
        Ok(VerbsPd {
            inner: Arc::new(PdInner {
                pd,
                _ctx: self.clone(),
            }),
        })
    }

    /// Creates a completion queue of `depth` entries with its own
    /// completion channel.
    pub fn create_cq(self: &Arc<Self>, depth: i32) -> Result<VerbsCq, RdmaError> {
        // SAFETY: live context.
        let ch = unsafe { (self.lib.ibv_create_comp_channel)(self.ctx) };
        if ch.is_null() {
            return Err(verr("ibv_create_comp_channel"));
        }
        // SAFETY: live context and channel; no user context pointer.
        let cq = unsafe { (self.lib.ibv_create_cq)(self.ctx, depth, ptr::null_mut(), ch, 0) };
        if cq.is_null() {
            let e = verr("ibv_create_cq");
            // SAFETY: created above, not used by anything else.
            unsafe { (self.lib.ibv_destroy_comp_channel)(ch) };
            return Err(e);
        }
        let cq = VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                ch,
                _ctx: self.clone(),
            }),
        };
        // SAFETY: the channel is live; its fd is a plain integer field.
        set_nonblocking(unsafe { (*ch).fd })?;
        cq.arm()?;
        Ok(cq)
    }
}

struct PdInner {
    pd: *mut sys::ibv_pd,
    _ctx: Arc<Context>,
}

// SAFETY: PDs are thread-safe in libibverbs; freed only in Drop.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl PdInner {
    fn lib(&self) -> &'static sys::Lib {
        self._ctx.lib
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; every MR and QP holds an Arc
        // to this PD, so none is left when it is freed.
        unsafe { (self.lib().ibv_dealloc_pd)(self.pd) };
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct VerbsPd {
    inner: Arc<PdInner>,
}

impl std::fmt::Debug for VerbsPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsPd({:p})", self.inner.pd)
    }
}

fn access_flags(a: Access) -> libc::c_int {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= sys::IBV_ACCESS_LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= sys::IBV_ACCESS_REMOTE_WRITE;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= sys::IBV_ACCESS_REMOTE_READ;
    }
    f
}

impl VerbsPd {
    fn check_device(&self, ctx: *mut sys::ibv_context) -> Result<(), RdmaError> {
        if ctx == self.inner._ctx.ctx {
            Ok(())
        } else {
            Err(RdmaError::Protocol(
                "the connection is on another device than the protection domain",
            ))
        }
    }

    /// Registers every segment of `sg`.
    pub fn reg_sg(&self, mut sg: SgList, access: Access) -> Result<VerbsMr, RdmaError> {
        let mut mrs = Vec::with_capacity(sg.segments().len());
        let mut segs = Vec::with_capacity(sg.segments().len());
        for b in sg.segments_mut() {
            let len = b.len();
            let len32 = u32::try_from(len).map_err(|_| RdmaError::TooLarge)?;
            let addr = b.as_mut_ptr();
            // SAFETY: `addr..addr+len` is a live allocation owned by `sg`,
            // which the returned VerbsMr keeps until it deregisters.
            let mr = unsafe {
                (self.inner.lib().ibv_reg_mr)(self.inner.pd, addr.cast(), len, access_flags(access))
            };
            REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
            if mr.is_null() {
                let e = verr("ibv_reg_mr");
                for m in mrs {
                    // SAFETY: registered above, not yet handed out.
                    unsafe { (self.inner.lib().ibv_dereg_mr)(m) };
                }
                return Err(e);
            }
            // SAFETY: `mr` is a live registration returned just now.
            let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
            mrs.push(mr);
            segs.push(MrSeg {
                addr: addr as u64,
                len: len32,
                lkey,
                rkey,
            });
        }
        Ok(VerbsMr {
            mrs,
            segs,
            sg,
            _pd: self.inner.clone(),
        })
    }
}

impl VerbsPd {
    /// The data path's registration ([`ProtectionDomain::map_sg`]): each
    /// segment's whole allocation is registered with this PD the first time
    /// it is seen here, and the memory region stays on the buffer (its
    /// [`ferrite_reactor::buf::Attachment`]) until the memory is freed, so
    /// a pool buffer is registered once for its life and every later
    /// transfer only reads its keys. A region registered with fewer rights
    /// than `access` is registered again with both.
    pub fn map_sg(&self, mut sg: SgList, access: Access) -> Result<VerbsMappedSg, RdmaError> {
        let mut segs = Vec::with_capacity(sg.segments().len());
        for b in sg.segments_mut() {
            let len32 = u32::try_from(b.len()).map_err(|_| RdmaError::TooLarge)?;
            let cap = b.capacity();
            // The pointer as the HCA may write through it (marks the
            // buffer's bytes as no longer known to be zero).
            let addr = b.as_mut_ptr();
            let regs = b
                .attachment_or_insert_with(BufRegs::default)
                .ok_or(RdmaError::Protocol("buffer without memory"))?;
            let at = regs.0.iter().position(|r| Arc::ptr_eq(&r._pd, &self.inner));
            let reg = match at {
                Some(i) if regs.0[i].access.contains(access) => &regs.0[i],
                found => {
                    let want = found.map_or(access, |i| regs.0[i].access | access);
                    // SAFETY: `addr..addr+cap` is the buffer's whole live
                    // allocation; the registration is kept in the
                    // allocation's attachment, which the buffer drops
                    // before it frees the memory, so the memory outlives
                    // the registration.
                    let mr = unsafe {
                        (self.inner.lib().ibv_reg_mr)(
                            self.inner.pd,
                            addr.cast(),
                            cap,
                            access_flags(want),
                        )
                    };
                    REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
                    if mr.is_null() {
                        return Err(verr("ibv_reg_mr"));
                    }
                    // SAFETY: `mr` is a live registration returned just now.
                    let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
                    let reg = BufReg {
                        mr,
                        lkey,
                        rkey,
                        access: want,
                        _pd: self.inner.clone(),
                    };
                    match found {
                        // The narrower registration is deregistered as it
                        // is replaced.
                        Some(i) => {
                            regs.0[i] = reg;
                            &regs.0[i]
                        }
                        None => {
                            regs.0.push(reg);
                            &regs.0[regs.0.len() - 1]
                        }
                    }
                }
            };
            segs.push(MrSeg {
                addr: addr as u64,
                len: len32,
                lkey: reg.lkey,
                rkey: reg.rkey,
            });
        }
        Ok(VerbsMappedSg { segs, sg })
    }
}

/// One buffer's memory registered with one protection domain, for the
/// life of the memory (see [`VerbsPd::map_sg`]).
struct BufReg {
    mr: *mut sys::ibv_mr,
    lkey: u32,
    rkey: u32,
    access: Access,
    _pd: Arc<PdInner>,
}

// SAFETY: the registration is owned by this value alone and deregistered
// once, in Drop; ibv_dereg_mr may be called from any thread.
unsafe impl Send for BufReg {}
// SAFETY: shared references only read the keys.
unsafe impl Sync for BufReg {}

impl Drop for BufReg {
    fn drop(&mut self) {
        // SAFETY: registered in `map_sg` and deregistered exactly once,
        // before the memory is freed (the buffer drops its attachment
        // first).
        unsafe { (self._pd.lib().ibv_dereg_mr)(self.mr) };
    }
}

/// The registrations of one buffer's memory, one per protection domain:
/// the buffer's attachment.
#[derive(Default)]
struct BufRegs(SmallVec<[BufReg; 1]>);

/// An [`SgList`] mapped for the data path: its segments' keys, from
/// registrations that outlive it ([`VerbsPd::map_sg`]).
pub struct VerbsMappedSg {
    segs: Vec<MrSeg>,
    sg: SgList,
}

impl std::fmt::Debug for VerbsMappedSg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsMappedSg({:?})", self.segs)
    }
}

impl MemoryRegion for VerbsMappedSg {
    fn segs(&self) -> &[MrSeg] {
        &self.segs
    }
    fn read_at(&self, offset: u64, dst: &mut [u8]) -> usize {
        self.sg.copy_out(offset as usize, dst)
    }
    fn write_at(&mut self, offset: u64, src: &[u8]) -> usize {
        self.sg.copy_in(offset as usize, src)
    }
    /// Gives the list back; its memory stays registered.
    fn into_sg(self: Box<Self>) -> SgList {
        self.sg
    }
}

impl ProtectionDomain for VerbsPd {
    fn reg_sg(&self, sg: SgList, access: Access) -> Result<Box<dyn MemoryRegion>, RdmaError> {
        Ok(Box::new(VerbsPd::reg_sg(self, sg, access)?))
    }
    fn map_sg(&self, sg: SgList, access: Access) -> Result<Box<dyn MemoryRegion>, RdmaError> {
        Ok(Box::new(VerbsPd::map_sg(self, sg, access)?))
    }
}

/// Registered memory.
pub struct VerbsMr {
    mrs: Vec<*mut sys::ibv_mr>,
    segs: Vec<MrSeg>,
    sg: SgList,
    _pd: Arc<PdInner>,
}

// SAFETY: the registrations are owned uniquely; deregistration is
// thread-safe.
unsafe impl Send for VerbsMr {}

impl std::fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsMr({:?})", self.segs)
    }
}

impl VerbsMr {
    fn dereg(&mut self) {
        for m in self.mrs.drain(..) {
            // SAFETY: each registration is deregistered exactly once.
            unsafe { (self._pd.lib().ibv_dereg_mr)(m) };
        }
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        self.dereg();
    }
}

impl MemoryRegion for VerbsMr {
    fn segs(&self) -> &[MrSeg] {
        &self.segs
    }
    fn read_at(&self, offset: u64, dst: &mut [u8]) -> usize {
        self.sg.copy_out(offset as usize, dst)
    }
    fn write_at(&mut self, offset: u64, src: &[u8]) -> usize {
        self.sg.copy_in(offset as usize, src)
    }
    fn into_sg(mut self: Box<Self>) -> SgList {
        self.dereg();
        std::mem::take(&mut self.sg)
    }
}

struct CqInner {
    cq: *mut sys::ibv_cq,
    ch: *mut sys::ibv_comp_channel,
    _ctx: Arc<Context>,
}

// SAFETY: CQ polling and the completion channel are thread-safe in
// libibverbs; both are destroyed only in Drop.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using the CQ hold an Arc to it, so none is left; the
        // CQ goes before its channel.
        unsafe {
            (self._ctx.lib.ibv_destroy_cq)(self.cq);
            (self._ctx.lib.ibv_destroy_comp_channel)(self.ch);
        }
    }
}

/// A completion queue with its completion channel.
#[derive(Clone)]
pub struct VerbsCq {
    inner: Arc<CqInner>,
}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsCq({:p})", self.inner.cq)
    }
}

fn wc_status(s: u32) -> WcStatus {
    match s {
        sys::IBV_WC_SUCCESS => WcStatus::Success,
        sys::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        sys::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        sys::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        sys::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        sys::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        sys::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        sys::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

fn wc_opcode(o: u32) -> WcOpcode {
    match o {
        sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        sys::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        x if x & sys::IBV_WC_RECV != 0 => WcOpcode::Recv,
        _ => WcOpcode::Send,
    }
}

/// The provider-neutral form of a polled `ibv_wc`.
fn completion(wc: &sys::ibv_wc) -> WorkCompletion {
    let mut out = WorkCompletion::new(
        wc.wr_id,
        wc_status(wc.status),
        wc_opcode(wc.opcode),
        wc.byte_len,
        wc.qp_num,
    );
    // The flag (and the union holding the key) is only meaningful on a
    // successful receive.
    if out.status == WcStatus::Success && wc.wc_flags & sys::IBV_WC_WITH_INV != 0 {
        out.invalidated_rkey = Some(wc.imm_data);
    }
    out
}

impl VerbsCq {
    fn arm(&self) -> Result<(), RdmaError> {
        // SAFETY: live CQ.
        if unsafe { sys::ibv_req_notify_cq(self.inner.cq, 0) } != 0 {
            return Err(verr("ibv_req_notify_cq"));
        }
        Ok(())
    }

    fn drain(&self, out: &mut Vec<WorkCompletion>) -> usize {
        let mut total = 0;
        loop {
            // SAFETY: ibv_wc is plain data (integers and an integer union);
            // all-zero is a valid value.
            let mut wcs: [sys::ibv_wc; 16] = unsafe { std::mem::zeroed() };
            // SAFETY: live CQ; the array has room for 16 entries.
            let n = unsafe { sys::ibv_poll_cq(self.inner.cq, 16, wcs.as_mut_ptr()) };
            if n <= 0 {
                return total;
            }
            for wc in &wcs[..n as usize] {
                out.push(completion(wc));
            }
            total += n as usize;
        }
    }
}

impl CompletionQueue for VerbsCq {
    fn poll_cq(&self, out: &mut Vec<WorkCompletion>) -> usize {
        let mut n = self.drain(out);
        // Consume a pending notification (non-blocking channel), ack it,
        // re-arm, then poll once more to close the race with the re-arm.
        let mut ev_cq: *mut sys::ibv_cq = ptr::null_mut();
        let mut ev_ctx: *mut libc::c_void = ptr::null_mut();
        let lib = self.inner._ctx.lib;
        // SAFETY: live channel; out-pointers are valid. With O_NONBLOCK the
        // call returns -1 at once when no event is pending.
        if unsafe { (lib.ibv_get_cq_event)(self.inner.ch, &mut ev_cq, &mut ev_ctx) } == 0 {
            // SAFETY: one event was taken from this CQ; ack it.
            unsafe { (lib.ibv_ack_cq_events)(self.inner.cq, 1) };
            if self.arm().is_err() {
                tracing::warn!("ibv_req_notify_cq failed: errno {}", errno());
            }
            n += self.drain(out);
        }
        n
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as `inner`.
        unsafe { (*self.inner.ch).fd }
    }
}

struct SrqInner {
    srq: *mut sys::ibv_srq,
    _pd: Arc<PdInner>,
}

// SAFETY: posting to an SRQ is thread-safe; destroyed only in Drop.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using the SRQ hold an Arc to it.
        unsafe { (self._pd.lib().ibv_destroy_srq)(self.srq) };
    }
}

/// A shared receive queue.
#[derive(Clone)]
pub struct VerbsSrq {
    inner: Arc<SrqInner>,
}

impl std::fmt::Debug for VerbsSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsSrq({:p})", self.inner.srq)
    }
}

fn sges(list: &[crate::Sge]) -> SmallVec<[sys::ibv_sge; 4]> {
    list.iter()
        .map(|s| sys::ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        })
        .collect()
}

impl VerbsSrq {
    /// Creates an SRQ of `max_wr` receives with `max_sge` entries each.
    pub fn new(pd: &VerbsPd, max_wr: u32, max_sge: u32) -> Result<VerbsSrq, RdmaError> {
        let mut attr = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD and a valid attribute struct.
        let srq = unsafe { (pd.inner.lib().ibv_create_srq)(pd.inner.pd, &mut attr) };
        if srq.is_null() {
            return Err(verr("ibv_create_srq"));
        }
        Ok(VerbsSrq {
            inner: Arc::new(SrqInner {
                srq,
                _pd: pd.inner.clone(),
            }),
        })
    }

    /// Posts a receive to the SRQ.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        let mut sg = sges(&wr.sges);
        let mut w = sys::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: sg.as_mut_ptr(),
            num_sge: sg.len() as i32,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: live SRQ; `w` and its sge array live across the call and
        // the provider copies them into its queue before returning.
        match unsafe { sys::ibv_post_srq_recv(self.inner.srq, &mut w, &mut bad) } {
            0 => Ok(()),
            libc::ENOMEM => Err(PostError::QueueFull),
            e => Err(PostError::Os(e)),
        }
    }
}

/// Queue pair sizing.
#[derive(Clone, Copy, Debug)]
pub struct VerbsQpAttrs {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_sge: u32,
    /// RDMA READs this side may have outstanding as initiator/responder.
    pub rd_atomic: u8,
    /// 7 means retry forever (IB semantics).
    pub rnr_retry: u8,
    pub retry_count: u8,
}

impl Default for VerbsQpAttrs {
    fn default() -> VerbsQpAttrs {
        VerbsQpAttrs {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 16,
            rd_atomic: 16,
            rnr_retry: 7,
            retry_count: 7,
        }
    }
}

/// An RDMA CM event channel (non-blocking).
struct EventChannel {
    ch: *mut sys::rdma_event_channel,
    lib: &'static sys::Lib,
}

impl EventChannel {
    fn new(lib: &'static sys::Lib) -> Result<EventChannel, RdmaError> {
        // SAFETY: no arguments; returns null on failure.
        let ch = unsafe { (lib.rdma_create_event_channel)() };
        if ch.is_null() {
            return Err(verr("rdma_create_event_channel"));
        }
        let ec = EventChannel { ch, lib };
        // SAFETY: live channel; fd is a plain field.
        set_nonblocking(unsafe { (*ch).fd })?;
        Ok(ec)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { (*self.ch).fd }
    }

    /// The next event, already acknowledged, with a copy of its private
    /// data. `None` when none is pending.
    fn next(&self) -> Option<CmEvent> {
        let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer; non-blocking.
        if unsafe { (self.lib.rdma_get_cm_event)(self.ch, &mut ev) } != 0 || ev.is_null() {
            return None;
        }
        // SAFETY: `ev` is a live event until acked; `param.conn` is the
        // member connected-mode events fill (private data is copied out
        // before the ack frees it).
        let out = unsafe {
            let e = &*ev;
            let conn = e.conn;
            let private = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            CmEvent {
                kind: e.event,
                status: e.status,
                id: e.id,
                private,
                initiator_depth: conn.initiator_depth,
                responder_resources: conn.responder_resources,
            }
        };
        // SAFETY: acked exactly once.
        unsafe { (self.lib.rdma_ack_cm_event)(ev) };
        Some(out)
    }

    /// Waits up to `timeout` for an event.
    fn wait(&self, timeout: Duration) -> Option<CmEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.next() {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd that outlives the call.
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel is destroyed before (owners drop
        // their ids first; see field order of the owners).
        unsafe { (self.lib.rdma_destroy_event_channel)(self.ch) };
    }
}

struct CmEvent {
    kind: u32,
    status: i32,
    id: *mut sys::rdma_cm_id,
    private: Vec<u8>,
    /// A connect request's RDMA READ limits, from this side's point of
    /// view: how many this side may have outstanding toward the peer (the
    /// peer's responder resources), and how many of the peer's it must
    /// answer at once (the peer's initiator depth).
    initiator_depth: u8,
    responder_resources: u8,
}

fn sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage, which is
            // suitably aligned for it.
            unsafe { ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above for sockaddr_in6.
            unsafe { ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// Reads a `sockaddr_in` or `sockaddr_in6` from the bytes of a
/// `sockaddr_storage` (family in host order, port and address in network
/// order); None for any other family.
fn sockaddr_from_bytes(b: &[u8; 128]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([b[0], b[1]]));
    let port = u16::from_be_bytes([b[2], b[3]]);
    if family == libc::AF_INET {
        let ip = std::net::Ipv4Addr::new(b[4], b[5], b[6], b[7]);
        return Some(SocketAddr::from((ip, port)));
    }
    if family == libc::AF_INET6 {
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[8..24]);
        let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
        let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        return Some(SocketAddr::V6(std::net::SocketAddrV6::new(
            ip.into(),
            port,
            flow,
            scope,
        )));
    }
    None
}

fn conn_param(private: &[u8], attrs: &VerbsQpAttrs) -> Result<sys::rdma_conn_param, RdmaError> {
    let len =
        u8::try_from(private.len()).map_err(|_| RdmaError::Protocol("private data too long"))?;
    Ok(sys::rdma_conn_param {
        private_data: private.as_ptr().cast(),
        private_data_len: len,
        responder_resources: attrs.rd_atomic,
        initiator_depth: attrs.rd_atomic,
        flow_control: 1,
        retry_count: attrs.retry_count,
        rnr_retry_count: attrs.rnr_retry,
        srq: 0,
        qp_num: 0,
    })
}

/// A listening RDMA CM id.
pub struct VerbsListener {
    id: *mut sys::rdma_cm_id,
    ch: EventChannel,
}

// SAFETY: the id and channel are used from one owner at a time.
unsafe impl Send for VerbsListener {}

impl std::fmt::Debug for VerbsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsListener({:p})", self.id)
    }
}

impl Drop for VerbsListener {
    fn drop(&mut self) {
        // SAFETY: created in `bind`, destroyed once, before its channel
        // (a field dropped after this body runs).
        unsafe { (self.ch.lib.rdma_destroy_id)(self.id) };
    }
}

impl VerbsListener {
    /// Binds and listens on `addr` (RDMA_PS_TCP: IB, RoCE and iWARP).
    pub fn bind(addr: &SocketAddr, backlog: i32) -> Result<VerbsListener, RdmaError> {
        let lib = sys::lib()?;
        let ch = EventChannel::new(lib)?;
        let mut id = ptr::null_mut();
        // SAFETY: live channel and a valid out-pointer.
        if unsafe { (lib.rdma_create_id)(ch.ch, &mut id, ptr::null_mut(), sys::RDMA_PS_TCP) } != 0 {
            return Err(verr("rdma_create_id"));
        }
        let l = VerbsListener { id, ch };
        let mut ss = sockaddr(addr);
        // SAFETY: live id; the sockaddr is valid for the call.
        if unsafe { (lib.rdma_bind_addr)(l.id, (&mut ss as *mut libc::sockaddr_storage).cast()) }
            != 0
        {
            return Err(verr("rdma_bind_addr"));
        }
        // SAFETY: live, bound id.
        if unsafe { (lib.rdma_listen)(l.id, backlog) } != 0 {
            return Err(verr("rdma_listen"));
        }
        Ok(l)
    }

    /// Readable when a connection request may be pending.
    pub fn fd(&self) -> RawFd {
        self.ch.fd()
    }

    /// The next connection request, if any (non-blocking).
    pub fn poll_request(&self) -> Option<VerbsConnRequest> {
        while let Some(ev) = self.ch.next() {
            if ev.kind == sys::RDMA_CM_EVENT_CONNECT_REQUEST {
                return Some(VerbsConnRequest {
                    id: ev.id,
                    lib: self.ch.lib,
                    private_data: ev.private,
                    initiator_depth: ev.initiator_depth,
                    responder_resources: ev.responder_resources,
                    refusal: Vec::new(),
                });
            }
            tracing::debug!(
                event = ev.kind,
                status = ev.status,
                "rdma cm: listener event ignored"
            );
        }
        None
    }
}

/// An incoming connection: the initiator's private data, to accept with
/// [`VerbsQp::accept`] or refuse with [`VerbsConnRequest::reject`].
pub struct VerbsConnRequest {
    id: *mut sys::rdma_cm_id,
    lib: &'static sys::Lib,
    private_data: Vec<u8>,
    /// RDMA READs the peer lets this side have outstanding (its responder
    /// resources) and that it may itself have outstanding toward this side
    /// (its initiator depth): the accept may not ask for more.
    initiator_depth: u8,
    responder_resources: u8,
    /// What a refusal carries when the request is dropped unaccepted or
    /// its queue pair cannot be made.
    refusal: Vec<u8>,
}

/// Refuses a connect request with `private_data` (at most 148 bytes on IB
/// and RoCE: an IB CM REJ's private data). librdmacm sends it as a
/// consumer-defined reject, which is where the peer looks for it.
fn reject_id(lib: &sys::Lib, id: *mut sys::rdma_cm_id, private_data: &[u8]) {
    let len = u8::try_from(private_data.len()).unwrap_or(0);
    let data = if len == 0 {
        ptr::null()
    } else {
        private_data.as_ptr().cast()
    };
    // SAFETY: live id of a connect request; the data is valid for the call.
    if unsafe { (lib.rdma_reject)(id, data, len) } != 0 {
        tracing::debug!(errno = errno(), "rdma_reject failed");
    }
}

// SAFETY: the request's id is owned by this value alone.
unsafe impl Send for VerbsConnRequest {}

impl std::fmt::Debug for VerbsConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsConnRequest({} bytes)", self.private_data.len())
    }
}

impl Drop for VerbsConnRequest {
    fn drop(&mut self) {
        if !self.id.is_null() {
            // A request neither accepted nor rejected: refuse it and free
            // its id (once; `take_id` nulls the field).
            reject_id(self.lib, self.id, &self.refusal);
            // SAFETY: the id is ours and no longer needed.
            unsafe { (self.lib.rdma_destroy_id)(self.id) };
        }
    }
}

impl VerbsConnRequest {
    fn take_id(&mut self) -> *mut sys::rdma_cm_id {
        std::mem::replace(&mut self.id, ptr::null_mut())
    }

    /// The connect request's private data. Over InfiniBand and RoCE it is
    /// always 56 bytes (what an IB CM REQ carries after RDMA CM's own
    /// header), whatever length the peer sent.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// What to refuse the request with should it be dropped unaccepted or
    /// its queue pair fail ([`VerbsQp::for_request`]).
    pub fn set_refusal(&mut self, private_data: &[u8]) {
        self.refusal = private_data.to_vec();
    }

    /// The peer's RDMA READ limits as this side must keep to them: READs
    /// this side may have outstanding, and READs the peer may.
    pub fn rd_atomic(&self) -> (u8, u8) {
        (self.initiator_depth, self.responder_resources)
    }

    /// The HCA port the request arrived on (1-based).
    pub fn port_num(&self) -> u8 {
        // SAFETY: the id is live until accepted or rejected; `port_num` is
        // a plain field the connection manager sets for a request.
        unsafe { (*self.id).port_num }
    }

    /// The local (listening) and remote IP addresses and ports of the
    /// request, as RDMA CM resolved them: the `src` and `dst` sockaddrs
    /// at the start of the id's `struct rdma_route` (librdmacm's
    /// `rdma_get_local_addr` / `rdma_get_peer_addr`, which are inline
    /// functions in its header, not library symbols). None for an address
    /// family other than IPv4 and IPv6 (an AF_IB request).
    pub fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        // SAFETY: the id is live until accepted or rejected; `route` is
        // plain data the connection manager filled for the request.
        let route = unsafe { (*self.id).route };
        // Each sockaddr_storage is 128 bytes (16 u64s); the source comes
        // first, then the destination.
        let at = |i: usize| -> Option<SocketAddr> {
            let words = route.get(i * 16..(i + 1) * 16)?;
            let mut b = [0u8; 128];
            for (dst, w) in b.chunks_exact_mut(8).zip(words) {
                dst.copy_from_slice(&w.to_ne_bytes());
            }
            sockaddr_from_bytes(&b)
        };
        (at(0), at(1))
    }

    /// The device the request arrived on.
    pub fn context(&self) -> Arc<Context> {
        // SAFETY: the id is live; `verbs` is set for a connect request and
        // stays open for as long as librdmacm is loaded (it owns it).
        let ctx = unsafe { (*self.id).verbs };
        Arc::new(Context {
            ctx,
            owned: false,
            lib: self.lib,
        })
    }

    /// Rejects with `private_data`.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), RdmaError> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| RdmaError::Protocol("private data too long"))?;
        let id = self.take_id();
        // SAFETY: live id; the data is valid for the call.
        let r = unsafe { (self.lib.rdma_reject)(id, private_data.as_ptr().cast(), len) };
        // SAFETY: the id is ours and no longer needed.
        unsafe { (self.lib.rdma_destroy_id)(id) };
        if r != 0 {
            return Err(verr("rdma_reject"));
        }
        Ok(())
    }
}

const ST_INIT: u8 = 0;
const ST_RTS: u8 = 1;
const ST_ERROR: u8 = 2;

/// An RC queue pair on an RDMA CM id.
pub struct VerbsQp {
    id: *mut sys::rdma_cm_id,
    qp: *mut sys::ibv_qp,
    /// The id's own event channel (dropped after the id).
    ch: EventChannel,
    state: AtomicU8,
    attrs: VerbsQpAttrs,
    /// The connect request's limits ([`VerbsConnRequest::rd_atomic`]) for
    /// the accept of a passive side.
    peer_rd: Option<(u8, u8)>,
    _pd: Arc<PdInner>,
    _cqs: (Arc<CqInner>, Arc<CqInner>),
    _srq: Option<Arc<SrqInner>>,
}

// SAFETY: posting is thread-safe in libibverbs; the QP and id are
// destroyed only in Drop.
unsafe impl Send for VerbsQp {}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsQp({:#x})", self.qp_num())
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        let lib = self.ch.lib;
        // SAFETY: the QP and id were created by us and are destroyed once,
        // QP first; the event channel field is dropped after this body.
        unsafe {
            if self.state.load(Ordering::Relaxed) == ST_RTS {
                (lib.rdma_disconnect)(self.id);
            }
            (lib.rdma_destroy_qp)(self.id);
            (lib.rdma_destroy_id)(self.id);
        }
    }
}

impl VerbsQp {
    #[allow(clippy::too_many_arguments)]
    fn create_on(
        id: *mut sys::rdma_cm_id,
        ch: EventChannel,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        attrs: VerbsQpAttrs,
        refusal: Option<&[u8]>,
    ) -> Result<VerbsQp, RdmaError> {
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.inner.cq,
            recv_cq: recv_cq.inner.cq,
            srq: srq.map_or(ptr::null_mut(), |s| s.inner.srq),
            cap: sys::ibv_qp_cap {
                max_send_wr: attrs.max_send_wr,
                max_recv_wr: attrs.max_recv_wr,
                max_send_sge: attrs.max_sge,
                max_recv_sge: attrs.max_sge,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        let lib = ch.lib;
        // SAFETY: live id, PD and CQs; `init` is valid for the call.
        if unsafe { (lib.rdma_create_qp)(id, pd.inner.pd, &mut init) } != 0 {
            let e = verr("rdma_create_qp");
            if let Some(data) = refusal {
                reject_id(lib, id, data);
            }
            // SAFETY: the id is ours and unused.
            unsafe { (lib.rdma_destroy_id)(id) };
            return Err(e);
        }
        Ok(VerbsQp {
            id,
            // SAFETY: rdma_create_qp succeeded, so `qp` is set.
            qp: unsafe { (*id).qp },
            ch,
            state: AtomicU8::new(ST_INIT),
            attrs,
            peer_rd: None,
            _pd: pd.inner.clone(),
            _cqs: (send_cq.inner.clone(), recv_cq.inner.clone()),
            _srq: srq.map(|s| s.inner.clone()),
        })
    }

    /// Creates the QP of a connection request (receives may then be posted)
    /// and moves the request's id to the QP's own event channel.
    pub fn for_request(
        mut req: VerbsConnRequest,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        attrs: VerbsQpAttrs,
    ) -> Result<VerbsQp, RdmaError> {
        // Until the queue pair exists, a failure drops `req`, which refuses
        // the connection with its refusal ([`VerbsConnRequest::set_refusal`]).
        let ch = EventChannel::new(req.lib)?;
        // SAFETY: live id; `verbs` is set for a connect request.
        pd.check_device(unsafe { (*req.id).verbs })?;
        // SAFETY: live id and channel.
        if unsafe { (req.lib.rdma_migrate_id)(req.id, ch.ch) } != 0 {
            return Err(verr("rdma_migrate_id"));
        }
        let peer_rd = req.rd_atomic();
        let refusal = std::mem::take(&mut req.refusal);
        let id = req.take_id();
        let mut qp = VerbsQp::create_on(id, ch, pd, send_cq, recv_cq, srq, attrs, Some(&refusal))?;
        qp.peer_rd = Some(peer_rd);
        Ok(qp)
    }

    /// Refuses the connection of a QP made by [`VerbsQp::for_request`] and
    /// not accepted (say its receives could not be posted), with
    /// `private_data` as the reject's; the QP and its id go with it.
    pub fn refuse(self, private_data: &[u8]) {
        if self.state.load(Ordering::Relaxed) == ST_INIT && self.peer_rd.is_some() {
            reject_id(self.ch.lib, self.id, private_data);
        }
    }

    /// Accepts the connection with `private_data` (call after posting
    /// receives). The QP is ready once [`QueuePair::state`] says `Rts`.
    pub fn accept(&self, private_data: &[u8]) -> Result<(), RdmaError> {
        let mut p = conn_param(private_data, &self.attrs)?;
        // Never more RDMA READs in flight than the peer said it answers at
        // once (its responder resources), nor more of its READs served
        // than it asked for: a responder given more READs than it has
        // resources for loses some.
        if let Some((ord, ird)) = self.peer_rd {
            p.initiator_depth = p.initiator_depth.min(ord);
            p.responder_resources = p.responder_resources.min(ird);
        }
        // SAFETY: live id with a QP; `p` and the private data outlive the call.
        if unsafe { (self.ch.lib.rdma_accept)(self.id, &mut p) } != 0 {
            return Err(verr("rdma_accept"));
        }
        self.state.store(ST_RTS, Ordering::Relaxed);
        Ok(())
    }

    /// Connects to `addr` with `private_data`: resolves the address and
    /// route, creates the QP, posts `recvs`, connects; returns the QP and
    /// the accept's private data, or [`RdmaError::Rejected`].
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        addr: &SocketAddr,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        attrs: VerbsQpAttrs,
        recvs: &[RecvWr],
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(VerbsQp, Vec<u8>), RdmaError> {
        let lib = pd.inner.lib();
        let ch = EventChannel::new(lib)?;
        let mut id = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        if unsafe { (lib.rdma_create_id)(ch.ch, &mut id, ptr::null_mut(), sys::RDMA_PS_TCP) } != 0 {
            return Err(verr("rdma_create_id"));
        }
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let mut ss = sockaddr(addr);
        let expect = |want: u32, call: &'static str| -> Result<CmEvent, RdmaError> {
            match ch.wait(timeout) {
                Some(e) if e.kind == want => Ok(e),
                Some(e) if e.kind == sys::RDMA_CM_EVENT_REJECTED => Err(RdmaError::Rejected {
                    private_data: e.private,
                }),
                Some(e) => Err(RdmaError::Verbs {
                    call,
                    errno: e.status,
                }),
                None => Err(RdmaError::Timeout),
            }
        };
        // SAFETY: live id; the sockaddr lives across the call.
        let r = unsafe {
            (lib.rdma_resolve_addr)(
                id,
                ptr::null_mut(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                ms,
            )
        };
        let step = if r != 0 {
            Err(verr("rdma_resolve_addr"))
        } else {
            expect(sys::RDMA_CM_EVENT_ADDR_RESOLVED, "rdma_resolve_addr")
        };
        let step = step.and_then(|_| {
            // SAFETY: live id with a resolved address.
            if unsafe { (lib.rdma_resolve_route)(id, ms) } != 0 {
                return Err(verr("rdma_resolve_route"));
            }
            expect(sys::RDMA_CM_EVENT_ROUTE_RESOLVED, "rdma_resolve_route")
        });
        // The QP is created on the device the route goes through: the PD
        // must belong to it.
        // SAFETY: live id; `verbs` is set once the address is resolved.
        let step = step.and_then(|_| pd.check_device(unsafe { (*id).verbs }));
        if let Err(e) = step {
            // SAFETY: the id is ours and has no QP yet.
            unsafe { (lib.rdma_destroy_id)(id) };
            return Err(e);
        }
        // `create_on` owns the id from here on (and destroys it on failure).
        let inner_ch = EventChannel::new(lib)?;
        // SAFETY: live id and channel.
        if unsafe { (lib.rdma_migrate_id)(id, inner_ch.ch) } != 0 {
            let e = verr("rdma_migrate_id");
            // SAFETY: the id is ours.
            unsafe { (lib.rdma_destroy_id)(id) };
            return Err(e);
        }
        drop(ch);
        let qp = VerbsQp::create_on(id, inner_ch, pd, send_cq, recv_cq, None, attrs, None)?;
        for r in recvs {
            qp.post_recv(r).map_err(|_| verr("ibv_post_recv"))?;
        }
        let mut p = conn_param(private_data, &attrs)?;
        // SAFETY: live id with a QP; `p` outlives the call.
        if unsafe { (lib.rdma_connect)(qp.id, &mut p) } != 0 {
            return Err(verr("rdma_connect"));
        }
        match qp.ch.wait(timeout) {
            Some(e) if e.kind == sys::RDMA_CM_EVENT_ESTABLISHED => {
                qp.state.store(ST_RTS, Ordering::Relaxed);
                Ok((qp, e.private))
            }
            Some(e) if e.kind == sys::RDMA_CM_EVENT_REJECTED => Err(RdmaError::Rejected {
                private_data: e.private,
            }),
            Some(e) => Err(RdmaError::Verbs {
                call: "rdma_connect",
                errno: e.status,
            }),
            None => Err(RdmaError::Timeout),
        }
    }

    /// Readable when a connection event may be pending.
    pub fn event_fd(&self) -> RawFd {
        self.ch.fd()
    }
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num is a plain field.
        unsafe { (*self.qp).qp_num }
    }

    fn state(&self) -> QpState {
        match self.state.load(Ordering::Relaxed) {
            ST_INIT => QpState::Init,
            ST_RTS => QpState::Rts,
            _ => QpState::Error,
        }
    }

    fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        if wr.sges.len() > self.attrs.max_sge as usize {
            return Err(PostError::TooManySges(wr.sges.len()));
        }
        let mut sg = sges(&wr.sges);
        let (opcode, remote_addr, rkey, invalidate) = match wr.op {
            SendOp::Send => (sys::IBV_WR_SEND, 0, 0, 0),
            SendOp::RdmaWrite { remote_addr, rkey } => {
                (sys::IBV_WR_RDMA_WRITE, remote_addr, rkey, 0)
            }
            SendOp::RdmaRead { remote_addr, rkey } => (sys::IBV_WR_RDMA_READ, remote_addr, rkey, 0),
            SendOp::SendInvalidate { rkey } => (sys::IBV_WR_SEND_WITH_INV, 0, 0, rkey),
        };
        // SAFETY: ibv_send_wr is plain data (integers, pointers, unions of
        // those); all-zero is valid and means "no next, no flags".
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id;
        w.sg_list = sg.as_mut_ptr();
        w.num_sge = sg.len() as i32;
        w.opcode = opcode;
        // The `invalidate_rkey` member of the union, in host order.
        w.imm_data = invalidate;
        w.send_flags = if wr.signaled {
            sys::IBV_SEND_SIGNALED
        } else {
            0
        };
        w.wr.rdma = sys::ibv_rdma_wr { remote_addr, rkey };
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; `w` and its sge array live across the call and
        // the provider copies them before returning.
        match unsafe { sys::ibv_post_send(self.qp, &mut w, &mut bad) } {
            0 => Ok(()),
            libc::ENOMEM => Err(PostError::QueueFull),
            e => Err(PostError::Os(e)),
        }
    }

    fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        if self._srq.is_some() {
            return Err(PostError::UsesSrq);
        }
        let mut sg = sges(&wr.sges);
        let mut w = sys::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: sg.as_mut_ptr(),
            num_sge: sg.len() as i32,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: as in `post_send`.
        match unsafe { sys::ibv_post_recv(self.qp, &mut w, &mut bad) } {
            0 => Ok(()),
            libc::ENOMEM => Err(PostError::QueueFull),
            e => Err(PostError::Os(e)),
        }
    }

    fn disconnect(&self) {
        if self.state.swap(ST_ERROR, Ordering::Relaxed) == ST_RTS {
            // SAFETY: live, connected id. The QP moves to the error state
            // and the HCA flushes what is outstanding.
            unsafe { (self.ch.lib.rdma_disconnect)(self.id) };
        }
    }

    fn poll_event(&self) -> Option<ConnEvent> {
        while let Some(e) = self.ch.next() {
            match e.kind {
                sys::RDMA_CM_EVENT_ESTABLISHED => {
                    let _ = self.state.compare_exchange(
                        ST_INIT,
                        ST_RTS,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                sys::RDMA_CM_EVENT_DISCONNECTED
                | sys::RDMA_CM_EVENT_DEVICE_REMOVAL
                | sys::RDMA_CM_EVENT_TIMEWAIT_EXIT
                | sys::RDMA_CM_EVENT_CONNECT_ERROR
                | sys::RDMA_CM_EVENT_UNREACHABLE => {
                    if self.state.swap(ST_ERROR, Ordering::Relaxed) == ST_RTS {
                        // SAFETY: live id; completes the disconnect handshake.
                        unsafe { (self.ch.lib.rdma_disconnect)(self.id) };
                    }
                    return Some(ConnEvent::Disconnected);
                }
                other => tracing::debug!(event = other, "rdma cm: qp event ignored"),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On machines without RDMA hardware (CI) the list is empty and the
    /// idle line is logged; with hardware every device has a name and a
    /// port. Without rdma-core the listing says which library is missing.
    #[test]
    fn device_list_is_empty_or_real() {
        let devs = match devices() {
            Ok(d) => d,
            Err(e @ RdmaError::LibraryMissing { .. }) => {
                eprintln!("{e}: verbs provider idle (expected without rdma-core)");
                assert!(matches!(
                    Context::cm_devices(),
                    Err(RdmaError::LibraryMissing { .. })
                ));
                return;
            }
            Err(e) => panic!("listing devices with rdma-core installed: {e}"),
        };
        if crate::log_idle_if_empty(&devs) {
            eprintln!("no RDMA device: verbs provider idle (expected without an HCA)");
            return;
        }
        for d in &devs {
            assert!(!d.name.is_empty());
            assert!(d.ports >= 1, "{d:?}");
            // The port attributes come back where the declared layout puts
            // them: a known state (DOWN to ACTIVE_DEFER), a known link
            // layer, a message size limit.
            let ctx = Context::open(&d.name).expect("a listed device opens");
            assert_eq!(ctx.name(), d.name);
            let p = ctx.query_port(1).expect("port 1");
            assert!((1..=5).contains(&p.state), "{d:?} {p:?}");
            assert!(p.link_layer <= 2, "{d:?} {p:?}");
            assert!(p.max_msg_sz > 0, "{d:?} {p:?}");
            eprintln!("{d:?}: port 1 {p:?}");
        }
    }

    /// Needs an RDMA device (rxe in the kernel lab); skips without one.
    #[test]
    fn a_pool_buffer_is_registered_once_for_its_life() {
        use ferrite_reactor::buf::BufPool;
        let Some(ctx) = Context::cm_devices().unwrap_or_default().into_iter().next() else {
            eprintln!("no RDMA device: skipping the registration check");
            return;
        };
        let pd = ctx.alloc_pd().expect("a protection domain");
        let pool = BufPool::new(256 * 1024, 8);
        let first = pd.map_sg(pool.sg(300 * 1024), Access::LOCAL_WRITE).unwrap();
        let keys: Vec<u32> = first.segs().iter().map(|s| s.lkey).collect();
        assert_eq!(keys.len(), 2);
        let n = memory_registrations();
        let sg = MemoryRegion::into_sg(Box::new(first));
        drop(sg);
        // The same memory back from the pool: its keys, no registration.
        for _ in 0..100 {
            let again = pd.map_sg(pool.sg(300 * 1024), Access::LOCAL_WRITE).unwrap();
            let k: Vec<u32> = again.segs().iter().map(|s| s.lkey).collect();
            assert_eq!(k, keys);
            assert_eq!(again.segs()[1].len, 44 * 1024, "the visible length");
        }
        assert_eq!(memory_registrations(), n, "registered again");
        // More rights than the registration has: registered again, once.
        let wider = pd
            .map_sg(pool.sg(4096), Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        drop(wider);
        let again = pd
            .map_sg(pool.sg(4096), Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        drop(again);
        assert!(memory_registrations() <= n + 1);
        // Another protection domain has registrations of its own.
        let pd2 = ctx.alloc_pd().expect("a second protection domain");
        let other = pd2
            .map_sg(pool.sg(256 * 1024), Access::LOCAL_WRITE)
            .unwrap();
        assert_ne!(other.segs()[0].lkey, keys[0]);
        drop(other);
        // The pool and its registrations go; the PDs after them.
        drop(pool);
        drop((pd, pd2));
    }

    #[test]
    fn opening_a_missing_device_fails_cleanly() {
        assert!(Context::open("ferrite-no-such-hca").is_err());
    }

    #[test]
    fn listener_without_rdma_support_is_an_error_not_a_panic() {
        if !devices().unwrap_or_default().is_empty() {
            eprintln!("RDMA device present: skipping the no-device check");
            return;
        }
        assert!(Context::cm_devices().unwrap_or_default().is_empty());
        let a: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(VerbsListener::bind(&a, 4).is_err());
    }

    #[test]
    fn sockaddrs_read_back_as_written() {
        for a in ["192.0.2.7:3260", "[fe80::1]:3261"] {
            let a: SocketAddr = a.parse().unwrap();
            let ss = sockaddr(&a);
            let mut b = [0u8; 128];
            // SAFETY: test-only read of the plain-data storage just written.
            let bytes: [u8; std::mem::size_of::<libc::sockaddr_storage>()] =
                unsafe { std::mem::transmute(ss) };
            b.copy_from_slice(&bytes[..128]);
            assert_eq!(sockaddr_from_bytes(&b), Some(a));
        }
        assert_eq!(sockaddr_from_bytes(&[0u8; 128]), None);
    }

    #[test]
    fn sockaddr_layout() {
        let a: SocketAddr = "10.1.2.3:4420".parse().unwrap();
        let ss = sockaddr(&a);
        // SAFETY: test-only read of the sockaddr_in just written.
        let sin: libc::sockaddr_in =
            unsafe { ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
        assert_eq!(sin.sin_family as i32, libc::AF_INET);
        assert_eq!(u16::from_be(sin.sin_port), 4420);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 1, 2, 3]);
        assert_eq!(wc_opcode(sys::IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(
            wc_status(sys::IBV_WC_REM_ACCESS_ERR),
            WcStatus::RemAccessErr
        );
        assert_eq!(access_flags(Access::ALL), 7);
    }

    #[test]
    fn receive_completion_names_the_invalidated_rkey() {
        // SAFETY: ibv_wc is plain data; all-zero is a valid value.
        let mut wc: sys::ibv_wc = unsafe { std::mem::zeroed() };
        wc.wr_id = 5;
        wc.opcode = sys::IBV_WC_RECV;
        wc.byte_len = 48;
        wc.qp_num = 0x11;
        wc.imm_data = 0x8000_0042;
        let plain = completion(&wc);
        assert_eq!(plain.invalidated_rkey, None);
        assert_eq!(
            (plain.wr_id, plain.opcode, plain.byte_len, plain.qp_num),
            (5, WcOpcode::Recv, 48, 0x11)
        );
        wc.wc_flags = sys::IBV_WC_WITH_INV;
        assert_eq!(completion(&wc).invalidated_rkey, Some(0x8000_0042));
        wc.status = sys::IBV_WC_REM_INV_REQ_ERR;
        let failed = completion(&wc);
        assert_eq!(
            (failed.status, failed.invalidated_rkey),
            (WcStatus::RemInvReqErr, None)
        );
    }
}
