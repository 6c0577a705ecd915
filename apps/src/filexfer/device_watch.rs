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
//! A device is known by its name or its node GUID (read at the first look
//! after it was used), so a renamed device is still there. One removed and
//! added again between two looks is not noticed (it is back: nothing waits
//! on the server).

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
    /// Its node GUID, once a listing showed it under `name` (0: unknown).
    guid: u64,
    misses: u32,
}

/// One RDMA device as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub guid: u64,
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
                guid: 0,
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
        list: impl FnOnce() -> Result<Vec<Listed>, E>,
    ) -> Option<String> {
        if self.used.is_empty() || now < self.next_look {
            return None;
        }
        self.next_look = now + LOOK_EVERY;
        let listed = list().ok()?;
        for used in &mut self.used {
            if used.guid == 0 {
                if let Some(same) = listed.iter().find(|l| l.name == used.name) {
                    used.guid = same.guid;
                }
            }
            let there = listed
                .iter()
                .any(|l| l.name == used.name || (used.guid != 0 && l.guid == used.guid));
            used.misses = if there { 0 } else { used.misses + 1 };
        }
        self.used
            .iter()
            .find(|u| u.misses >= MISSES_TO_LOSE)
            .map(|u| u.name.clone())
    }
}

/// The RDMA devices listed now.
pub fn listed_devices() -> pinpoll::Result<Vec<Listed>> {
    Ok(pinpoll::device::list_devices()?
        .into_iter()
        .map(|d| Listed {
            name: d.name,
            guid: d.guid,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing of `names`, each with a GUID of its own (from its name).
    fn list(names: &[&str]) -> impl FnOnce() -> Result<Vec<Listed>, ()> + use<> {
        let guid = |name: &str| name.bytes().fold(1u64, |h, b| h * 31 + u64::from(b));
        let devices: Vec<(&str, u64)> = names.iter().map(|&n| (n, guid(n))).collect();
        listed(&devices)
    }

    /// A listing of `(name, guid)` devices.
    fn listed(devices: &[(&str, u64)]) -> impl FnOnce() -> Result<Vec<Listed>, ()> + use<> {
        let devices: Vec<Listed> = devices
            .iter()
            .map(|&(name, guid)| Listed {
                name: name.to_owned(),
                guid,
            })
            .collect();
        move || Ok(devices)
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
        let never = || -> Result<Vec<Listed>, ()> { panic!("listed when it need not be") };
        assert_eq!(watch.look(t0 + LOOK_EVERY, never), None, "nothing used");
        watch.used("rxe0");
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(watch.look(at(1000), list(&[])), None);
        assert_eq!(watch.look(at(1500), never), None, "within the second");
        let failed = || Err::<Vec<Listed>, _>(());
        assert_eq!(watch.look(at(2000), failed), None);
        assert_eq!(watch.look(at(3000), list(&[])), Some("rxe0".to_owned()));
    }

    #[test]
    fn a_renamed_device_is_still_there_and_its_guid_is_what_counts() {
        let t0 = Instant::now();
        let mut watch = DeviceWatch::new(t0);
        watch.used("rxe0");
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(watch.look(at(1), listed(&[("rxe0", 7)])), None);
        // `rdma dev set rxe0 name roce0`: same GUID, new name.
        for s in 2..5 {
            assert_eq!(watch.look(at(s), listed(&[("roce0", 7)])), None);
        }
        // Another device took the name, ours is gone: the name still counts.
        assert_eq!(watch.look(at(5), listed(&[("rxe0", 9)])), None);
        // Neither the name nor the GUID: lost after two looks.
        assert_eq!(watch.look(at(6), listed(&[("mlx5_0", 9)])), None);
        assert_eq!(
            watch.look(at(7), listed(&[("mlx5_0", 9)])),
            Some("rxe0".to_owned())
        );
    }
}
