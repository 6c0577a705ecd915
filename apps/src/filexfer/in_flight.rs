//! The names a server is receiving right now: a second client sending the
//! same name is told at its `Start`, before any data moves, not after a
//! whole transfer lost the race to link it into place.
//!
//! Only this server's transfers are seen: the final hard link (or the
//! `--overwrite` check before the rename) still refuses a name that
//! another process created meanwhile.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The names being received, shared by every transfer of one server.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    names: Arc<Mutex<HashSet<String>>>,
}

/// A name reserved by one transfer until this is dropped.
#[derive(Debug)]
pub struct Reservation {
    names: Arc<Mutex<HashSet<String>>>,
    name: String,
}

impl InFlight {
    /// Reserves `name` for the caller's transfer, or `None` if another
    /// transfer holds it.
    pub fn reserve(&self, name: &str) -> Option<Reservation> {
        let fresh = lock(&self.names).insert(name.to_owned());
        fresh.then(|| Reservation {
            names: Arc::clone(&self.names),
            name: name.to_owned(),
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.names).remove(&self.name);
    }
}

fn lock(names: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    // Insert and remove cannot leave the set half-changed.
    names.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_held_until_its_transfer_ends() {
        let in_flight = InFlight::default();
        let first = in_flight.reserve("a.bin").expect("free");
        assert!(in_flight.reserve("a.bin").is_none(), "held by the first");
        let other = in_flight.reserve("b.bin").expect("another name is free");
        drop(first);
        let again = in_flight.reserve("a.bin").expect("released");
        drop((again, other));
        assert!(lock(&in_flight.names).is_empty());
    }

    #[test]
    fn transfers_on_many_threads_never_share_a_name() {
        let in_flight = InFlight::default();
        let winners: usize = std::thread::scope(|s| {
            let tries: Vec<_> = (0..8)
                .map(|_| s.spawn(|| in_flight.reserve("same.bin")))
                .collect();
            let held: Vec<_> = tries.into_iter().map(|t| t.join().unwrap()).collect();
            held.iter().filter(|r| r.is_some()).count()
        });
        assert_eq!(winners, 1);
        assert!(lock(&in_flight.names).is_empty(), "every winner dropped");
    }
}
