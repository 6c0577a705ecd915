//! Fairness between the connections of one poller
//! (`docs/design/many-peers-per-core.md` §1.6): a connection is handed at
//! most `budget` arrivals a turn; the rest wait, in order, in a FIFO of
//! fixed capacity (each holds a slot of the shared receive queue, so it
//! never needs more than the queue's depth), and are handed on later
//! turns. A peer that floods cannot starve the others' delivery. Nothing
//! here allocates after creation.

use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, Default)]
struct Account {
    /// The turn `handed` counts.
    turn: u64,
    handed: u32,
    /// Its arrivals waiting in the FIFO: while any wait, new ones wait
    /// behind them (a connection's arrivals are handed in order).
    waiting: u32,
}

/// Arrivals `T` of the connections in slots `0..connections`.
#[derive(Debug)]
pub(crate) struct Fair<T> {
    budget: u32,
    turn: u64,
    accounts: Box<[Account]>,
    waiting: VecDeque<(u32, T)>,
}

impl<T> Fair<T> {
    /// For `connections` slots, at most `capacity` arrivals waiting, each
    /// connection handed at most `budget` (at least 1) a turn.
    pub(crate) fn new(connections: u32, capacity: usize, budget: u32) -> Fair<T> {
        Fair {
            budget: budget.max(1),
            turn: 0,
            accounts: vec![Account::default(); connections as usize].into(),
            waiting: VecDeque::with_capacity(capacity),
        }
    }

    /// A new turn: every connection's budget is whole again.
    pub(crate) fn begin_turn(&mut self) {
        self.turn = self.turn.wrapping_add(1);
    }

    fn account(&mut self, conn: u32) -> &mut Account {
        let turn = self.turn;
        let account = &mut self.accounts[conn as usize];
        if account.turn != turn {
            account.turn = turn;
            account.handed = 0;
        }
        account
    }

    fn has_budget(&mut self, conn: u32) -> bool {
        let budget = self.budget;
        self.account(conn).handed < budget
    }

    /// An arrival for `conn`: `Ok(Some(item))` to hand it now, `Ok(None)`
    /// when it waits, `Err(item)` when the FIFO is full (more arrivals
    /// than it was made for: the caller's accounting is wrong).
    pub(crate) fn arrive(&mut self, conn: u32, item: T) -> Result<Option<T>, T> {
        if self.account(conn).waiting == 0 && self.has_budget(conn) {
            self.account(conn).handed += 1;
            return Ok(Some(item));
        }
        if self.waiting.len() == self.waiting.capacity() {
            return Err(item);
        }
        self.account(conn).waiting += 1;
        self.waiting.push_back((conn, item));
        Ok(None)
    }

    /// The oldest waiting arrival whose connection has budget left this
    /// turn, to hand now.
    pub(crate) fn next_waiting(&mut self) -> Option<(u32, T)> {
        let at = (0..self.waiting.len()).find(|&i| {
            let conn = self.waiting[i].0;
            self.has_budget(conn)
        })?;
        let (conn, item) = self.waiting.remove(at)?;
        let account = self.account(conn);
        account.handed += 1;
        account.waiting -= 1;
        Some((conn, item))
    }

    /// The oldest waiting arrival of `conn`, whatever its budget: a
    /// connection about to end is handed what it had received first.
    pub(crate) fn take_of(&mut self, conn: u32) -> Option<T> {
        let at = self.waiting.iter().position(|(c, _)| *c == conn)?;
        let (_, item) = self.waiting.remove(at)?;
        let account = self.account(conn);
        account.waiting -= 1;
        Some(item)
    }

    /// `conn` is gone: its waiting arrivals go to `on` (their slots go
    /// back), in order; its account starts afresh for the slot's next
    /// tenant.
    pub(crate) fn forget(&mut self, conn: u32, mut on: impl FnMut(T)) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].0 == conn {
                if let Some((_, item)) = self.waiting.remove(i) {
                    on(item);
                }
            } else {
                i += 1;
            }
        }
        self.accounts[conn as usize] = Account::default();
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands what `fair` gives this turn: the waiting first, then the
    /// new `arrivals`, as a poller's turn does.
    fn turn(fair: &mut Fair<u32>, arrivals: &[(u32, u32)]) -> Vec<(u32, u32)> {
        fair.begin_turn();
        let mut handed = Vec::new();
        while let Some(h) = fair.next_waiting() {
            handed.push(h);
        }
        for &(conn, item) in arrivals {
            if let Some(item) = fair.arrive(conn, item).expect("room") {
                handed.push((conn, item));
            }
        }
        handed
    }

    /// A connection that floods gets its budget a turn; the other's one
    /// arrival is handed in the same turn, not after the flood.
    #[test]
    fn a_flood_waits_its_turns_and_never_starves_the_others() {
        let mut fair = Fair::new(2, 16, 2);
        let flood: Vec<(u32, u32)> = (0..6).map(|i| (0, i)).collect();
        let mut arrivals = flood.clone();
        arrivals.push((1, 100));
        assert_eq!(turn(&mut fair, &arrivals), [(0, 0), (0, 1), (1, 100)]);
        assert_eq!(fair.waiting(), 4);
        assert_eq!(turn(&mut fair, &[(1, 101)]), [(0, 2), (0, 3), (1, 101)]);
        assert_eq!(turn(&mut fair, &[]), [(0, 4), (0, 5)]);
        assert_eq!(fair.waiting(), 0);
    }

    /// While a connection has arrivals waiting, a new one waits behind
    /// them, even in a turn with budget to spare: its order holds.
    #[test]
    fn a_connection_s_arrivals_are_handed_in_order() {
        let mut fair = Fair::new(1, 8, 2);
        assert_eq!(turn(&mut fair, &[(0, 1), (0, 2), (0, 3)]), [(0, 1), (0, 2)]);
        // Next turn: 3 waits; 4 must not overtake it.
        let handed = turn(&mut fair, &[(0, 4), (0, 5)]);
        assert_eq!(handed, [(0, 3), (0, 4)]);
        assert_eq!(turn(&mut fair, &[]), [(0, 5)]);
    }

    #[test]
    fn a_full_fifo_gives_the_arrival_back_and_a_gone_connection_s_arrivals_come_out() {
        let mut fair = Fair::new(2, 2, 1);
        fair.begin_turn();
        assert_eq!(fair.arrive(0, 1), Ok(Some(1)));
        assert_eq!(fair.arrive(0, 2), Ok(None));
        assert_eq!(fair.arrive(1, 3), Ok(Some(3)));
        assert_eq!(fair.arrive(1, 4), Ok(None));
        assert_eq!(fair.arrive(0, 5), Err(5), "full");
        let mut back = Vec::new();
        fair.forget(0, |item| back.push(item));
        assert_eq!(back, [2]);
        assert_eq!(fair.take_of(0), None, "forgotten");
        assert_eq!(fair.arrive(1, 7), Ok(None), "behind 4");
        assert_eq!(fair.take_of(1), Some(4), "the oldest first");
        assert_eq!(fair.take_of(1), Some(7));
        assert_eq!(fair.arrive(1, 4), Ok(None), "no budget left this turn");
        assert_eq!(fair.waiting(), 1);
        fair.begin_turn();
        assert_eq!(fair.next_waiting(), Some((1, 4)));
        // The slot's next tenant starts with a whole budget.
        assert_eq!(fair.arrive(0, 6), Ok(Some(6)));
    }
}
