//! Regions held by safe code, stamped with a canary and checked again
//! later: while a region is this side's, no DMA may change a byte of it.
//! The bytes come from a seeded stream, so a stale request that lands
//! anywhere in a region shows, whatever it writes.

use pinpoll::MemoryRegion;

use crate::gen::Rng;

/// A region this side holds, with what it must contain.
pub struct Owned {
    pub id: u32,
    pub region: MemoryRegion,
    expected: Vec<u8>,
}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "region {} ({} B)", self.id, self.region.len())
    }
}

/// Where a region lives, for recognising it when it comes back.
pub fn address(region: &MemoryRegion) -> usize {
    region.as_slice().as_ptr() as usize
}

/// Stamps regions, each time with fresh bytes.
#[derive(Debug)]
pub struct Stamper {
    rng: Rng,
}

impl Stamper {
    pub fn new(seed: u64) -> Stamper {
        Stamper {
            rng: Rng::new(seed),
        }
    }

    /// Fills `region` with a fresh canary and keeps it as this side's.
    pub fn stamp(&mut self, id: u32, mut region: MemoryRegion) -> Owned {
        let mut expected = vec![0u8; region.len()];
        for chunk in expected.chunks_mut(8) {
            let word = self.rng.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        region.as_mut_slice().copy_from_slice(&expected);
        Owned {
            id,
            region,
            expected,
        }
    }
}

impl Owned {
    /// Writes `data` at the start (what a post will send), keeping the
    /// canary behind it.
    pub fn write(&mut self, data: &[u8]) {
        self.region.as_mut_slice()[..data.len()].copy_from_slice(data);
        self.expected[..data.len()].copy_from_slice(data);
    }

    /// Every byte as expected, or where the first difference is.
    pub fn check(&self, when: &str) -> Result<(), String> {
        let actual = self.region.as_slice();
        if actual == &self.expected[..] {
            return Ok(());
        }
        let differ = |(a, e): &(&u8, &u8)| a != e;
        let pairs = || actual.iter().zip(&self.expected);
        let at = pairs().position(|p| differ(&p)).unwrap_or(0);
        Err(format!(
            "{when}: region {} ({} B) changed under safe code: {} bytes differ, the first at {at} (got {:#04x}, expected {:#04x})",
            self.id,
            actual.len(),
            pairs().filter(differ).count(),
            actual[at],
            self.expected[at]
        ))
    }

    /// The region alone, to be stamped afresh.
    pub fn into_region(self) -> MemoryRegion {
        self.region
    }

    /// The region, for a post or a loan: what it must hold when it comes
    /// back goes with the request.
    pub fn lend(self) -> (MemoryRegion, Shadow) {
        let shadow = Shadow {
            id: self.id,
            expected: self.expected,
        };
        (self.region, shadow)
    }
}

/// What a region away from safe code (posted, lent, parked) must hold
/// when it comes back.
#[derive(Debug, Clone)]
pub struct Shadow {
    pub id: u32,
    expected: Vec<u8>,
}

impl Shadow {
    /// A region registered by someone else (the kernel zeroes it).
    pub fn zeroed(id: u32, len: usize) -> Shadow {
        Shadow {
            id,
            expected: vec![0; len],
        }
    }

    /// A request wrote `data` at the region's start (a receive, a READ),
    /// and nothing else.
    pub fn landed(&mut self, data: &[u8]) {
        self.expected[..data.len()].copy_from_slice(data);
    }

    /// A request may have written anything into the first `len` bytes (a
    /// READ that failed part way): take them as they are.
    pub fn anything_in(&mut self, region: &MemoryRegion, len: usize) {
        self.expected[..len].copy_from_slice(&region.as_slice()[..len]);
    }

    /// The region back with safe code, checked at once.
    pub fn back(self, region: MemoryRegion, when: &str) -> Result<Owned, String> {
        if region.len() != self.expected.len() {
            return Err(format!(
                "{when}: region {} came back {} B long, not {}",
                self.id,
                region.len(),
                self.expected.len()
            ));
        }
        let owned = Owned {
            id: self.id,
            region,
            expected: self.expected,
        };
        owned.check(when)?;
        Ok(owned)
    }
}
