//! The connections of a poller: a slab of fixed capacity whose entries
//! are named by generation-tagged ids, so that a completion or a caller
//! holding the id of a closed connection is never taken for the
//! connection that reused its slot.

/// A connection of a poller: its slot, and which of the slot's tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ConnId {
    pub index: u32,
    pub gen: u32,
}

/// Entries `T` in at most `capacity` slots, allocated once: inserting and
/// removing never allocate. A freed slot is reused first (last in, first
/// out), with its generation bumped, so every id it had is stale.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Box<[Slot<T>]>,
    /// Free slots, the most recently freed last.
    free: Vec<u32>,
    len: usize,
}

#[derive(Debug)]
struct Slot<T> {
    gen: u32,
    entry: Option<T>,
}

impl<T> Slab<T> {
    /// A slab of `capacity` slots (at most `u32::MAX`).
    pub(crate) fn with_capacity(capacity: u32) -> Slab<T> {
        Slab::starting_at(capacity, 0)
    }

    /// Every slot starts at generation `gen` (tests of the wrap).
    fn starting_at(capacity: u32, gen: u32) -> Slab<T> {
        Slab {
            slots: (0..capacity).map(|_| Slot { gen, entry: None }).collect(),
            // Popped from the end: slot 0 first.
            free: (0..capacity).rev().collect(),
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Puts `entry` in a free slot and returns its id, or gives it back
    /// when every slot is taken.
    pub(crate) fn insert(&mut self, entry: T) -> Result<ConnId, T> {
        let Some(index) = self.free.pop() else {
            return Err(entry);
        };
        let slot = &mut self.slots[index as usize];
        debug_assert!(slot.entry.is_none(), "a free slot holds an entry");
        slot.entry = Some(entry);
        self.len += 1;
        Ok(ConnId {
            index,
            gen: slot.gen,
        })
    }

    /// The entry `id` names, if it is still there.
    pub(crate) fn get(&self, id: ConnId) -> Option<&T> {
        let slot = self.slots.get(id.index as usize)?;
        (slot.gen == id.gen)
            .then_some(slot.entry.as_ref())
            .flatten()
    }

    pub(crate) fn get_mut(&mut self, id: ConnId) -> Option<&mut T> {
        let slot = self.slots.get_mut(id.index as usize)?;
        (slot.gen == id.gen)
            .then_some(slot.entry.as_mut())
            .flatten()
    }

    /// The id the next [`insert`](Self::insert) returns, if a slot is
    /// free: a connection's names are fixed before it is built.
    pub(crate) fn vacant(&self) -> Option<ConnId> {
        let index = *self.free.last()?;
        Some(ConnId {
            index,
            gen: self.slots[index as usize].gen,
        })
    }

    /// The entry in slot `index`, if one is, with its id: where a
    /// completion that names only the slot is taken.
    pub(crate) fn at_mut(&mut self, index: u32) -> Option<(ConnId, &mut T)> {
        let slot = self.slots.get_mut(index as usize)?;
        let id = ConnId {
            index,
            gen: slot.gen,
        };
        slot.entry.as_mut().map(|entry| (id, entry))
    }

    /// Makes every id of vacant slot `id.index` stale (its generation
    /// moves on): the slot named a join that failed before it was filled.
    pub(crate) fn burn(&mut self, id: ConnId) {
        if let Some(slot) = self.slots.get_mut(id.index as usize) {
            if slot.entry.is_none() && slot.gen == id.gen {
                slot.gen = slot.gen.wrapping_add(1);
            }
        }
    }

    /// Takes out the entry `id` names; every id of that slot is stale from
    /// now on, and the slot is the next one [`insert`](Self::insert) uses.
    pub(crate) fn remove(&mut self, id: ConnId) -> Option<T> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.gen != id.gen {
            return None;
        }
        let entry = slot.entry.take()?;
        // Wraps after 2^32 tenants of one slot: an id that old is the only
        // one that could be taken for a live one.
        slot.gen = slot.gen.wrapping_add(1);
        self.free.push(id.index);
        self.len -= 1;
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_slot_is_reused_first_and_its_old_ids_are_stale() {
        let mut slab = Slab::with_capacity(3);
        let a = slab.insert("a").unwrap();
        let b = slab.insert("b").unwrap();
        assert_eq!((a.index, b.index), (0, 1));
        assert_eq!(slab.remove(a), Some("a"));
        assert_eq!(slab.get(a), None);
        assert_eq!(slab.remove(a), None, "removed twice");
        let c = slab.insert("c").unwrap();
        assert_eq!(c.index, a.index, "the slot freed last comes first");
        assert_ne!(c.gen, a.gen);
        assert_eq!(slab.get(a), None, "a's id never reaches c");
        assert_eq!(slab.get_mut(a), None);
        assert_eq!(slab.remove(a), None);
        assert_eq!(slab.get(c), Some(&"c"));
        assert_eq!(slab.get(b), Some(&"b"));
        assert_eq!(slab.len(), 2);
    }

    #[test]
    fn the_vacant_id_is_the_one_insert_returns_and_at_mut_names_the_tenant() {
        let mut slab = Slab::with_capacity(2);
        let a = slab.vacant().expect("a free slot");
        assert_eq!(slab.insert('a'), Ok(a));
        let b = slab.vacant().expect("a free slot");
        assert_eq!(slab.insert('b'), Ok(b));
        assert_eq!(slab.vacant(), None, "full");
        slab.remove(a).unwrap();
        let c = slab.vacant().expect("a's slot");
        assert_eq!((c.index, c.gen), (a.index, a.gen.wrapping_add(1)));
        assert!(slab.at_mut(a.index).is_none(), "an empty slot names nobody");
        assert_eq!(slab.insert('c'), Ok(c));
        assert_eq!(slab.at_mut(c.index).map(|(id, e)| (id, *e)), Some((c, 'c')));
        assert_eq!(slab.at_mut(b.index).map(|(id, e)| (id, *e)), Some((b, 'b')));
        assert!(slab.at_mut(9).is_none(), "out of range");
    }

    #[test]
    fn a_full_slab_gives_the_entry_back_and_ids_out_of_range_name_nothing() {
        let mut slab = Slab::with_capacity(2);
        slab.insert(1).unwrap();
        let two = slab.insert(2).unwrap();
        assert_eq!(slab.insert(3), Err(3));
        assert_eq!(slab.len(), slab.capacity());
        let far = ConnId { index: 7, gen: 0 };
        assert_eq!(slab.get(far), None);
        assert_eq!(slab.remove(far), None);
        assert_eq!(slab.remove(two), Some(2));
        assert!(slab.insert(3).is_ok());
    }

    #[test]
    fn the_generation_wraps_and_stays_distinct_from_the_last_tenant() {
        let mut slab = Slab::starting_at(1, u32::MAX);
        let old = slab.insert(()).unwrap();
        assert_eq!(old.gen, u32::MAX);
        slab.remove(old).unwrap();
        let new = slab.insert(()).unwrap();
        assert_eq!(new.gen, 0);
        assert_eq!(slab.get(old), None);
    }

    /// Inserting and removing never grow what was allocated at the start.
    #[test]
    fn churn_allocates_nothing_after_creation() {
        let mut slab = Slab::with_capacity(64);
        let free_capacity = slab.free.capacity();
        let mut live = Vec::with_capacity(64);
        for round in 0..1000u32 {
            while let Ok(id) = slab.insert(round) {
                live.push(id);
            }
            for id in live.drain(..).rev().step_by(2) {
                slab.remove(id).unwrap();
            }
            for id in (0..64)
                .filter_map(|i| {
                    let id = ConnId {
                        index: i,
                        gen: slab.slots[i as usize].gen,
                    };
                    slab.get(id).is_some().then_some(id)
                })
                .collect::<Vec<_>>()
            {
                slab.remove(id).unwrap();
            }
        }
        assert_eq!(slab.free.capacity(), free_capacity);
        assert_eq!(slab.len(), 0);
    }

    /// A slot named for a join that failed is never named so again;
    /// burning a filled slot, or with a stale id, changes nothing.
    #[test]
    fn a_burnt_vacant_slot_names_its_next_tenant_anew() {
        let mut slab: Slab<u8> = Slab::with_capacity(2);
        let named = slab.vacant().unwrap();
        slab.burn(named);
        let next = slab.vacant().unwrap();
        assert_eq!(next.index, named.index);
        assert_ne!(next.gen, named.gen);
        slab.burn(named);
        assert_eq!(slab.vacant(), Some(next), "a stale id burns nothing");
        let id = slab.insert(1).unwrap();
        assert_eq!(id, next);
        slab.burn(id);
        assert_eq!(slab.get(id), Some(&1), "a filled slot is not burnt");
    }
}
