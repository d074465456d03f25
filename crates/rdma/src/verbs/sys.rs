//! The C interface of libibverbs and librdmacm the verbs provider calls:
//! declared here by hand, and the two libraries loaded at run time.
//!
//! Owns: the struct layouts, constants and entry points `verbs.rs` uses,
//! nothing more, and the one table of entry points ([`lib`]) every call into
//! the libraries goes through. Does not own: what the calls mean (that is
//! `verbs.rs`).
//!
//! The declarations are this crate's own, written from the ABI rdma-core's
//! `infiniband/verbs.h` and `rdma/rdma_cma.h` define (they have not changed
//! since rdma-core's first releases). Sizes, alignments and offsets were
//! checked once against those headers (rdma-core 44, x86_64 Linux) with a C
//! program; the numbers are written down in the tests at the bottom, which
//! need no headers. A struct Rust allocates or passes by value is declared
//! whole; a struct only ever reached through a pointer the library returned
//! is declared up to the last field this crate reads and says so.
//!
//! Loading: the first call of [`lib`] opens `libibverbs.so.1` and
//! `librdmacm.so.1` with `dlopen` and binds every entry point by name and
//! symbol version (`dlvsym`): the version a program linked against those
//! headers binds, so a later rdma-core that adds a new default version of a
//! function still gives this code the ABI it was written for. The libraries
//! stay loaded for the life of the process (device contexts and CM ids are
//! theirs). Without a library, or with one lacking an entry point, [`lib`]
//! returns the error naming it ([`RdmaError::LibraryMissing`],
//! [`RdmaError::SymbolMissing`]), every time it is asked; nothing panics.
//! The binary itself links neither library, so it starts on a host without
//! rdma-core and serves its other fabrics.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` are not exported by libibverbs: verbs.h defines them
//! as inline calls through the device context's table of provider
//! operations, and so does this module ([`ibv_post_send`] and the others).

#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::RdmaError;

/// The verbs library's soname (package libibverbs1 of rdma-core).
pub const LIBIBVERBS: &CStr = c"libibverbs.so.1";
/// The connection manager's soname (package librdmacm1 of rdma-core).
pub const LIBRDMACM: &CStr = c"librdmacm.so.1";

// ---------------------------------------------------------------------------
// libibverbs types.

/// A device of the device list. Opaque: only pointers to it.
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// A protection domain. Opaque here.
#[repr(C)]
pub struct ibv_pd {
    _opaque: [u8; 0],
}

/// An open device. Declared up to its operations table; the rest (the
/// command and async fds, the number of completion vectors, a mutex and a
/// compatibility pointer: 328 bytes in all on x86_64) is never read, and
/// contexts are only made by the library.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
}

/// The provider's operations of a device context, 32 function pointers.
/// Only the five data-path operations verbs.h calls inline are named; the
/// other slots (compatibility stubs, memory windows) are placeholders that
/// keep the named ones at their offsets.
#[repr(C)]
pub struct ibv_context_ops {
    _slots_0_10: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(cq: *mut ibv_cq, solicited: c_int) -> c_int>,
    _slots_13_19: [*mut c_void; 7],
    pub post_srq_recv: Option<
        unsafe extern "C" fn(
            srq: *mut ibv_srq,
            wr: *mut ibv_recv_wr,
            bad: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    _slots_21_24: [*mut c_void; 4],
    pub post_send: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_send_wr,
            bad: *mut *mut ibv_send_wr,
        ) -> c_int,
    >,
    pub post_recv: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_recv_wr,
            bad: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    _slots_27_31: [*mut c_void; 5],
}

/// `ibv_query_device`'s answer (whole: Rust allocates it).
#[repr(C)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// Big-endian.
    pub node_guid: u64,
    /// Big-endian.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    /// From `max_qp` to `max_srq_sge`: 29 limits of type `int` (one,
    /// `device_cap_flags`, unsigned; one, `atomic_cap`, an enum), none read.
    pub limits: [c_int; 29],
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `ibv_query_port`'s answer (whole: Rust allocates it).
#[repr(C)]
pub struct ibv_port_attr {
    /// `IBV_PORT_*` (4: active).
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*` (1: InfiniBand, 2: Ethernet).
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// A work completion (whole: Rust polls into an array of them).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    pub wr_id: u64,
    /// `IBV_WC_*` status.
    pub status: u32,
    /// `IBV_WC_*` opcode.
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (network order) or, with [`IBV_WC_WITH_INV`] in
    /// `wc_flags`, the invalidated rkey (host order): the union of
    /// `imm_data` and `invalidated_rkey` in C.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// A memory registration (whole; made by the library, its keys read).
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// A completion channel (whole; made by the library, its fd read).
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// A completion queue. Declared up to `context`, the one field read; the
/// library makes CQs.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
}

/// A queue pair. Declared up to `qp_num`; the rest (state, type, a mutex
/// and a condition variable) is never read, and the library makes QPs.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
}

/// A shared receive queue. Declared up to `context`, the one field read;
/// the library makes SRQs.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
}

/// A scatter-gather element.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A send work request (whole: Rust builds it).
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    /// `IBV_WR_*`.
    pub opcode: u32,
    /// `IBV_SEND_*`.
    pub send_flags: c_uint,
    /// Immediate data (network order) or, for [`IBV_WR_SEND_WITH_INV`],
    /// the rkey to invalidate (host order): the union of `imm_data` and
    /// `invalidate_rkey` in C.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// The `qp_type` union: an XRC remote SRQ number.
    pub remote_srqn: u32,
    /// The last union (memory-window bind or TSO, 48 bytes), never used:
    /// zero.
    pub bind_mw_or_tso: [u64; 6],
}

/// The operation-specific part of a send work request.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_rdma_wr,
    pub atomic: ibv_atomic_wr,
    pub ud: ibv_ud_wr,
}

/// RDMA READ and WRITE: the peer's memory.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rdma_wr {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// Atomics (not used; the largest member, so it sizes the union).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_atomic_wr {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// Unreliable datagram addressing (not used).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ud_wr {
    pub ah: *mut c_void,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// A receive work request (whole: Rust builds it).
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// Queue pair capacities.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// What `rdma_create_qp` is asked for (whole: Rust builds it).
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    /// `IBV_QPT_*`.
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// Shared receive queue limits.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// What `ibv_create_srq` is asked for (whole: Rust builds it).
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

// libibverbs constants (C enums: 32-bit).

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

pub const IBV_QPT_RC: u32 = 2;

pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_WR_SEND_WITH_INV: u32 = 9;

pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;

pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_LOC_LEN_ERR: u32 = 1;
pub const IBV_WC_LOC_PROT_ERR: u32 = 4;
pub const IBV_WC_WR_FLUSH_ERR: u32 = 5;
pub const IBV_WC_REM_INV_REQ_ERR: u32 = 9;
pub const IBV_WC_REM_ACCESS_ERR: u32 = 10;
pub const IBV_WC_RETRY_EXC_ERR: u32 = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: u32 = 13;

pub const IBV_WC_RDMA_WRITE: u32 = 1;
pub const IBV_WC_RDMA_READ: u32 = 2;
/// Every receive completion's opcode has this bit set.
pub const IBV_WC_RECV: u32 = 1 << 7;

/// `wc_flags`: the receive carried an invalidation; the union holds the
/// invalidated rkey.
pub const IBV_WC_WITH_INV: c_uint = 1 << 3;

// ---------------------------------------------------------------------------
// librdmacm types.

/// An event channel (whole; made by the library, its fd read).
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// A connection manager id. Declared up to `port_num`; the fields after it
/// (the last event, CQs and channels, SRQ, PD, QP type: 416 bytes in all on
/// x86_64) are never read, and the library makes ids.
#[repr(C)]
pub struct rdma_cm_id {
    /// The device the id is bound to, once it is.
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    /// `struct rdma_route` (source and destination addresses, a path
    /// record pointer and count), never read: 312 bytes, 8-aligned.
    pub route: [u64; 39],
    /// `RDMA_PS_*`.
    pub ps: u32,
    pub port_num: u8,
}

/// Connection parameters (whole: Rust builds them for connect and accept).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// A connection manager event. Declared up to the `conn` member at the
/// start of its `param` union (the union's larger `ud` member is never
/// read); the library makes events.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    /// `RDMA_CM_EVENT_*`.
    pub event: u32,
    pub status: c_int,
    /// `param.conn`: what connected-mode events carry.
    pub conn: rdma_conn_param,
}

pub const RDMA_PS_TCP: u32 = 0x0106;

pub const RDMA_CM_EVENT_ADDR_RESOLVED: u32 = 0;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: u32 = 2;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: u32 = 4;
pub const RDMA_CM_EVENT_CONNECT_ERROR: u32 = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: u32 = 7;
pub const RDMA_CM_EVENT_REJECTED: u32 = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: u32 = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: u32 = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: u32 = 11;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: u32 = 15;

// ---------------------------------------------------------------------------
// The entry points.

/// Which library an entry point is in.
#[derive(Clone, Copy)]
enum Which {
    Ibverbs = 0,
    Rdmacm = 1,
}

/// Why the libraries could not be used: kept by [`lib`] and handed out
/// as an [`RdmaError`] (which is not `Clone`) each time.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LoadError {
    Missing {
        library: &'static str,
        detail: String,
    },
    NoSymbol {
        library: &'static str,
        symbol: &'static str,
        version: &'static str,
    },
}

impl From<LoadError> for RdmaError {
    fn from(e: LoadError) -> RdmaError {
        match e {
            LoadError::Missing { library, detail } => RdmaError::LibraryMissing { library, detail },
            LoadError::NoSymbol {
                library,
                symbol,
                version,
            } => RdmaError::SymbolMissing {
                library,
                symbol,
                version,
            },
        }
    }
}

/// An opened library.
struct Library {
    name: &'static str,
    handle: *mut c_void,
}

impl Library {
    fn open(name: &'static CStr) -> Result<Library, LoadError> {
        let lossy = name.to_str().unwrap_or("(library)");
        // SAFETY: a NUL-terminated name. Opening runs the library's
        // initialisers, as linking it would.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LoadError::Missing {
                library: lossy,
                detail: dlerror(),
            });
        }
        Ok(Library {
            name: lossy,
            handle,
        })
    }

    /// The address of `symbol` (NUL-terminated) at symbol version
    /// `version` (NUL-terminated).
    fn symbol(
        &self,
        symbol: &'static str,
        version: &'static str,
    ) -> Result<*mut c_void, LoadError> {
        // SAFETY: a live handle (libraries are never closed) and two
        // NUL-terminated strings (the macro below appends the NULs).
        let p =
            unsafe { libc::dlvsym(self.handle, symbol.as_ptr().cast(), version.as_ptr().cast()) };
        if p.is_null() {
            return Err(LoadError::NoSymbol {
                library: self.name,
                symbol: symbol.trim_end_matches('\0'),
                version: version.trim_end_matches('\0'),
            });
        }
        Ok(p)
    }
}

/// The last `dlopen` error of this thread, as text.
fn dlerror() -> String {
    // SAFETY: dlerror takes no arguments; it returns null or a
    // NUL-terminated string valid until the next dl call of this thread.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return String::from("dlopen failed");
    }
    // SAFETY: as above; copied at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Declares [`Lib`] with one field per entry point and binds them.
macro_rules! entry_points {
    ($(
        $(#[$doc:meta])*
        $lib:ident $version:literal fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
    )*) => {
        /// Every libibverbs and librdmacm function the provider calls,
        /// bound once ([`lib`]). A field is called as
        /// `unsafe { (lib.ibv_alloc_pd)(ctx) }`; each keeps the C
        /// function's contract.
        pub struct Lib {
            $( $(#[$doc])* pub $name: unsafe extern "C" fn($($arg: $ty),*) $(-> $ret)?, )*
        }

        impl Lib {
            fn bind(libs: &[Library; 2]) -> Result<Lib, LoadError> {
                Ok(Lib {
                    $( $name: {
                        let p = libs[Which::$lib as usize]
                            .symbol(concat!(stringify!($name), "\0"), concat!($version, "\0"))?;
                        // SAFETY: `p` is the address of the C function of
                        // this name and symbol version, whose parameters
                        // and result are the ones declared here (verbs.h,
                        // rdma_cma.h); code and data pointers have the same
                        // size and representation where dlvsym exists.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) $(-> $ret)?>(p)
                        }
                    }, )*
                })
            }
        }
    };
}

entry_points! {
    Ibverbs "IBVERBS_1.1" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    Ibverbs "IBVERBS_1.1" fn ibv_free_device_list(list: *mut *mut ibv_device);
    Ibverbs "IBVERBS_1.1" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    /// The node GUID, big-endian.
    Ibverbs "IBVERBS_1.1" fn ibv_get_device_guid(device: *mut ibv_device) -> u64;
    Ibverbs "IBVERBS_1.1" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    Ibverbs "IBVERBS_1.1" fn ibv_close_device(context: *mut ibv_context) -> c_int;
    Ibverbs "IBVERBS_1.1" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    /// The exported function behind verbs.h's `ibv_query_port` (which,
    /// when the provider has no extended query, is what that inline calls
    /// too). It fills the first 48 bytes of the attributes, everything up
    /// to `flags`; the caller zeroes the whole struct first.
    Ibverbs "IBVERBS_1.1" fn ibv_query_port(context: *mut ibv_context, port_num: u8, attr: *mut ibv_port_attr) -> c_int;
    Ibverbs "IBVERBS_1.1" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    Ibverbs "IBVERBS_1.1" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    /// The exported registration (verbs.h's `ibv_reg_mr` macro calls it
    /// for access flags outside the optional range, as all of ours are).
    Ibverbs "IBVERBS_1.1" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr;
    Ibverbs "IBVERBS_1.1" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    Ibverbs "IBVERBS_1.0" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    Ibverbs "IBVERBS_1.0" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    Ibverbs "IBVERBS_1.1" fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    Ibverbs "IBVERBS_1.1" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    Ibverbs "IBVERBS_1.1" fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int;
    Ibverbs "IBVERBS_1.1" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint);
    Ibverbs "IBVERBS_1.1" fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    Ibverbs "IBVERBS_1.1" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;

    Rdmacm "RDMACM_1.0" fn rdma_create_event_channel() -> *mut rdma_event_channel;
    Rdmacm "RDMACM_1.0" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    Rdmacm "RDMACM_1.0" fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: u32,
    ) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src: *mut libc::sockaddr,
        dst: *mut libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_destroy_qp(id: *mut rdma_cm_id);
    Rdmacm "RDMACM_1.0" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int;
    Rdmacm "RDMACM_1.0" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context;
    Rdmacm "RDMACM_1.0" fn rdma_free_devices(list: *mut *mut ibv_context);
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("verbs::sys::Lib")
    }
}

/// Opens `ibverbs` and `rdmacm` (sonames) and binds every entry point.
fn load(ibverbs: &'static CStr, rdmacm: &'static CStr) -> Result<Lib, LoadError> {
    let libs = [Library::open(ibverbs)?, Library::open(rdmacm)?];
    Lib::bind(&libs)
}

static LOADED: OnceLock<Result<Lib, LoadError>> = OnceLock::new();

/// The entry points, loading libibverbs and librdmacm the first time; the
/// same error each time when either (or one of its entry points) is
/// missing.
pub fn lib() -> Result<&'static Lib, RdmaError> {
    match LOADED.get_or_init(|| load(LIBIBVERBS, LIBRDMACM)) {
        Ok(lib) => Ok(lib),
        Err(e) => Err(e.clone().into()),
    }
}

// ---------------------------------------------------------------------------
// verbs.h's inline data-path calls: through the provider's operations.

/// `ibv_post_send`.
///
/// # Safety
///
/// `qp` is a live queue pair; `wr` a valid chain of work requests whose
/// scatter lists are valid for the call; `bad` a valid out-pointer.
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: a live QP points to its live device context, whose operations
    // the provider set when the device was opened.
    let op = unsafe { (*(*qp).context).ops.post_send };
    match op {
        // SAFETY: the provider's own operation for this QP, with arguments
        // valid as the caller promised.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv`.
///
/// # Safety
///
/// As [`ibv_post_send`], for receives.
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as in `ibv_post_send`.
    let op = unsafe { (*(*qp).context).ops.post_recv };
    match op {
        // SAFETY: as in `ibv_post_send`.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_srq_recv`.
///
/// # Safety
///
/// `srq` is a live shared receive queue; `wr` and `bad` as in
/// [`ibv_post_recv`].
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: a live SRQ points to its live device context.
    let op = unsafe { (*(*srq).context).ops.post_srq_recv };
    match op {
        // SAFETY: the provider's operation, with valid arguments.
        Some(f) => unsafe { f(srq, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq`: completions taken (at most `n`), or a negative value on
/// error.
///
/// # Safety
///
/// `cq` is a live completion queue and `wc` has room for `n` entries.
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ points to its live device context.
    let op = unsafe { (*(*cq).context).ops.poll_cq };
    match op {
        // SAFETY: the provider's operation, with valid arguments.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// `ibv_req_notify_cq`.
///
/// # Safety
///
/// `cq` is a live completion queue.
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: a live CQ points to its live device context.
    let op = unsafe { (*(*cq).context).ops.req_notify_cq };
    match op {
        // SAFETY: the provider's operation on a live CQ.
        Some(f) => unsafe { f(cq, solicited_only) },
        None => libc::EOPNOTSUPP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The layouts this module relies on, as a C program compiled against
    /// rdma-core 44's verbs.h and rdma_cma.h printed them on x86_64 Linux
    /// (gcc 12, `sizeof`, `_Alignof`, `offsetof`). A struct declared only
    /// up to some field checks that field's offset, not its size.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn layouts_match_the_c_headers() {
        // struct ibv_context: device 0, ops 8 (cmd_fd 264; 328 in all).
        assert_eq!(offset_of!(ibv_context, device), 0);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(size_of::<ibv_context>(), 264);
        // struct ibv_context_ops: 256 bytes.
        assert_eq!(size_of::<ibv_context_ops>(), 256);
        assert_eq!(align_of::<ibv_context_ops>(), 8);
        assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
        assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
        assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 160);
        assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
        assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);

        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(align_of::<ibv_device_attr>(), 8);
        assert_eq!(offset_of!(ibv_device_attr, node_guid), 64);
        assert_eq!(offset_of!(ibv_device_attr, max_pkeys), 224);
        assert_eq!(offset_of!(ibv_device_attr, local_ca_ack_delay), 226);
        assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);

        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(align_of::<ibv_port_attr>(), 4);
        assert_eq!(offset_of!(ibv_port_attr, state), 0);
        assert_eq!(offset_of!(ibv_port_attr, max_msg_sz), 20);
        assert_eq!(offset_of!(ibv_port_attr, lid), 34);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(offset_of!(ibv_port_attr, flags), 47);
        assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);

        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(align_of::<ibv_wc>(), 8);
        assert_eq!(offset_of!(ibv_wc, status), 8);
        assert_eq!(offset_of!(ibv_wc, opcode), 12);
        assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
        assert_eq!(offset_of!(ibv_wc, byte_len), 20);
        assert_eq!(offset_of!(ibv_wc, imm_data), 24);
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_wc, src_qp), 32);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(offset_of!(ibv_wc, pkey_index), 40);
        assert_eq!(offset_of!(ibv_wc, slid), 42);
        assert_eq!(offset_of!(ibv_wc, sl), 44);
        assert_eq!(offset_of!(ibv_wc, dlid_path_bits), 45);

        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(offset_of!(ibv_mr, length), 24);
        assert_eq!(offset_of!(ibv_mr, handle), 32);
        assert_eq!(offset_of!(ibv_mr, lkey), 36);
        assert_eq!(offset_of!(ibv_mr, rkey), 40);

        assert_eq!(size_of::<ibv_comp_channel>(), 16);
        assert_eq!(offset_of!(ibv_comp_channel, fd), 8);
        assert_eq!(offset_of!(ibv_cq, context), 0);
        assert_eq!(offset_of!(ibv_qp, context), 0);
        assert_eq!(offset_of!(ibv_qp, handle), 48);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(offset_of!(ibv_srq, context), 0);

        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(align_of::<ibv_sge>(), 8);
        assert_eq!(offset_of!(ibv_sge, length), 8);
        assert_eq!(offset_of!(ibv_sge, lkey), 12);

        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(align_of::<ibv_send_wr>(), 8);
        assert_eq!(offset_of!(ibv_send_wr, next), 8);
        assert_eq!(offset_of!(ibv_send_wr, sg_list), 16);
        assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
        assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
        assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
        assert_eq!(offset_of!(ibv_send_wr, imm_data), 36);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(size_of::<ibv_send_wr_wr>(), 32);
        assert_eq!(offset_of!(ibv_rdma_wr, rkey), 8);
        assert_eq!(offset_of!(ibv_atomic_wr, rkey), 24);
        assert_eq!(offset_of!(ibv_send_wr, remote_srqn), 72);
        assert_eq!(offset_of!(ibv_send_wr, bind_mw_or_tso), 80);

        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(offset_of!(ibv_recv_wr, next), 8);
        assert_eq!(offset_of!(ibv_recv_wr, sg_list), 16);
        assert_eq!(offset_of!(ibv_recv_wr, num_sge), 24);

        assert_eq!(size_of::<ibv_qp_cap>(), 20);
        assert_eq!(align_of::<ibv_qp_cap>(), 4);
        assert_eq!(offset_of!(ibv_qp_cap, max_inline_data), 16);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(offset_of!(ibv_qp_init_attr, send_cq), 8);
        assert_eq!(offset_of!(ibv_qp_init_attr, recv_cq), 16);
        assert_eq!(offset_of!(ibv_qp_init_attr, srq), 24);
        assert_eq!(offset_of!(ibv_qp_init_attr, cap), 32);
        assert_eq!(offset_of!(ibv_qp_init_attr, qp_type), 52);
        assert_eq!(offset_of!(ibv_qp_init_attr, sq_sig_all), 56);

        assert_eq!(size_of::<ibv_srq_attr>(), 12);
        assert_eq!(offset_of!(ibv_srq_attr, srq_limit), 8);
        assert_eq!(size_of::<ibv_srq_init_attr>(), 24);
        assert_eq!(offset_of!(ibv_srq_init_attr, attr), 8);

        assert_eq!(size_of::<rdma_event_channel>(), 4);
        assert_eq!(offset_of!(rdma_event_channel, fd), 0);
        // struct rdma_cm_id: route 32 (312 bytes), ps 344, port_num 348
        // (416 in all).
        assert_eq!(offset_of!(rdma_cm_id, verbs), 0);
        assert_eq!(offset_of!(rdma_cm_id, channel), 8);
        assert_eq!(offset_of!(rdma_cm_id, context), 16);
        assert_eq!(offset_of!(rdma_cm_id, qp), 24);
        assert_eq!(offset_of!(rdma_cm_id, route), 32);
        assert_eq!(size_of::<[u64; 39]>(), 312);
        assert_eq!(offset_of!(rdma_cm_id, ps), 344);
        assert_eq!(offset_of!(rdma_cm_id, port_num), 348);

        assert_eq!(size_of::<rdma_conn_param>(), 24);
        assert_eq!(align_of::<rdma_conn_param>(), 8);
        assert_eq!(offset_of!(rdma_conn_param, private_data_len), 8);
        assert_eq!(offset_of!(rdma_conn_param, responder_resources), 9);
        assert_eq!(offset_of!(rdma_conn_param, initiator_depth), 10);
        assert_eq!(offset_of!(rdma_conn_param, flow_control), 11);
        assert_eq!(offset_of!(rdma_conn_param, retry_count), 12);
        assert_eq!(offset_of!(rdma_conn_param, rnr_retry_count), 13);
        assert_eq!(offset_of!(rdma_conn_param, srq), 14);
        assert_eq!(offset_of!(rdma_conn_param, qp_num), 16);
        // struct rdma_cm_event: param at 24 (80 in all).
        assert_eq!(offset_of!(rdma_cm_event, listen_id), 8);
        assert_eq!(offset_of!(rdma_cm_event, event), 16);
        assert_eq!(offset_of!(rdma_cm_event, status), 20);
        assert_eq!(offset_of!(rdma_cm_event, conn), 24);
    }

    /// The enum values, as the same C program printed them;
    /// `IBV_WR_SEND_WITH_INV` and `IBV_WC_WITH_INV` as verbs.h declares
    /// them (tenth member of `enum ibv_wr_opcode`, `1 << 3` in
    /// `enum ibv_wc_flags`).
    #[test]
    fn constants_match_the_c_headers() {
        assert_eq!(
            [
                IBV_WC_SUCCESS,
                IBV_WC_LOC_LEN_ERR,
                IBV_WC_LOC_PROT_ERR,
                IBV_WC_WR_FLUSH_ERR,
                IBV_WC_REM_INV_REQ_ERR,
                IBV_WC_REM_ACCESS_ERR,
                IBV_WC_RETRY_EXC_ERR,
                IBV_WC_RNR_RETRY_EXC_ERR
            ],
            [0, 1, 4, 5, 9, 10, 12, 13]
        );
        assert_eq!(
            [IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_RECV],
            [1, 2, 128]
        );
        assert_eq!(
            [
                IBV_WR_RDMA_WRITE,
                IBV_WR_SEND,
                IBV_WR_RDMA_READ,
                IBV_WR_SEND_WITH_INV
            ],
            [0, 2, 4, 9]
        );
        assert_eq!(IBV_WC_WITH_INV, 8);
        assert_eq!(IBV_SEND_SIGNALED, 2);
        assert_eq!(
            [
                IBV_ACCESS_LOCAL_WRITE,
                IBV_ACCESS_REMOTE_WRITE,
                IBV_ACCESS_REMOTE_READ
            ],
            [1, 2, 4]
        );
        assert_eq!(IBV_QPT_RC, 2);
        assert_eq!(RDMA_PS_TCP, 0x106);
        assert_eq!(
            [
                RDMA_CM_EVENT_ADDR_RESOLVED,
                RDMA_CM_EVENT_ROUTE_RESOLVED,
                RDMA_CM_EVENT_CONNECT_REQUEST,
                RDMA_CM_EVENT_CONNECT_ERROR,
                RDMA_CM_EVENT_UNREACHABLE,
                RDMA_CM_EVENT_REJECTED,
                RDMA_CM_EVENT_ESTABLISHED,
                RDMA_CM_EVENT_DISCONNECTED,
                RDMA_CM_EVENT_DEVICE_REMOVAL,
                RDMA_CM_EVENT_TIMEWAIT_EXIT
            ],
            [0, 2, 4, 6, 7, 8, 9, 10, 11, 15]
        );
    }

    #[test]
    fn a_missing_library_is_named() {
        let e = load(c"libferrite-no-such-verbs.so.1", LIBRDMACM).unwrap_err();
        let LoadError::Missing { library, detail } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*library, "libferrite-no-such-verbs.so.1");
        assert!(detail.contains("libferrite-no-such-verbs.so.1"), "{detail}");
        let text = RdmaError::from(e).to_string();
        assert!(
            text.starts_with(
                "libferrite-no-such-verbs.so.1 not found (install rdma-core / libibverbs1 and librdmacm1)"
            ),
            "{text}"
        );
        // The connection manager missing beside libibverbs: named (or
        // libibverbs, on a machine without rdma-core at all).
        match load(LIBIBVERBS, c"libferrite-no-such-rdmacm.so.1") {
            Err(LoadError::Missing { library, .. }) => assert!(
                library == "libferrite-no-such-rdmacm.so.1" || library == "libibverbs.so.1",
                "{library}"
            ),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("loaded a library that does not exist"),
        }
    }

    #[test]
    fn a_library_without_an_entry_point_is_named() {
        // The C library opens but has none of the verbs.
        let e = load(c"libc.so.6", c"libc.so.6").unwrap_err();
        assert_eq!(
            e,
            LoadError::NoSymbol {
                library: "libc.so.6",
                symbol: "ibv_get_device_list",
                version: "IBVERBS_1.1",
            }
        );
        let text = RdmaError::from(e).to_string();
        assert!(
            text.contains("libc.so.6 has no ibv_get_device_list"),
            "{text}"
        );
    }

    /// With rdma-core installed every entry point binds; without it the
    /// error names the library (and stays the same on every call).
    #[test]
    fn the_installed_libraries_bind_or_are_named_missing() {
        match lib() {
            Ok(_) => {}
            Err(RdmaError::LibraryMissing { library, detail }) => {
                eprintln!("{library} not installed here ({detail}): checked the error only");
                assert!(matches!(lib(), Err(RdmaError::LibraryMissing { .. })));
            }
            Err(e) => panic!("rdma-core installed but not usable: {e}"),
        }
    }
}
