//! Completion queues and the work completions polled from them.

use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use super::device::{fd_ready, set_nonblocking, Context};
use super::ffi;
use crate::error::{last_os_error, Error, Result};
use crate::status::{WcError, WcOpcode, WcStatus};

/// An `ibv_cq`, polled by busy-waiting, and, made on a
/// [`CompletionChannel`], able to wake a poller that sleeps: the owner,
/// which keeps it alive for the QPs that use it and destroys it last.
/// Polling is the unique [`CqPoller`]'s.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    ptr: *mut ffi::ibv_cq,
    /// The channel its events go to, which outlives it.
    channel: Option<Arc<CompletionChannel>>,
    /// The last tag given to a receive ring completing here
    /// ([`CompletionQueue::ring_tag`]).
    ring_tags: AtomicU16,
    _ctx: Arc<Context>,
}

/// Which live CQ a completion was polled from: the address of its handle,
/// which no other live CQ has. Made only from a CQ this crate holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CqId(usize);

/// Tags a CQ gives its receive rings ([`CompletionQueue::ring_tag`]):
/// 1 to this, so a zeroed id carries none.
pub(crate) const RING_TAGS: u16 = (1 << 10) - 1;

/// An `ibv_comp_channel`: the file descriptor that says a completion
/// arrived on an armed CQ made on it ([`CqPoller::arm`]), for a poller
/// that sleeps in `poll`/`epoll` instead of spinning. Its descriptor is
/// non-blocking, so reading an event never waits.
#[derive(Debug)]
pub(crate) struct CompletionChannel {
    ptr: *mut ffi::ibv_comp_channel,
    _ctx: Arc<Context>,
}

// SAFETY: the handle may move between threads; destroying it (Drop) needs
// the last Arc, which every CQ made on it holds, so none is left.
unsafe impl Send for CompletionChannel {}
// SAFETY: &CompletionChannel reads the descriptor (poll, and
// ibv_get_cq_event, a read(2) of one whole event under the library's own
// locking) and hands the handle to ibv_create_cq: calls the kernel and
// the library serialise.
unsafe impl Sync for CompletionChannel {}

#[cfg_attr(
    not(test),
    expect(dead_code, reason = "issue 25's sleeping poller builds on it")
)]
impl CompletionChannel {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: ctx is a live context, held below for the channel's life.
        let ptr = unsafe { ffi::ibv_create_comp_channel(ctx.as_ptr()) };
        if ptr.is_null() {
            return Err(Error::CompletionChannel {
                call: "ibv_create_comp_channel",
                what: "creating a completion channel",
                source: last_os_error(),
            });
        }
        let channel = Arc::new(CompletionChannel {
            ptr,
            _ctx: Arc::clone(ctx),
        });
        set_nonblocking(channel.fd()).map_err(|source| Error::CompletionChannel {
            call: "fcntl",
            what: "making the completion channel's descriptor non-blocking",
            source,
        })?;
        Ok(channel)
    }

    /// The descriptor to wait on (readable: an event is there).
    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: ptr is a live channel; fd is its open descriptor.
        unsafe { (*self.ptr).fd }
    }

    /// Whether an event is there, waiting up to `timeout_ms` for one.
    pub(crate) fn wait(&self, timeout_ms: i32) -> Result<bool> {
        fd_ready(self.fd(), timeout_ms).map_err(|source| Error::CompletionChannel {
            call: "poll",
            what: "waiting on the completion channel",
            source,
        })
    }

    /// The next event, if one is there (never waits), acknowledged at
    /// once: the CQ it names is armed no more, and was live when the
    /// event was read (a CQ is destroyed only once its events are
    /// acknowledged). Returns that CQ's identity ([`CompletionQueue::handle`]).
    pub(crate) fn take_event(&self) -> Result<Option<*const c_void>> {
        let mut cq = std::ptr::null_mut();
        let mut cq_context = std::ptr::null_mut();
        // SAFETY: ptr is a live channel whose descriptor is non-blocking;
        // both out-pointers are valid.
        let rc = unsafe { ffi::ibv_get_cq_event(self.ptr, &mut cq, &mut cq_context) };
        if rc != 0 {
            let err = last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) => Ok(None),
                _ => Err(Error::CompletionChannel {
                    call: "ibv_get_cq_event",
                    what: "reading a completion event",
                    source: err,
                }),
            };
        }
        // SAFETY: cq is the CQ the event names, kept alive by its unacked
        // event (ibv_destroy_cq waits for the acknowledgement); acked once.
        unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        Ok(Some(cq.cast_const().cast()))
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ made on the channel holds an Arc of it, so none
        // is left; destroyed exactly once.
        let rc = unsafe { ffi::ibv_destroy_comp_channel(self.ptr) };
        if rc != 0 {
            tracing::warn!(error = %crate::error::errno(rc), "ibv_destroy_comp_channel failed");
        }
    }
}

// SAFETY: the handle may move between threads; destroying it (Drop) needs
// the last Arc, so no other thread still uses it.
unsafe impl Send for CompletionQueue {}
// SAFETY: &CompletionQueue only hands the handle to ibv_create_qp (which the kernel checks); polling, the one
// operation that touches the provider's CQ state, is not reachable from it.
unsafe impl Sync for CompletionQueue {}

/// The right to poll one CQ: one per CQ, `Send` but not `Sync`, so one
/// thread at a time polls — what lets a provider skip its CQ lock
/// (`MLX5_SINGLE_THREADED=1`).
#[derive(Debug)]
pub(crate) struct CqPoller {
    cq: Arc<CompletionQueue>,
    _not_sync: PhantomData<Cell<()>>,
}

impl CompletionQueue {
    /// Creates a CQ of at least `depth` entries; returns its owner (for the
    /// QPs) and its poller.
    pub(crate) fn new(ctx: &Arc<Context>, depth: u32) -> Result<(Arc<Self>, CqPoller)> {
        Self::create(ctx, depth, None)
    }

    /// [`CompletionQueue::new`] on `channel`, whose descriptor says when a
    /// completion arrives on it once armed ([`CqPoller::arm`]).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "issue 25's sleeping poller builds on it")
    )]
    pub(crate) fn with_channel(
        ctx: &Arc<Context>,
        depth: u32,
        channel: &Arc<CompletionChannel>,
    ) -> Result<(Arc<Self>, CqPoller)> {
        Self::create(ctx, depth, Some(channel))
    }

    fn create(
        ctx: &Arc<Context>,
        depth: u32,
        channel: Option<&Arc<CompletionChannel>>,
    ) -> Result<(Arc<Self>, CqPoller)> {
        let channel_ptr = channel.map_or(std::ptr::null_mut(), |c| c.ptr);
        // SAFETY: ctx is live, and so is the channel if any (held below for
        // the CQ's life); no context pointer is passed.
        let ptr = unsafe {
            ffi::ibv_create_cq(
                ctx.as_ptr(),
                depth as i32,
                std::ptr::null_mut(),
                channel_ptr,
                0,
            )
        };
        if ptr.is_null() {
            return Err(Error::CreateCq {
                depth,
                source: last_os_error(),
            });
        }
        let cq = Arc::new(CompletionQueue {
            ptr,
            channel: channel.map(Arc::clone),
            ring_tags: AtomicU16::new(0),
            _ctx: Arc::clone(ctx),
        });
        let poller = CqPoller {
            cq: Arc::clone(&cq),
            _not_sync: PhantomData,
        };
        Ok((cq, poller))
    }

    /// Which CQ this is, as its completions are branded.
    pub(crate) fn id(&self) -> CqId {
        CqId(self.ptr as usize)
    }

    /// A tag for one more receive ring whose receives complete here: no
    /// two rings of this CQ get the same, so a completion polled here is
    /// never taken for another ring's receive. [`RING_TAGS`] of them per
    /// CQ; past that, an error.
    pub(crate) fn ring_tag(&self) -> Result<u16> {
        self.ring_tags
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                // Never wraps: below RING_TAGS.
                (t < RING_TAGS).then_some(t.wrapping_add(1))
            })
            .map(|t| t.wrapping_add(1))
            .map_err(|_| Error::SharedReceiveQueue {
                call: "a receive ring's tag",
                what: "a completion queue serves at most 1023 receive rings over its life",
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            })
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.ptr
    }

    /// The device context it was made on.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self._ctx
    }

    /// This CQ's identity, as a completion event names it.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "issue 25's sleeping poller builds on it")
    )]
    pub(crate) fn handle(&self) -> *const c_void {
        self.ptr.cast_const().cast()
    }
}

/// Completions taken from a CQ per poll.
pub(crate) const POLL_BATCH: usize = 32;

/// A CQ's poller with room for one poll's completions: what a queue that
/// settles completions is handed, so the CQ need not be its own (one
/// connection's, or a poller's shared by many).
pub(crate) struct Reaper {
    poller: CqPoller,
    /// The CQ's id, kept beside the buffer: branding a poll costs no
    /// load through the poller's `Arc`.
    cq: CqId,
    wcs: [WorkCompletion; POLL_BATCH],
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("poller", &self.poller)
            .finish()
    }
}

impl Reaper {
    pub(crate) fn new(poller: CqPoller) -> Reaper {
        Reaper {
            cq: poller.cq.id(),
            poller,
            wcs: WorkCompletion::array(),
        }
    }

    /// The CQ it polls.
    pub(crate) fn id(&self) -> CqId {
        self.cq
    }

    /// Polls up to `max` completions (at most [`POLL_BATCH`]) and lends
    /// them, branded with this CQ, until the next poll. Never blocks,
    /// never allocates.
    #[inline]
    pub(crate) fn reap(&mut self, max: usize) -> Result<Reaped<'_>> {
        let n = self.poller.poll(&mut self.wcs[..max.min(POLL_BATCH)])?;
        Ok(Reaped {
            cq: self.cq,
            wcs: &self.wcs[..n],
        })
    }
}

/// Completions polled from one CQ, and which CQ: a queue that settles
/// them checks that they are its own CQ's before it believes the ids
/// they name. Made only by polling ([`Reaper::reap`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reaped<'r> {
    cq: CqId,
    wcs: &'r [WorkCompletion],
}

impl<'r> Reaped<'r> {
    /// The CQ they were polled from.
    #[inline(always)]
    pub(crate) fn cq(&self) -> CqId {
        self.cq
    }

    #[inline(always)]
    pub(crate) fn wcs(&self) -> &'r [WorkCompletion] {
        self.wcs
    }

    /// Each completion alone, still branded: what a poller of many queues
    /// on one CQ hands each queue.
    pub(crate) fn each(self) -> impl Iterator<Item = Polled<'r>> {
        self.wcs.iter().map(move |wc| Polled { cq: self.cq, wc })
    }
}

/// One completion polled from a CQ, and which CQ ([`Reaped::each`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Polled<'r> {
    cq: CqId,
    wc: &'r WorkCompletion,
}

impl<'r> Polled<'r> {
    #[inline(always)]
    pub(crate) fn cq(&self) -> CqId {
        self.cq
    }

    #[inline(always)]
    pub(crate) fn wc(&self) -> &'r WorkCompletion {
        self.wc
    }

    /// As a batch of one, for a queue that retires batches.
    pub(crate) fn alone(self) -> Reaped<'r> {
        Reaped {
            cq: self.cq,
            wcs: std::slice::from_ref(self.wc),
        }
    }
}

impl CqPoller {
    /// Arms the CQ: the next completion added to it raises one event on
    /// its channel. One only, and only for a completion added after this
    /// call: one already there raises none, so a poller that is to sleep
    /// arms, polls once more, and sleeps only if that poll was empty.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "issue 25's sleeping poller builds on it")
    )]
    pub(crate) fn arm(&mut self) -> Result<()> {
        let armed = |rc: i32, what| {
            if rc == 0 {
                Ok(())
            } else {
                Err(Error::CompletionChannel {
                    call: "ibv_req_notify_cq",
                    what,
                    source: crate::error::errno(rc),
                })
            }
        };
        if self.cq.channel.is_none() {
            return armed(
                libc::EINVAL,
                "arming a CQ made without a completion channel",
            );
        }
        // SAFETY: the CQ is live (we hold an Arc) and made on a channel;
        // &mut self on its only poller makes this the only call on it.
        armed(
            unsafe { ffi::ibv_req_notify_cq(self.cq.ptr, 0) },
            "arming the CQ",
        )
    }

    /// Polls one completion, if there is one. Never blocks.
    pub(crate) fn poll_one(&mut self) -> Result<Option<WorkCompletion>> {
        let mut wc = [WorkCompletion::zeroed()];
        Ok((self.poll(&mut wc)? == 1).then_some(wc[0]))
    }

    /// Polls up to `out.len()` completions into `out`, returning how many.
    /// Never blocks, never allocates.
    #[inline]
    pub(crate) fn poll(&mut self, out: &mut [WorkCompletion]) -> Result<usize> {
        let max = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, so `out`
        // is `max` writable ibv_wc; the CQ is live (we hold an Arc), and
        // &mut self on the only poller makes this the only poll of it.
        let n =
            unsafe { ffi::ibv_poll_cq(self.cq.ptr, max, out.as_mut_ptr().cast::<ffi::ibv_wc>()) };
        if n < 0 {
            return Err(poll_failed(n));
        }
        Ok(n as usize)
    }
}

#[cold]
#[inline(never)]
fn poll_failed(n: i32) -> Error {
    Error::PollCq(crate::error::errno(n))
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ and its poller hold an Arc of it,
        // so none is alive; destroyed exactly once.
        let rc = unsafe { ffi::ibv_destroy_cq(self.ptr) };
        if rc != 0 {
            tracing::warn!(error = %crate::error::errno(rc), "ibv_destroy_cq failed");
        }
    }
}

/// One `ibv_wc`, read through safe accessors. Only polling fills one.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct WorkCompletion(ffi::ibv_wc);

impl WorkCompletion {
    /// An empty slot to poll into.
    ///
    /// Only `sys` makes one: outside it, every completion was polled, so
    /// no id a queue believes is made up.
    pub(super) fn zeroed() -> Self {
        // SAFETY: ibv_wc is plain data (integers and a union of integers);
        // all-zero is a valid value.
        WorkCompletion(unsafe { MaybeUninit::<ffi::ibv_wc>::zeroed().assume_init() })
    }

    /// A fixed array of empty slots, for polling in batches without allocating.
    pub(super) fn array<const N: usize>() -> [WorkCompletion; N] {
        std::array::from_fn(|_| WorkCompletion::zeroed())
    }

    #[inline]
    pub(crate) fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    #[inline]
    pub(crate) fn status(&self) -> WcStatus {
        WcStatus(self.0.status)
    }

    #[inline]
    pub(crate) fn is_success(&self) -> bool {
        self.0.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// Valid only for successful completions (verbs leave it undefined
    /// otherwise).
    #[inline]
    pub(crate) fn opcode(&self) -> WcOpcode {
        WcOpcode(self.0.opcode)
    }

    #[inline]
    pub(crate) fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate value in host order, if the completion carries one.
    #[inline]
    pub(crate) fn imm(&self) -> Option<u32> {
        if self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data.
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }

    #[inline]
    pub(crate) fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    #[inline]
    pub(crate) fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// `Ok(())` for success, otherwise the typed error; `posted` is the
    /// opcode the caller posted this wr_id with, if it knows it.
    #[inline]
    pub(crate) fn result(&self, posted: Option<WcOpcode>) -> Result<(), WcError> {
        if self.is_success() {
            Ok(())
        } else {
            Err(WcError {
                wr_id: self.wr_id(),
                opcode: posted,
                status: self.status(),
                vendor_err: self.vendor_err(),
            })
        }
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("imm", &self.imm())
            .finish()
    }
}
