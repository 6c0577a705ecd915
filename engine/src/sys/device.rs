//! Devices, device contexts, and device/port/GID queries.

use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::ffi;
use crate::error::{last_os_error, Error, Result};

/// The name and node GUID of one RDMA device, as `ibv_devices` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's name (`mlx5_0`, `rxe0`): what the `device` arguments
    /// and settings name.
    pub name: String,
    /// The device's node GUID, in host byte order.
    pub guid: u64,
}

/// Every RDMA device the kernel exposes through uverbs.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let list = DeviceList::get()?;
    Ok(list
        .iter()
        .map(|dev| DeviceInfo {
            name: device_name(dev),
            guid: device_guid(dev),
        })
        .collect())
}

/// The list from `ibv_get_device_list`, freed on drop.
struct DeviceList {
    ptr: *mut *mut ffi::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self> {
        let mut n = 0;
        // SAFETY: n is a valid out-pointer; the returned array is owned by us
        // until ibv_free_device_list.
        let ptr = unsafe { ffi::ibv_get_device_list(&mut n) };
        if ptr.is_null() {
            let err = last_os_error();
            // ENOSYS: no uverbs in the kernel at all; that is "no device" too.
            return match err.raw_os_error() {
                Some(libc::ENOSYS) => Err(Error::NoDevice),
                _ => Err(Error::GetDeviceList(err)),
            };
        }
        Ok(DeviceList {
            ptr,
            len: n.max(0) as usize,
        })
    }

    fn iter(&self) -> impl Iterator<Item = *mut ffi::ibv_device> + '_ {
        // SAFETY: the array holds `len` valid device pointers while self lives.
        (0..self.len).map(move |i| unsafe { *self.ptr.add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: ptr came from ibv_get_device_list and is freed exactly once.
        unsafe { ffi::ibv_free_device_list(self.ptr) };
    }
}

fn device_name(dev: *mut ffi::ibv_device) -> String {
    // SAFETY: dev is a live entry of a device list; its name is a
    // NUL-terminated string inside the device struct.
    unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }
        .to_string_lossy()
        .into_owned()
}

fn device_guid(dev: *mut ffi::ibv_device) -> u64 {
    // SAFETY: dev is a live entry of a device list.
    u64::from_be(unsafe { ffi::ibv_get_device_guid(dev) })
}

/// An open device context (`ibv_context`).
///
/// Contexts opened here are closed on drop. Contexts that belong to
/// librdmacm (an `rdma_cm_id`'s `verbs`) are borrowed: they live as long as
/// the CM id that `keepalive` holds.
pub struct Context {
    ptr: *mut ffi::ibv_context,
    name: String,
    owned: bool,
    _keepalive: Option<Arc<dyn Send + Sync>>,
}

// SAFETY: an ibv_context may be used from any thread; libibverbs serialises
// the calls that need it.
unsafe impl Send for Context {}
// SAFETY: as above; all methods take &self and the verbs behind them are
// thread-safe per ibv_open_device(3).
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.name)
            .finish()
    }
}

impl Context {
    /// Opens the device called `name`, or the first device whose port 1 is
    /// active when `name` is `None`.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>> {
        let list = DeviceList::get()?;
        if list.len == 0 {
            return Err(Error::NoDevice);
        }
        match name {
            Some(wanted) => {
                let dev = list
                    .iter()
                    .find(|d| device_name(*d) == wanted)
                    .ok_or_else(|| Error::DeviceNotFound {
                        name: wanted.to_owned(),
                        available: list.iter().map(device_name).collect::<Vec<_>>().join(", "),
                    })?;
                Self::open_device(dev)
            }
            None => {
                for dev in list.iter() {
                    let ctx = Self::open_device(dev)?;
                    if ctx.query_port(1).map(|p| p.is_active()).unwrap_or(false) {
                        return Ok(ctx);
                    }
                }
                Err(Error::NoActivePort)
            }
        }
    }

    /// [`Context::open`], but librdmacm's own context of the device: a
    /// queue pair on an `rdma_cm_id` can only be made in a PD of it (a
    /// poller that takes rdma_cm joins).
    pub(crate) fn open_of_rdma_cm(name: Option<&str>) -> Result<Arc<Context>> {
        let devices = super::cm::CmDevices::get()?;
        let contexts: Vec<Arc<Context>> = devices
            .iter()
            .map(|ptr| Context::borrowed(ptr, Arc::clone(&devices) as Arc<dyn Send + Sync>))
            .collect();
        if contexts.is_empty() {
            return Err(Error::NoDevice);
        }
        let found = match name {
            Some(wanted) => contexts.iter().find(|c| c.name() == wanted),
            None => contexts
                .iter()
                .find(|c| c.query_port(1).map(|p| p.is_active()).unwrap_or(false)),
        };
        match (found, name) {
            (Some(ctx), _) => Ok(Arc::clone(ctx)),
            (None, Some(wanted)) => Err(Error::DeviceNotFound {
                name: wanted.to_owned(),
                available: contexts
                    .iter()
                    .map(|c| c.name().to_owned())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            (None, None) => Err(Error::NoActivePort),
        }
    }

    fn open_device(dev: *mut ffi::ibv_device) -> Result<Arc<Context>> {
        let name = device_name(dev);
        // SAFETY: dev is a live entry of the device list, which is still
        // alive; the context stays valid after the list is freed.
        let ptr = unsafe { ffi::ibv_open_device(dev) };
        if ptr.is_null() {
            return Err(Error::OpenDevice {
                device: name,
                source: last_os_error(),
            });
        }
        set_nonblocking_async_fd(ptr);
        Ok(Arc::new(Context {
            ptr,
            name,
            owned: true,
            _keepalive: None,
        }))
    }

    /// Wraps a context that librdmacm owns, keeping its owner alive.
    pub(crate) fn borrowed(
        ptr: *mut ffi::ibv_context,
        keepalive: Arc<dyn Send + Sync>,
    ) -> Arc<Context> {
        // SAFETY: ptr is the live verbs context of a CM id that `keepalive`
        // keeps alive; its device pointer and name are valid meanwhile.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name((*ptr).device)) }
            .to_string_lossy()
            .into_owned();
        set_nonblocking_async_fd(ptr);
        Arc::new(Context {
            ptr,
            name,
            owned: false,
            _keepalive: Some(keepalive),
        })
    }

    /// The device's name (`mlx5_0`, `rxe0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next asynchronous event of the device (port errors, fatal
    /// device or QP errors), if one is queued; acknowledged on receipt.
    /// Never blocks. Events are per device context: with several
    /// connections sharing one (rdma_cm's), each event reaches one reader.
    /// The async fd is asked first (`poll`, zero timeout), so the library
    /// is entered only when an event is there: every wait's slow turn and
    /// the engine's worker call this, on the data path.
    pub(crate) fn try_async_event(&self) -> Result<Option<AsyncEvent>> {
        // SAFETY: ptr is a live context; async_fd is its open descriptor.
        let fd = unsafe { (*self.ptr).async_fd };
        if !fd_ready(fd, 0).map_err(Error::QueryDevice)? {
            return Ok(None);
        }
        let mut raw = RawAsyncEvent {
            element: 0,
            event_type: 0,
        };
        // SAFETY: ptr is a live context whose async fd is non-blocking;
        // RawAsyncEvent has ibv_async_event's layout (an 8-byte union, then
        // the enum as u32), read as plain integers so an unknown event type
        // is not an invalid Rust enum.
        let rc = unsafe {
            ffi::ibv_get_async_event(
                self.ptr,
                (&mut raw as *mut RawAsyncEvent).cast::<ffi::ibv_async_event>(),
            )
        };
        if rc != 0 {
            let err = last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) => Ok(None),
                _ => Err(Error::QueryDevice(err)),
            };
        }
        // SAFETY: the event was filled by ibv_get_async_event and is
        // acknowledged exactly once.
        unsafe {
            ffi::ibv_ack_async_event(
                (&mut raw as *mut RawAsyncEvent).cast::<ffi::ibv_async_event>(),
            )
        };
        Ok(Some(AsyncEvent {
            kind: raw.event_type,
            element: raw.element,
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.ptr
    }

    /// The device's limits and identity (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: ptr is a live context and attr a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_device(self.ptr, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::QueryDevice(crate::error::errno(rc)));
        }
        // SAFETY: ibv_query_device filled the struct; zeroed is also valid.
        let a = unsafe { attr.assume_init() };
        let count = |n: i32| n.max(0) as u32;
        Ok(DeviceAttr {
            max_qp: count(a.max_qp),
            max_cq: count(a.max_cq),
            max_mr: count(a.max_mr),
            max_pd: count(a.max_pd),
            max_srq: count(a.max_srq),
            max_srq_wr: count(a.max_srq_wr),
            max_qp_wr: a.max_qp_wr.max(0) as u32,
            max_sge: a.max_sge.max(0) as u32,
            max_cqe: a.max_cqe.max(0) as u32,
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: a.max_qp_rd_atom.max(0) as u32,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom.max(0) as u32,
            phys_port_cnt: a.phys_port_cnt,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
        })
    }

    /// What `ibv_query_port` says about `port` (1-based) now.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        // SAFETY: ptr is a live context and attr a valid out-pointer of the
        // full struct (the compat fallback fills a zeroed prefix of it).
        let rc = unsafe { ffi::ibv_query_port(self.ptr, port, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::QueryPort {
                port,
                source: crate::error::errno(rc),
            });
        }
        // SAFETY: filled by the query or zero, both valid for this POD struct.
        let a = unsafe { attr.assume_init() };
        Ok(PortAttr {
            state: a.state,
            active_mtu: a.active_mtu,
            max_mtu: a.max_mtu,
            lid: a.lid,
            gid_tbl_len: a.gid_tbl_len.max(0) as u32,
            link_layer: a.link_layer,
            max_msg_sz: a.max_msg_sz,
        })
    }

    /// Entry `index` of `port`'s GID table, 16 bytes in network order
    /// (`ibv_query_gid`). An unpopulated entry reads as zeros or fails,
    /// depending on the device.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let mut gid = MaybeUninit::<ffi::ibv_gid>::zeroed();
        // SAFETY: ptr is a live context and gid a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_gid(self.ptr, port, index as i32, gid.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::QueryGid {
                port,
                index,
                source: last_os_error(),
            });
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(unsafe { gid.assume_init().raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we opened this context and every child (PD, CQ, ...)
            // holds an Arc of it, so none is alive any more.
            let rc = unsafe { ffi::ibv_close_device(self.ptr) };
            if rc != 0 {
                tracing::warn!(device = %self.name, error = %last_os_error(), "ibv_close_device failed");
            }
        }
    }
}

/// `struct ibv_async_event` with the event type as a plain integer.
#[repr(C)]
struct RawAsyncEvent {
    element: u64,
    event_type: u32,
}

/// Whether `fd` has something to read (or an error to report), waiting at
/// most `timeout_ms` (0: just look). An interrupted wait counts as "not
/// yet". A look is one system call and allocates nothing — unlike
/// `rdma_get_cm_event`, which mallocs on every call, event or not — so the
/// event calls are entered only once this says yes.
pub(super) fn fd_ready(fd: RawFd, timeout_ms: i32) -> std::io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: pfd is one valid, writable pollfd and the count says one.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if rc < 0 {
        let err = last_os_error();
        return match err.kind() {
            std::io::ErrorKind::Interrupted => Ok(false),
            _ => Err(err),
        };
    }
    // POLLERR, POLLHUP or POLLNVAL count as ready too: the library call
    // that follows reports what is wrong with the fd.
    Ok(rc > 0 && pfd.revents != 0)
}

/// Makes `ibv_get_async_event` return EAGAIN instead of blocking.
fn set_nonblocking_async_fd(ctx: *mut ffi::ibv_context) {
    // SAFETY: ctx is a live context; async_fd is its open descriptor.
    let fd = unsafe { (*ctx).async_fd };
    if let Err(e) = set_nonblocking(fd) {
        tracing::warn!(error = %e, "cannot make the async event fd non-blocking");
    }
}

/// Sets `O_NONBLOCK` on `fd`, an open descriptor of the caller's.
pub(super) fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller keeps open for the call.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(last_os_error())
    }
}

/// An asynchronous device event (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: u32,
    /// The QP/CQ pointer or port number the event is about.
    element: u64,
}

impl AsyncEvent {
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ERR: u32 = 10;
    /// A shared receive queue holds fewer receives than its armed limit.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "issue 25's poller builds on it; only its device tests use it yet"
        )
    )]
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    /// A queue pair on a shared receive queue, in ERR, will take no more of
    /// its receives.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "issue 25's poller builds on it; only its device tests use it yet"
        )
    )]
    pub const QP_LAST_WQE_REACHED: u32 = 16;

    /// Whether the event is about the QP, CQ or SRQ whose handle is
    /// `element`.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "issue 25's poller builds on it; only its device tests use it yet"
        )
    )]
    pub(crate) fn is_about(&self, element: *const std::ffi::c_void) -> bool {
        self.element == element as u64
    }

    pub fn name(&self) -> &'static str {
        const NAMES: [&str; 20] = [
            "CQ_ERR",
            "QP_FATAL",
            "QP_REQ_ERR",
            "QP_ACCESS_ERR",
            "COMM_EST",
            "SQ_DRAINED",
            "PATH_MIG",
            "PATH_MIG_ERR",
            "DEVICE_FATAL",
            "PORT_ACTIVE",
            "PORT_ERR",
            "LID_CHANGE",
            "PKEY_CHANGE",
            "SM_CHANGE",
            "SRQ_ERR",
            "SRQ_LIMIT_REACHED",
            "QP_LAST_WQE_REACHED",
            "CLIENT_REREGISTER",
            "GID_CHANGE",
            "WQ_FATAL",
        ];
        NAMES.get(self.kind as usize).copied().unwrap_or("UNKNOWN")
    }

    /// Whether the event ends every connection on the device or port
    /// (`PORT_ERR`, `DEVICE_FATAL`), or the one whose QP it names
    /// (`QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`, `CQ_ERR`).
    pub fn ends_connection(&self, qp: *const std::ffi::c_void) -> bool {
        match self.kind {
            Self::PORT_ERR | Self::DEVICE_FATAL => true,
            0..=3 => self.element == qp as u64 || self.kind == 0,
            _ => false,
        }
    }
}

/// A device's limits, as `ibv_query_device` reports them (the doctor,
/// `pinpoll-tune doctor`, checks profiles against them).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// The most queue pairs the device holds at once (every process's).
    pub max_qp: u32,
    /// The most completion queues the device holds at once.
    pub max_cq: u32,
    /// The most memory regions the device holds at once.
    pub max_mr: u32,
    /// The most protection domains the device holds at once.
    pub max_pd: u32,
    /// The most shared receive queues the device holds at once (0: none).
    pub max_srq: u32,
    /// The most receives one shared receive queue may hold.
    pub max_srq_wr: u32,
    /// The most work requests one queue of a queue pair may hold.
    pub max_qp_wr: u32,
    /// The most scatter/gather entries one work request may carry.
    pub max_sge: u32,
    /// The most entries one completion queue may hold.
    pub max_cqe: u32,
    /// The largest memory region the device registers, in bytes.
    pub max_mr_size: u64,
    /// The most RDMA READs (and atomics) a queue pair may serve for its
    /// peer at once.
    pub max_qp_rd_atom: u32,
    /// The most RDMA READs (and atomics) a queue pair may have outstanding
    /// as their initiator.
    pub max_qp_init_rd_atom: u32,
    /// Physical ports of the device, numbered from 1.
    pub phys_port_cnt: u8,
    /// The vendor's IEEE organisation id (0x02c9 for Mellanox).
    pub vendor_id: u32,
    /// The vendor's id for the device model.
    pub vendor_part_id: u32,
}

/// What `ibv_query_port` says about one port.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// `enum ibv_port_state` (4 = ACTIVE); [`state_name`](PortAttr::state_name)
    /// names it.
    pub state: u32,
    /// `enum ibv_mtu`: 1 = 256 B ... 5 = 4096 B.
    pub active_mtu: u32,
    /// The largest MTU the port supports, as `enum ibv_mtu` ([`mtu_bytes`]
    /// converts it).
    pub max_mtu: u32,
    /// The port's LID on InfiniBand; 0 on RoCE, which has none.
    pub lid: u16,
    /// Entries in the port's GID table, populated or not.
    pub gid_tbl_len: u32,
    /// 1 = InfiniBand, 2 = Ethernet (RoCE); 0 = unspecified (treated as IB).
    pub link_layer: u8,
    /// The largest message the port carries, in bytes.
    pub max_msg_sz: u32,
}

impl PortAttr {
    /// Whether the port is ACTIVE, as an endpoint's port must be.
    pub fn is_active(&self) -> bool {
        self.state == ffi::ibv_port_state::IBV_PORT_ACTIVE
    }

    /// Whether the link layer is Ethernet (RoCE: queue pairs route by
    /// GID); otherwise it is InfiniBand.
    pub fn is_ethernet(&self) -> bool {
        self.link_layer == LINK_LAYER_ETHERNET
    }

    /// The state's verbs name (`DOWN`, `INIT`, `ARMED`, `ACTIVE`, ...);
    /// `UNKNOWN` for a value outside the enum.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            0 => "NOP",
            1 => "DOWN",
            2 => "INIT",
            3 => "ARMED",
            4 => "ACTIVE",
            5 => "ACTIVE_DEFER",
            _ => "UNKNOWN",
        }
    }
}

/// Bytes of an `enum ibv_mtu` value.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// `IBV_LINK_LAYER_ETHERNET` (an anonymous enum bindgen does not export).
const LINK_LAYER_ETHERNET: u8 = 2;
