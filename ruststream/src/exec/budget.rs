//! A loop's own cooperative budget: how many deliveries it takes in a row
//! before it lets the other tasks of its runtime run. Tokio's budget
//! (`coop::poll_proceed`) does the same job, but costs two thread-local
//! round trips on every delivery (~66 instructions, a ninth of the
//! framework's own cost per message then); a counter kept by the loop costs
//! a decrement. Publishes, which have no loop, sample tokio's per-task
//! budget instead ([`crate::coop::poll_publish`]).

/// Deliveries taken in a row between yields: tokio's own budget per poll.
const IN_A_ROW: u32 = 128;

/// The deliveries a loop may still take before it yields.
pub(crate) struct Budget(u32);

impl Budget {
    pub(crate) fn new() -> Self {
        Budget(IN_A_ROW)
    }

    /// Counts one take; `true` when the loop must yield first (the budget
    /// starts over).
    #[inline]
    pub(crate) fn spend(&mut self) -> bool {
        self.0 -= 1;
        if self.0 == 0 {
            self.0 = IN_A_ROW;
            return true;
        }
        false
    }

    /// Counts `n` takes at once (a batch); `true` when the budget ran out
    /// and the loop must yield before its next take (it starts over).
    #[inline]
    pub(crate) fn spend_many(&mut self, n: u32) -> bool {
        if n >= self.0 {
            self.0 = IN_A_ROW;
            return true;
        }
        self.0 -= n;
        false
    }

    /// The loop yields before its next take (it took the last free job
    /// permit: the others go first).
    #[inline]
    pub(crate) fn end_batch(&mut self) {
        self.0 = 1;
    }

    /// The loop waited, and so let the others run: a full budget.
    #[inline]
    pub(crate) fn refill(&mut self) {
        self.0 = IN_A_ROW;
    }
}

#[cfg(test)]
mod tests {
    use super::{Budget, IN_A_ROW};

    #[test]
    fn a_batch_spends_its_records_at_once() {
        let mut budget = Budget::new();
        assert!(!budget.spend_many(IN_A_ROW - 1));
        assert!(budget.spend_many(1), "the budget runs out on the last take");
        assert!(
            budget.spend_many(10 * IN_A_ROW),
            "a batch larger than the budget"
        );
        assert!(!budget.spend_many(0));
    }

    #[test]
    fn every_in_a_row_th_take_yields_and_a_wait_starts_over() {
        let mut budget = Budget::new();
        let yields = (0..3 * IN_A_ROW).filter(|_| budget.spend()).count();
        assert_eq!(yields, 3);
        for _ in 0..IN_A_ROW / 2 {
            assert!(!budget.spend());
        }
        budget.refill();
        assert!(
            (1..IN_A_ROW).all(|_| !budget.spend()),
            "a full budget again"
        );
        assert!(budget.spend());
    }
}
