//! Offsets that follow acks: per assigned partition, the records handed
//! out in offset order and which of them are settled. The offset to commit
//! is the end of the contiguous settled prefix, so a commit never runs
//! ahead of a record still in a handler, however out of order `workers(n)`,
//! `threads(n)` or by-key owners settle.
//!
//! One window lives for one assignment of a partition: revoking it seals
//! it, and a settlement that comes later is ignored (the partition's next
//! owner reads the record again from the committed offset).

use std::collections::VecDeque;
use std::sync::Mutex;

use super::commits::{Gate, HandOut, Mark};

/// The settlement window of one assigned partition.
pub(crate) struct PartitionAcks {
    window: Mutex<Window>,
}

struct Window {
    sealed: bool,
    /// Everything below is settled: the offset to commit.
    next: i64,
    /// What `next` was when last taken for a commit.
    committed: i64,
    /// Records handed out and not yet behind `next`, in offset order:
    /// offset, attempt, settled.
    open: VecDeque<(i64, u32, bool)>,
    /// What may be handed out, and what commits say about it.
    hand: HandOut,
}

impl Window {
    /// How often the record at `next` was handed out, as a commit of
    /// `next` records it (0: not counted one at a time).
    fn attempts_at_next(&self) -> u32 {
        let handed = match self.open.front() {
            Some(&(offset, attempt, false)) if offset == self.next => attempt,
            _ => 0,
        };
        handed.max(self.hand.counted(self.next).unwrap_or(0))
    }

    fn commit_of_next(&self) -> Commit {
        Commit {
            offset: self.next,
            metadata: self.hand.mark(self.attempts_at_next()).encode(),
        }
    }
}

/// A commit a window asks for: the offset, and the metadata that goes
/// with it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Commit {
    pub offset: i64,
    pub metadata: String,
}

/// What a settlement did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    /// The settled prefix grew.
    pub grew: bool,
    /// The subscription waits for it.
    pub wake: bool,
}

impl PartitionAcks {
    /// A window for an assignment that starts at `start`, whose commit
    /// recorded `mark`.
    pub(crate) fn new(start: Option<i64>, mark: Mark) -> Self {
        let at = start.unwrap_or(-1);
        PartitionAcks {
            window: Mutex::new(Window {
                sealed: false,
                next: at,
                committed: at,
                open: VecDeque::new(),
                hand: HandOut::new(start, mark),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks to hand out the record at `offset`, whose headers say
    /// `attempt`: [`Gate::Open`] records it as handed out, with the
    /// attempt it really is. The commit returned goes out first (the gate
    /// waits for it) or meanwhile (the gate is open).
    pub(crate) fn hand_out(&self, offset: i64, attempt: u32) -> (Gate, Option<Commit>) {
        let mut window = self.lock();
        if window.sealed {
            return (Gate::Sealed, None);
        }
        if let Some(at) = window.hand.stale(offset) {
            return (Gate::Rewind(at), None);
        }
        if window.open.is_empty() && window.next < offset {
            // A gap (compaction, transaction markers, a start before the
            // first record): nothing in it was handed out.
            if window.next == window.committed {
                window.committed = offset;
            }
            window.next = offset;
        }
        let quiet = window.open.is_empty();
        let (next, attempts) = (window.next, window.attempts_at_next());
        let (gate, commit) = window.hand.gate(offset, attempt, next, quiet, attempts);
        if let Gate::Open(attempt) = gate {
            window.open.push_back((offset, attempt, false));
        }
        if let Some(commit) = &commit {
            window.committed = window.committed.max(commit.offset);
        }
        (gate, commit)
    }

    /// The group answered a commit [`hand_out`](Self::hand_out) asked for.
    pub(crate) fn answered(&self, commit: &Commit, ok: bool) {
        let mut window = self.lock();
        window.hand.answered(commit, ok);
        if !ok && window.committed == commit.offset {
            window.committed = -1;
        }
    }

    /// Settles `offset`.
    pub(crate) fn settle(&self, offset: i64) -> Settled {
        let mut window = self.lock();
        let mut settled = Settled {
            grew: false,
            wake: false,
        };
        if window.sealed {
            return settled;
        }
        let Ok(at) = window.open.binary_search_by_key(&offset, |&(o, _, _)| o) else {
            return settled;
        };
        window.open[at].2 = true;
        while let Some(&(offset, _, true)) = window.open.front() {
            window.open.pop_front();
            window.next = offset + 1;
            settled.grew = true;
        }
        settled.wake = settled.grew && window.hand.waiting;
        settled
    }

    /// The commit of the settled prefix, if it moved since the last one.
    /// [`enqueued`](Self::enqueued) must follow once librdkafka has it.
    pub(crate) fn take_commit(&self) -> Option<Commit> {
        let mut window = self.lock();
        if window.sealed || window.next <= window.committed {
            return None;
        }
        window.committed = window.next;
        window.hand.enqueuing += 1;
        Some(window.commit_of_next())
    }

    /// A commit [`take_commit`](Self::take_commit) made is with
    /// librdkafka: true when the subscription waits for that.
    pub(crate) fn enqueued(&self) -> bool {
        let mut window = self.lock();
        window.hand.enqueuing = window.hand.enqueuing.saturating_sub(1);
        window.hand.enqueuing == 0 && window.hand.waiting
    }

    /// Seals the window (the partition is revoked) and returns its last
    /// commit: the settled prefix, with the attempt of the record it stops
    /// at when that one was handed out unsettled.
    pub(crate) fn seal(&self) -> Option<Commit> {
        let mut window = self.lock();
        if window.sealed {
            return None;
        }
        window.sealed = true;
        if window.next < 0 {
            return None;
        }
        window.committed = window.next;
        Some(window.commit_of_next())
    }

    /// A commit of `offset` failed: the next commit sends the settled
    /// prefix again.
    pub(crate) fn commit_failed(&self, offset: i64) {
        let mut window = self.lock();
        if window.committed == offset {
            window.committed = -1;
        }
    }

    /// Whether the partition was revoked.
    pub(crate) fn sealed(&self) -> bool {
        self.lock().sealed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::kafka::commits::LEASE;

    /// A window starting at `start` whose bound is confirmed far ahead.
    fn leased(start: i64) -> PartitionAcks {
        let acks = PartitionAcks::new(Some(start), Mark::default());
        let (gate, commit) = acks.hand_out(start, 1);
        assert_eq!(gate, Gate::Wait);
        acks.answered(&commit.unwrap(), true);
        acks
    }

    fn out(acks: &PartitionAcks, offset: i64) -> u32 {
        match acks.hand_out(offset, 1).0 {
            Gate::Open(attempt) => attempt,
            gate => panic!("{offset} not handed out: {gate:?}"),
        }
    }

    #[test]
    fn out_of_order_settlements_commit_only_the_contiguous_prefix() {
        let acks = leased(10);
        for offset in 10..15 {
            out(&acks, offset);
        }
        assert!(!acks.settle(12).grew);
        assert!(!acks.settle(11).grew);
        assert_eq!(acks.take_commit(), None, "10 is still in a handler");
        assert!(acks.settle(10).grew);
        assert_eq!(acks.take_commit().map(|c| c.offset), Some(13));
        assert!(!acks.enqueued());
        assert_eq!(acks.take_commit(), None, "nothing new");
        assert!(!acks.settle(14).grew);
        assert!(acks.settle(13).grew);
        let commit = acks.take_commit().unwrap();
        assert_eq!(commit.offset, 15);
        assert!(
            Mark::decode(&commit.metadata).upto >= 14,
            "every commit carries the bound"
        );
    }

    #[test]
    fn a_sealed_window_ignores_late_settlements_and_hands_nothing_out() {
        let acks = leased(0);
        out(&acks, 0);
        out(&acks, 1);
        assert!(!acks.settle(1).grew);
        let last = acks.seal().unwrap();
        assert_eq!(last.offset, 0, "0 was never settled");
        assert_eq!(Mark::decode(&last.metadata).attempts, 1, "handed out once");
        assert!(!acks.settle(0).grew, "settled after the revocation");
        assert_eq!(acks.take_commit(), None);
        assert_eq!(acks.hand_out(2, 1).0, Gate::Sealed);
    }

    #[test]
    fn a_crashing_record_counts_one_more_at_each_restart() {
        // A member handed 7..9 out and died: committed 7, bound 7 + LEASE.
        let mut mark = Mark {
            upto: 7 + LEASE,
            attempts: 0,
        };
        for crash in 1..=3 {
            let acks = PartitionAcks::new(Some(7), mark);
            let (gate, commit) = acks.hand_out(7, 1);
            assert_eq!(gate, Gate::Wait, "counted before it goes out");
            let commit = commit.unwrap();
            acks.answered(&commit, true);
            assert_eq!(out(&acks, 7), crash + 1);
            // 8 waits for 7; the process dies in 7's handler.
            assert_eq!(acks.hand_out(8, 1), (Gate::Wait, None));
            mark = Mark::decode(&commit.metadata);
            assert_eq!(commit.offset, 7);
            assert_eq!(mark.attempts, crash + 1);
        }
    }

    #[test]
    fn a_record_read_before_a_rewind_took_is_no_gap() {
        // 1 needs the bound moved; the group refuses while it waits.
        let acks = PartitionAcks::new(Some(1), Mark::default());
        let (gate, commit) = acks.hand_out(1, 1);
        assert_eq!(gate, Gate::Wait);
        acks.answered(&commit.unwrap(), false);
        assert_eq!(acks.hand_out(1, 1).0, Gate::Rewind(1));
        assert_eq!(acks.hand_out(2, 1).0, Gate::Rewind(1), "2 is stale");
        let (gate, commit) = acks.hand_out(1, 1);
        assert_eq!(gate, Gate::Wait);
        let commit = commit.unwrap();
        assert_eq!(commit.offset, 1, "never past 1");
        acks.answered(&commit, true);
        assert_eq!(out(&acks, 1), 1);
    }

    #[test]
    fn gaps_before_the_first_record_are_skipped() {
        let acks = PartitionAcks::new(Some(3), Mark::default());
        let (_, commit) = acks.hand_out(9, 1);
        acks.answered(&commit.unwrap(), true);
        out(&acks, 9);
        assert!(acks.settle(9).grew);
        assert_eq!(acks.take_commit().map(|c| c.offset), Some(10));
        let fresh = PartitionAcks::new(None, Mark::default());
        let (_, commit) = fresh.hand_out(4, 1);
        fresh.answered(&commit.unwrap(), true);
        out(&fresh, 4);
        assert_eq!(fresh.seal().map(|c| c.offset), Some(4));
    }
}
