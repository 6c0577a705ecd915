//! librdmacm: event channels and CM ids. Every event is copied out and
//! acknowledged at once, so no id is ever destroyed with an event unacked
//! (which would block `rdma_destroy_id` forever).

use std::ffi::CString;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use super::device::{fd_ready, Context};
use super::ffi;
use crate::error::{last_os_error, Error, Result};

/// CM event kinds (`enum rdma_cm_event_type`), named for matching.
pub mod event {
    pub const ADDR_RESOLVED: u32 = 0;
    pub const ADDR_ERROR: u32 = 1;
    pub const ROUTE_RESOLVED: u32 = 2;
    pub const ROUTE_ERROR: u32 = 3;
    pub const CONNECT_REQUEST: u32 = 4;
    pub const CONNECT_ERROR: u32 = 6;
    pub const UNREACHABLE: u32 = 7;
    pub const REJECTED: u32 = 8;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
    pub const DEVICE_REMOVAL: u32 = 11;
}

/// `RDMA_OPTION_ID` / `RDMA_OPTION_ID_ACK_TIMEOUT` (anonymous enums in
/// `<rdma/rdma_cma.h>` that bindgen does not export).
const RDMA_OPTION_ID: i32 = 0;
const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;

/// An `rdma_event_channel` with a non-blocking fd, so waits can be bounded.
pub struct EventChannel {
    ptr: *mut ffi::rdma_event_channel,
}

// SAFETY: the channel is a kernel fd plus a small struct; librdmacm allows
// getting events from any thread.
unsafe impl Send for EventChannel {}
// SAFETY: as above; rdma_get_cm_event on one channel from several threads is
// allowed (each event goes to one caller).
unsafe impl Sync for EventChannel {}

/// A CM event, copied out of librdmacm and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    pub kind: u32,
    pub status: i32,
    pub private_data: Vec<u8>,
    /// For CONNECT_REQUEST: the new id, which the receiver now owns.
    pub(crate) new_id: Option<*mut ffi::rdma_cm_id>,
    /// The tag its owner set on the id the event is about
    /// ([`CmId::set_tag`]; 0 if none): how a poller with one channel for
    /// many ids tells whose event it is.
    pub(crate) tag: u64,
    /// Responder resources / initiator depth the peer offered (connect events).
    pub responder_resources: u8,
    pub initiator_depth: u8,
}

// SAFETY: the only raw pointer is the id of a CONNECT_REQUEST, a handle
// this event's receiver owns (librdmacm allows using an id from any
// thread); moving the event moves that ownership with it.
unsafe impl Send for CmEvent {}

impl CmEvent {
    pub fn name(&self) -> &'static str {
        super::cm_event_str(self.kind)
    }
}

impl EventChannel {
    pub fn new() -> Result<Arc<EventChannel>> {
        // SAFETY: no preconditions; checked for NULL.
        let ptr = unsafe { ffi::rdma_create_event_channel() };
        if ptr.is_null() {
            let source = last_os_error();
            return Err(match source.raw_os_error() {
                // No uverbs/rdma_cm device at all: say how to get one.
                Some(libc::ENODEV) | Some(libc::ENOENT) => Error::NoDevice,
                _ => Error::Cm {
                    op: "rdma_create_event_channel (is the rdma_ucm module loaded?)",
                    source,
                },
            });
        }
        let chan = EventChannel { ptr };
        let fd = chan.fd();
        // SAFETY: fd is the channel's open descriptor.
        let rc = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK)
        };
        if rc != 0 {
            return Err(Error::Cm {
                op: "fcntl(O_NONBLOCK) on the event channel",
                source: last_os_error(),
            });
        }
        Ok(Arc::new(chan))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: ptr is a live channel.
        unsafe { (*self.ptr).fd }
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::rdma_event_channel {
        self.ptr
    }

    /// The next event if one is queued; never blocks. The channel's fd is
    /// asked first (`poll`, zero timeout): `rdma_get_cm_event` mallocs and
    /// writes to the fd on every call, event or not, and every wait's slow
    /// turn and the engine's worker call this to check on the peer — on the
    /// data path, which must not allocate.
    pub fn try_event(&self) -> Result<Option<CmEvent>> {
        if !fd_ready(self.fd(), 0).map_err(poll_error)? {
            return Ok(None);
        }
        self.take_event()
    }

    /// Whether an event is queued (the fd is readable); never blocks,
    /// allocates nothing.
    pub(crate) fn has_event(&self) -> Result<bool> {
        fd_ready(self.fd(), 0).map_err(poll_error)
    }

    /// The next event, waiting at most until `deadline`.
    pub fn next_event(&self, what: &'static str, deadline: Instant) -> Result<CmEvent> {
        let start = Instant::now();
        loop {
            if let Some(ev) = self.take_event()? {
                return Ok(ev);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what,
                    waited: now.saturating_duration_since(start),
                });
            }
            let ms = deadline
                .saturating_duration_since(now)
                .as_millis()
                .clamp(1, i32::MAX as u128) as i32;
            fd_ready(self.fd(), ms).map_err(poll_error)?;
        }
    }

    /// `rdma_get_cm_event` once: the event, or `None` on EAGAIN.
    fn take_event(&self) -> Result<Option<CmEvent>> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: ptr is live, raw a valid out-pointer; the fd is
        // non-blocking, so an empty channel returns EAGAIN instead of blocking.
        let rc = unsafe { ffi::rdma_get_cm_event(self.ptr, &mut raw) };
        if rc == 0 {
            // SAFETY: raw is the event librdmacm just handed us; we copy
            // what we need and acknowledge it exactly once.
            return Ok(Some(unsafe { copy_and_ack(raw) }));
        }
        let err = last_os_error();
        if err.raw_os_error() == Some(libc::EAGAIN) {
            Ok(None)
        } else {
            Err(Error::Cm {
                op: "rdma_get_cm_event",
                source: err,
            })
        }
    }
}

fn poll_error(source: std::io::Error) -> Error {
    Error::Cm {
        op: "poll on the event channel",
        source,
    }
}

/// # Safety
/// `raw` must be an unacknowledged event from `rdma_get_cm_event`.
unsafe fn copy_and_ack(raw: *mut ffi::rdma_cm_event) -> CmEvent {
    // SAFETY: raw is a live event (caller's contract).
    let ev = unsafe { &*raw };
    // SAFETY: for connection events the union holds `conn`; for others we
    // only read fields that are zero. private_data points at
    // private_data_len bytes owned by the event until it is acked.
    let (private_data, rr) = unsafe {
        let conn = ev.param.conn;
        let data = if conn.private_data.is_null() || conn.private_data_len == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(
                conn.private_data.cast::<u8>(),
                conn.private_data_len as usize,
            )
            .to_vec()
        };
        (data, (conn.responder_resources, conn.initiator_depth))
    };
    let is_request = ev.event == event::CONNECT_REQUEST;
    // SAFETY: the event's id is live until the event is acked (an id is
    // destroyed only after every event reported for it was acked, and
    // events we take are acked here); `context` is the owner's field,
    // which librdmacm never writes after creating the id.
    let tag = unsafe { (*ev.id).context } as u64;
    let out = CmEvent {
        kind: ev.event,
        status: ev.status,
        private_data,
        new_id: is_request.then_some(ev.id),
        tag,
        responder_resources: rr.0,
        initiator_depth: rr.1,
    };
    // SAFETY: acknowledged exactly once, after the last read of it.
    unsafe { ffi::rdma_ack_cm_event(raw) };
    out
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every CM id on this channel holds an Arc of it, so none is
        // alive; every event was acked on receipt.
        unsafe { ffi::rdma_destroy_event_channel(self.ptr) };
    }
}

/// An `rdma_cm_id` (port space TCP, i.e. RC). Holds its event channel alive.
pub struct CmId {
    ptr: *mut ffi::rdma_cm_id,
    channel: std::sync::Mutex<Arc<EventChannel>>,
}

// SAFETY: a CM id may be used from any thread; librdmacm locks internally.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    pub fn new(channel: &Arc<EventChannel>) -> Result<Arc<CmId>> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: channel is live; ptr a valid out-pointer.
        let rc = unsafe {
            ffi::rdma_create_id(
                channel.as_ptr(),
                &mut ptr,
                std::ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::Cm {
                op: "rdma_create_id",
                source: last_os_error(),
            });
        }
        Ok(Arc::new(CmId {
            ptr,
            channel: std::sync::Mutex::new(Arc::clone(channel)),
        }))
    }

    /// Takes ownership of the id a CONNECT_REQUEST carried, and moves it to
    /// its own channel so its events never mix with the listener's.
    pub fn from_request(ev: &CmEvent, channel: &Arc<EventChannel>) -> Result<Arc<CmId>> {
        let ptr = ev.new_id.ok_or(Error::Cm {
            op: "taking the id of a connect request",
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        // SAFETY: ptr is the new id of a CONNECT_REQUEST we received and
        // acked; nobody else owns it. Migration moves its future events.
        let rc = unsafe { ffi::rdma_migrate_id(ptr, channel.as_ptr()) };
        let id = CmId {
            ptr,
            channel: std::sync::Mutex::new(Arc::clone(channel)),
        };
        if rc != 0 {
            // Dropping `id` destroys the request's id; the peer sees a reject.
            return Err(Error::Cm {
                op: "rdma_migrate_id",
                source: last_os_error(),
            });
        }
        Ok(Arc::new(id))
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::rdma_cm_id {
        self.ptr
    }

    /// Moves the id's future events to `channel` (a poller's one channel
    /// for all its ids). Events already taken were acked at once, which
    /// `rdma_migrate_id` waits for.
    pub(crate) fn migrate(&self, channel: &Arc<EventChannel>) -> Result<()> {
        let mut held = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: ptr and the channel are live; the old channel stays
        // alive (held) until the call returns.
        let rc = unsafe { ffi::rdma_migrate_id(self.ptr, channel.as_ptr()) };
        self.check("rdma_migrate_id", rc)?;
        *held = Arc::clone(channel);
        Ok(())
    }

    /// Sets the tag every later event of this id carries
    /// ([`CmEvent::tag`]), if `id` is the only handle of the id; `false`,
    /// and nothing set, otherwise.
    pub(crate) fn set_tag(id: &mut Arc<CmId>, tag: u64) -> bool {
        let Some(only) = Arc::get_mut(id) else {
            return false;
        };
        // SAFETY: ptr is live; `context` is the owner's field, which
        // librdmacm never writes after creating the id, and which
        // `copy_and_ack` reads when it takes one of the id's events. The
        // handle is unique (`&mut` to the one `Arc`), so no other thread
        // holds this id to migrate it or take its events meanwhile (a
        // request's id is on a channel of its own, `Listener::take_request`).
        unsafe { (*only.ptr).context = tag as usize as *mut std::ffi::c_void };
        true
    }

    pub fn channel(&self) -> Arc<EventChannel> {
        Arc::clone(&self.channel.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The device context librdmacm bound this id to (after address
    /// resolution, bind to a device address, or a connect request).
    pub fn context(self: &Arc<Self>) -> Option<Arc<Context>> {
        // SAFETY: ptr is live; verbs is NULL or a context librdmacm keeps
        // open while the id exists.
        let verbs = unsafe { (*self.ptr).verbs };
        (!verbs.is_null())
            .then(|| Context::borrowed(verbs, Arc::clone(self) as Arc<dyn Send + Sync>))
    }

    /// The port of the device this id is bound to.
    pub fn port_num(&self) -> u8 {
        // SAFETY: ptr is live.
        unsafe { (*self.ptr).port_num }
    }

    fn check(&self, op: &'static str, rc: i32) -> Result<()> {
        if rc != 0 {
            return Err(Error::Cm {
                op,
                source: last_os_error(),
            });
        }
        Ok(())
    }

    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut storage = to_sockaddr(addr);
        // SAFETY: ptr is live and storage holds a valid sockaddr of its family.
        let rc = unsafe {
            ffi::rdma_bind_addr(
                self.ptr,
                (&mut storage as *mut libc::sockaddr_storage).cast(),
            )
        };
        self.check("rdma_bind_addr", rc)
    }

    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: ptr is a live, bound id.
        let rc = unsafe { ffi::rdma_listen(self.ptr, backlog) };
        self.check("rdma_listen", rc)
    }

    pub fn resolve_addr(&self, dst: SocketAddr, timeout_ms: i32) -> Result<()> {
        let mut storage = to_sockaddr(dst);
        // SAFETY: ptr is live; storage is a valid sockaddr; src NULL lets
        // the kernel pick the route's source.
        let rc = unsafe {
            ffi::rdma_resolve_addr(
                self.ptr,
                std::ptr::null_mut(),
                (&mut storage as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        };
        self.check("rdma_resolve_addr", rc)
    }

    pub fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        // SAFETY: ptr is live with a resolved address.
        let rc = unsafe { ffi::rdma_resolve_route(self.ptr, timeout_ms) };
        self.check("rdma_resolve_route", rc)
    }

    /// Sets the QP's local ACK timeout that rdma_cm programs at RTS.
    pub fn set_ack_timeout(&self, timeout: u8) -> Result<()> {
        let mut value = timeout;
        // SAFETY: ptr is live; optval points at one u8 as the option requires.
        let rc = unsafe {
            ffi::rdma_set_option(
                self.ptr,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut value as *mut u8).cast(),
                1,
            )
        };
        self.check("rdma_set_option(ACK_TIMEOUT)", rc)
    }

    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut raw = param.as_raw();
        // SAFETY: ptr is live with a QP; raw points at private data that
        // outlives the call (borrowed by `param`).
        let rc = unsafe { ffi::rdma_connect(self.ptr, &mut raw) };
        self.check("rdma_connect", rc)
    }

    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut raw = param.as_raw();
        // SAFETY: as in connect.
        let rc = unsafe { ffi::rdma_accept(self.ptr, &mut raw) };
        self.check("rdma_accept", rc)
    }

    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = private_data.len().min(u8::MAX as usize) as u8;
        // SAFETY: ptr is a live id of a connect request; data valid for len.
        let rc = unsafe { ffi::rdma_reject(self.ptr, private_data.as_ptr().cast(), len) };
        self.check("rdma_reject", rc)
    }

    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: ptr is live; disconnecting twice returns an error, no UB.
        let rc = unsafe { ffi::rdma_disconnect(self.ptr) };
        self.check("rdma_disconnect", rc)
    }

    /// The local address (the port is the one bound, also for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: ptr is live; the route's src address is a sockaddr union
        // sized for any family.
        let sa = unsafe { &(*self.ptr).route.addr.__bindgen_anon_1.src_storage };
        from_sockaddr(sa)
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in local_addr.
        let sa = unsafe { &(*self.ptr).route.addr.__bindgen_anon_2.dst_storage };
        from_sockaddr(sa)
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id's QP (if any) holds an Arc of this id and is gone;
        // all its events were acked on receipt; destroyed exactly once.
        let rc = unsafe { ffi::rdma_destroy_id(self.ptr) };
        if rc != 0 {
            tracing::warn!(error = %last_os_error(), "rdma_destroy_id failed");
        }
    }
}

/// `rdma_conn_param` with borrowed private data.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnParam<'a> {
    pub private_data: &'a [u8],
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
}

impl ConnParam<'_> {
    fn as_raw(&self) -> ffi::rdma_conn_param {
        ffi::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len().min(u8::MAX as usize) as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 1,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        }
    }
}

fn to_sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    storage
}

fn from_sockaddr(sa: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(sa.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `if_nametoindex`: the scope id of a network interface, for IPv6
/// link-local addresses written `fe80::1%eth0`.
pub fn interface_index(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: c is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// librdmacm's own device contexts (`rdma_get_devices`), held so that
/// none is removed while in use. A queue pair made on an `rdma_cm_id` must
/// be in a PD of the id's own context (`rdma_create_qp_ex` in librdmacm's
/// `cma.c` refuses another with EINVAL), so whatever takes rdma_cm joins
/// onto queues it made first (a poller) makes them on one of these.
pub(crate) struct CmDevices {
    list: *mut *mut ffi::ibv_context,
    len: usize,
}

// SAFETY: a list of context pointers, read only; librdmacm allows its
// contexts to be used from any thread, and `rdma_free_devices` takes its
// own lock.
unsafe impl Send for CmDevices {}
// SAFETY: as above (nothing is written through `&self`).
unsafe impl Sync for CmDevices {}

impl CmDevices {
    pub(crate) fn get() -> Result<Arc<CmDevices>> {
        let mut n = 0;
        // SAFETY: n is a valid out-pointer; the list is ours until
        // rdma_free_devices.
        let list = unsafe { ffi::rdma_get_devices(&mut n) };
        if list.is_null() {
            return Err(Error::Cm {
                op: "rdma_get_devices",
                source: last_os_error(),
            });
        }
        Ok(Arc::new(CmDevices {
            list,
            len: n.max(0) as usize,
        }))
    }

    /// The contexts, each live while `self` is (librdmacm counts the
    /// list's hold on each; it closes one only once its device is gone
    /// and no list or id holds it).
    pub(crate) fn iter(&self) -> impl Iterator<Item = *mut ffi::ibv_context> + '_ {
        // SAFETY: the list holds `len` context pointers while self lives.
        (0..self.len).map(move |i| unsafe { *self.list.add(i) })
    }
}

impl Drop for CmDevices {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices, freed exactly once.
        unsafe { ffi::rdma_free_devices(self.list) };
    }
}
