//! Which connection a completion is about, by the queue pair number it
//! names: a fixed open-addressing table (linear probing, deletion by
//! backward shift, so no tombstones pile up), sized once for the poller's
//! most connections, so that looking up, adding and removing never
//! allocate.

/// Why an entry was not added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The table holds as many entries as it was made for.
    Full,
    /// The number is in the table already: a QPN names one queue pair.
    Taken,
}

/// Values `V` by queue pair number, at most `max` of them.
#[derive(Debug)]
pub(crate) struct QpnTable<V> {
    slots: Box<[Option<(u32, V)>]>,
    /// log2 of the slot count.
    bits: u32,
    len: usize,
    max: usize,
}

impl<V: Copy> QpnTable<V> {
    /// A table for at most `max` entries, in at least twice as many slots
    /// (probes stay short).
    pub(crate) fn with_capacity(max: usize) -> QpnTable<V> {
        let slots = max.saturating_mul(2).next_power_of_two().max(2);
        QpnTable {
            slots: (0..slots).map(|_| None).collect(),
            bits: slots.trailing_zeros(),
            len: 0,
            max,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Where `qpn`'s probe starts: Fibonacci hashing, the top bits of the
    /// product, so consecutive numbers spread.
    fn home(&self, qpn: u32) -> usize {
        (u64::from(qpn.wrapping_mul(0x9E37_79B1)) << 32 >> (64 - self.bits)) as usize
    }

    fn next(&self, i: usize) -> usize {
        (i + 1) & (self.slots.len() - 1)
    }

    /// The slot holding `qpn`, if any.
    fn find(&self, qpn: u32) -> Option<usize> {
        let mut i = self.home(qpn);
        loop {
            match self.slots[i] {
                None => return None,
                Some((q, _)) if q == qpn => return Some(i),
                Some(_) => i = self.next(i),
            }
        }
    }

    pub(crate) fn get(&self, qpn: u32) -> Option<V> {
        self.find(qpn).and_then(|i| self.slots[i].map(|(_, v)| v))
    }

    pub(crate) fn insert(&mut self, qpn: u32, value: V) -> Result<(), Refused> {
        if self.find(qpn).is_some() {
            return Err(Refused::Taken);
        }
        if self.len >= self.max {
            return Err(Refused::Full);
        }
        // At most half the slots are taken: an empty one comes.
        let mut i = self.home(qpn);
        while self.slots[i].is_some() {
            i = self.next(i);
        }
        self.slots[i] = Some((qpn, value));
        self.len += 1;
        Ok(())
    }

    /// Sets `qpn`'s value, if it is in the table; returns the old one.
    pub(crate) fn replace(&mut self, qpn: u32, value: V) -> Option<V> {
        let i = self.find(qpn)?;
        let (_, old) = self.slots[i].replace((qpn, value))?;
        Some(old)
    }

    pub(crate) fn remove(&mut self, qpn: u32) -> Option<V> {
        let mut hole = self.find(qpn)?;
        let (_, value) = self.slots[hole].take()?;
        self.len -= 1;
        // Shift back every entry of the run after the hole that may sit
        // there, so that each stays reachable from its home without
        // crossing an empty slot.
        let mut j = hole;
        loop {
            j = self.next(j);
            let Some((q, _)) = self.slots[j] else {
                break;
            };
            let home = self.home(q);
            // Whether `home` lies cyclically in (hole, j]: then the entry
            // must stay where it is.
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
        }
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32),
        Remove(u32),
        Get(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        // A few numbers, so that probes collide and runs wrap.
        let qpn = prop_oneof![0u32..40, Just(0x00ff_ffff), any::<u32>()];
        prop_oneof![
            qpn.clone().prop_map(Op::Insert),
            qpn.clone().prop_map(Op::Remove),
            qpn.prop_map(Op::Get),
        ]
    }

    proptest! {
        /// Any sequence of adds, removals and lookups answers as a map
        /// with the same bound does, and never grows the table.
        #[test]
        fn it_answers_as_a_map_does(ops in prop::collection::vec(op(), 0..400), max in 1usize..24) {
            let mut table = QpnTable::with_capacity(max);
            let slots = table.slots.len();
            let mut model: HashMap<u32, usize> = HashMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(q) => {
                        let want = if model.contains_key(&q) {
                            Err(Refused::Taken)
                        } else if model.len() >= max {
                            Err(Refused::Full)
                        } else {
                            model.insert(q, n);
                            Ok(())
                        };
                        prop_assert_eq!(table.insert(q, n), want);
                    }
                    Op::Remove(q) => prop_assert_eq!(table.remove(q), model.remove(&q)),
                    Op::Get(q) => prop_assert_eq!(table.get(q), model.get(&q).copied()),
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for (q, v) in &model {
                prop_assert_eq!(table.get(*q), Some(*v));
            }
            prop_assert_eq!(table.slots.len(), slots);
        }
    }

    #[test]
    fn a_full_table_refuses_and_a_removal_makes_room() {
        let mut table = QpnTable::with_capacity(2);
        table.insert(5, 'a').unwrap();
        table.insert(6, 'b').unwrap();
        assert_eq!(table.insert(7, 'c'), Err(Refused::Full));
        assert_eq!(table.insert(5, 'c'), Err(Refused::Taken));
        assert_eq!(table.remove(5), Some('a'));
        table.insert(7, 'c').unwrap();
        assert_eq!(
            (table.get(6), table.get(7), table.get(5)),
            (Some('b'), Some('c'), None)
        );
    }
}
