//! Who a work request's id belongs to, so that no completion is ever
//! taken for another request's.
//!
//! A queue pair's completions name their requests only by `wr_id`, and
//! three kinds of request may share one queue pair: a connection's rings
//! count theirs with sequence numbers ([`super::ledger`]); the safe
//! low-level posts of whole regions ([`super::region::Posted`]) and the
//! raw, `unsafe` posts of experts ([`super::region::RawQueuePair`]) carry
//! a tag in the top two bits. The ledgers admit only ids below
//! [`LEDGER_LIMIT`] and take a completion only for an id they admitted,
//! so a tagged id is never counted as a ring position or a sequence
//! number.

/// Ids a ledger may hand out: every sequence number and ring position is
/// below this; every tagged id is at or above it.
pub(crate) const LEDGER_LIMIT: u64 = 1 << 62;
/// The tag of a raw post's id ([`super::region::RawQueuePair`]).
pub(crate) const RAW: u64 = 1 << 62;
/// The tag of a whole region's post ([`super::region::Posted`]).
pub(crate) const OWNED: u64 = 1 << 63;
/// Both tags.
const TAGS: u64 = RAW | OWNED;

/// Whose a polled completion's id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A ring's sequence number or position.
    Ledger,
    /// A raw post, with the id its poster gave.
    Raw(u64),
    /// A whole region's post.
    Owned,
}

/// Whose `wr_id` is.
#[inline]
pub(crate) fn owner(wr_id: u64) -> Owner {
    if wr_id & OWNED != 0 {
        Owner::Owned
    } else if wr_id & RAW != 0 {
        Owner::Raw(wr_id & !TAGS)
    } else {
        Owner::Ledger
    }
}

/// The id a raw post of `id` carries, or `None` when `id` uses a tag's
/// bits (which the caller must not: it would lose them).
#[inline]
pub(crate) fn raw(id: u64) -> Option<u64> {
    (id & TAGS == 0).then_some(id | RAW)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    #[test]
    fn tagged_ids_never_fall_in_a_ledgers_range() {
        for id in [0, 1, 42, LEDGER_LIMIT - 1] {
            let tagged = raw(id).unwrap();
            assert!(tagged >= LEDGER_LIMIT);
            assert_eq!(owner(tagged), Owner::Raw(id));
            assert_eq!(owner(id), Owner::Ledger);
        }
        assert_eq!(raw(LEDGER_LIMIT), None, "bit 62 is the raw tag");
        assert_eq!(raw(u64::MAX), None);
        assert_eq!(raw(OWNED | 5), None, "bit 63 is the owned tag");
        assert_eq!(owner(OWNED), Owner::Owned);
        assert_eq!(owner(u64::MAX), Owner::Owned);
    }
}
