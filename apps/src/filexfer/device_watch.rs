//! Whether the RDMA devices a server has used are still there.
//!
//! A process keeps every device it used open (librdmacm caches the
//! contexts), and a provider that cannot disassociate a context (rxe)
//! makes `rdma link delete` wait until that process exits. A transfer
//! ended by the removal usually names it (`DeviceEvent`), and the server
//! stops; but a transfer may end otherwise (the client left first, the
//! flush was seen before the event), and an idle server has no transfer
//! to tell it. So the accept loop also looks, once a second, whether
//! every device it used is still listed, and stops when one is not.
//! Devices are known by name: a renamed device counts as gone (the server
//! stops and says which; start it again), because node GUIDs are not
//! unique (rxe devices on VLANs of one NIC share their MAC's). One removed
//! and added again between two looks is not noticed (it is back: nothing
//! waits on the server).

use std::time::{Duration, Instant};

/// How often the list of devices is read (a directory scan by libibverbs).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Looks in a row a device must be missing from: a listing read while a
/// device is being re-probed may lack it once.
const MISSES_TO_LOSE: u32 = 2;

/// The devices a server used, and how many looks in a row each missed.
#[derive(Debug)]
pub struct DeviceWatch {
    used: Vec<Used>,
    next_look: Instant,
}

#[derive(Debug)]
struct Used {
    name: String,
    misses: u32,
}

impl DeviceWatch {
    pub fn new(now: Instant) -> DeviceWatch {
        DeviceWatch {
            used: Vec::new(),
            next_look: now + LOOK_EVERY,
        }
    }

    /// Notes that the server uses `device`. Devices are few and a client
    /// cannot make new ones, so the list stays small.
    pub fn used(&mut self, device: &str) {
        if !self.used.iter().any(|u| u.name == device) {
            self.used.push(Used {
                name: device.to_owned(),
                misses: 0,
            });
        }
    }

    /// At most once per [`LOOK_EVERY`]: lists the devices with `list` and
    /// returns the name of a used device missing from
    /// [`MISSES_TO_LOSE`] listings in a row. A listing that fails is no
    /// look (it says nothing about any device).
    pub fn look<E>(
        &mut self,
        now: Instant,
        list: impl FnOnce() -> Result<Vec<String>, E>,
    ) -> Option<String> {
        if self.used.is_empty() || now < self.next_look {
            return None;
        }
        self.next_look = now + LOOK_EVERY;
        let listed = list().ok()?;
        for used in &mut self.used {
            used.misses = if listed.contains(&used.name) {
                0
            } else {
                used.misses + 1
            };
        }
        self.used
            .iter()
            .find(|u| u.misses >= MISSES_TO_LOSE)
            .map(|u| u.name.clone())
    }
}

/// The names of the RDMA devices listed now.
pub fn listed_devices() -> pinpoll::Result<Vec<String>> {
    Ok(pinpoll::device::list_devices()?
        .into_iter()
        .map(|d| d.name)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> impl FnOnce() -> Result<Vec<String>, ()> + use<> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        move || Ok(names)
    }

    #[test]
    fn a_used_device_is_lost_after_two_missing_looks_in_a_row() {
        let t0 = Instant::now();
        let mut watch = DeviceWatch::new(t0);
        watch.used("rxe0");
        watch.used("rxe0");
        assert_eq!(watch.used.len(), 1, "a device is noted once");
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(watch.look(at(1), list(&["rxe0"])), None);
        assert_eq!(watch.look(at(2), list(&[])), None, "one miss is not enough");
        assert_eq!(
            watch.look(at(3), list(&["rxe0"])),
            None,
            "back: misses reset"
        );
        assert_eq!(watch.look(at(4), list(&["mlx5_0"])), None);
        assert_eq!(
            watch.look(at(5), list(&["mlx5_0"])),
            Some("rxe0".to_owned()),
            "missing twice in a row"
        );
    }

    #[test]
    fn looks_are_at_most_once_a_second_and_failed_listings_count_for_nothing() {
        let t0 = Instant::now();
        let mut watch = DeviceWatch::new(t0);
        let never = || -> Result<Vec<String>, ()> { panic!("listed when it need not be") };
        assert_eq!(watch.look(t0 + LOOK_EVERY, never), None, "nothing used");
        watch.used("rxe0");
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(watch.look(at(1000), list(&[])), None);
        assert_eq!(watch.look(at(1500), never), None, "within the second");
        let failed = || Err::<Vec<String>, _>(());
        assert_eq!(watch.look(at(2000), failed), None);
        assert_eq!(watch.look(at(3000), list(&[])), Some("rxe0".to_owned()));
    }
}
