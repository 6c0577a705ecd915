//! Registered memory whose owner let go of it while a work request may
//! still name it, parked with the queue pair that request went to.
//!
//! Deregistering memory does not cancel a queued RECV or READ: the
//! request keeps its lkey and address, and on a provider whose MR cache
//! hands a revoked key to the next registration of the same size (mlx5),
//! with `munmap`/`mmap` returning the same address, the stale request
//! lands in the *next* region. So memory that a queued request names is
//! never deregistered: it waits here until the request's completion has
//! been seen (the NIC is done with it) or the queue pair is destroyed
//! (nothing can reach it any more), and is leaked, never freed, when
//! destroying the queue pair failed.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::mr::Registration;

/// What one queue pair keeps for the requests it may still run (generic
/// only so that the rules are tested without a device).
#[derive(Debug)]
pub(crate) struct ParkingLot<T = Registration> {
    lot: Mutex<Lot<T>>,
}

#[derive(Debug)]
struct Lot<T> {
    state: State,
    parked: Vec<Parked<T>>,
}

/// Where the queue pair is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// It exists: parked memory waits.
    Live,
    /// It was destroyed: nothing reaches the memory any more.
    Destroyed,
    /// Destroying it failed: it may still reach the memory, for ever.
    Leaked,
}

/// Parked memory and the request that names it, if one does.
#[derive(Debug)]
struct Parked<T> {
    request: Option<Request>,
    /// Held only to be dropped (or leaked) at the right moment.
    _memory: T,
}

/// A request of a queue pair, as its completion names it: its wr_id and
/// which of the two queues it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub wr_id: u64,
    pub receive: bool,
}

impl<T> ParkingLot<T> {
    pub(crate) fn new() -> Arc<ParkingLot<T>> {
        Arc::new(ParkingLot {
            lot: Mutex::new(Lot {
                state: State::Live,
                parked: Vec::new(),
            }),
        })
    }

    /// The lot, also after a panic elsewhere: every change to it is a
    /// single push, removal or state store, so it is never half-made.
    fn lock(&self) -> MutexGuard<'_, Lot<T>> {
        self.lot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `memory`, which `request` names (or, with `None`, which
    /// requests of the queue pair may name), until the request's
    /// completion is seen or the queue pair is destroyed. Frees it at once
    /// when the queue pair is gone already; leaks it when destroying the
    /// queue pair failed.
    pub(crate) fn park(&self, request: Option<Request>, memory: T) {
        let mut lot = self.lock();
        match lot.state {
            State::Live => lot.parked.push(Parked {
                request,
                _memory: memory,
            }),
            State::Destroyed => {
                drop(lot);
                drop(memory);
            }
            State::Leaked => std::mem::forget(memory),
        }
    }

    /// `request`'s completion was polled: the NIC is done with the memory
    /// parked for it, which is freed now. Whether any was.
    pub(crate) fn completed(&self, request: Request) -> bool {
        let mut lot = self.lock();
        let Some(at) = lot.parked.iter().position(|p| p.request == Some(request)) else {
            return false;
        };
        let freed = lot.parked.swap_remove(at);
        drop(lot);
        drop(freed);
        true
    }

    /// The queue pair is destroyed (`destroyed`), so parked memory is freed,
    /// or destroying it failed, so parked memory is leaked — as is what is
    /// parked later.
    pub(crate) fn queue_pair_gone(&self, destroyed: bool) {
        let mut lot = self.lock();
        lot.state = if destroyed {
            State::Destroyed
        } else {
            State::Leaked
        };
        let parked = std::mem::take(&mut lot.parked);
        drop(lot);
        if destroyed {
            drop(parked);
        } else {
            parked.into_iter().for_each(std::mem::forget);
        }
    }

    /// Memory parked and not yet freed.
    pub(crate) fn len(&self) -> usize {
        self.lock().parked.len()
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts its drops in the counter it shares.
    #[derive(Debug)]
    struct Memory(Arc<AtomicUsize>);

    impl Drop for Memory {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn request(wr_id: u64, receive: bool) -> Option<Request> {
        Some(Request { wr_id, receive })
    }

    #[test]
    fn parked_memory_is_freed_by_its_own_completion_or_by_the_destroyed_queue_pair() {
        let freed = Arc::new(AtomicUsize::new(0));
        let lot = ParkingLot::new();
        lot.park(request(7, true), Memory(Arc::clone(&freed)));
        lot.park(request(7, false), Memory(Arc::clone(&freed)));
        lot.park(None, Memory(Arc::clone(&freed)));
        assert_eq!((lot.len(), freed.load(Ordering::Relaxed)), (3, 0));
        // A completion on the other queue, or of another request, frees nothing.
        assert!(!lot.completed(Request {
            wr_id: 8,
            receive: true
        }));
        assert!(lot.completed(Request {
            wr_id: 7,
            receive: false
        }));
        assert_eq!((lot.len(), freed.load(Ordering::Relaxed)), (2, 1));
        assert!(!lot.completed(Request {
            wr_id: 7,
            receive: false
        }));
        lot.queue_pair_gone(true);
        assert_eq!((lot.len(), freed.load(Ordering::Relaxed)), (0, 3));
        // Parked after the queue pair went: nothing can reach it, freed at once.
        lot.park(request(9, false), Memory(Arc::clone(&freed)));
        assert_eq!((lot.len(), freed.load(Ordering::Relaxed)), (0, 4));
    }

    #[test]
    fn a_queue_pair_that_failed_to_go_leaks_everything_parked_with_it() {
        let freed = Arc::new(AtomicUsize::new(0));
        let lot = ParkingLot::new();
        lot.park(request(1, false), Memory(Arc::clone(&freed)));
        lot.queue_pair_gone(false);
        lot.park(request(2, false), Memory(Arc::clone(&freed)));
        assert!(!lot.completed(Request {
            wr_id: 2,
            receive: false
        }));
        assert_eq!(
            (lot.len(), freed.load(Ordering::Relaxed)),
            (0, 0),
            "never freed: the queue pair may still reach it"
        );
    }
}
