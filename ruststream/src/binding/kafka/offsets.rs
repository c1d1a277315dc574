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

/// Prefix of the commit metadata that counts deliveries of the record at
/// the committed offset.
const ATTEMPTS: &str = "ruststream-attempts=";

/// The commit metadata saying the record at the committed offset was
/// handed out `attempt` times without being settled.
pub(crate) fn attempts_metadata(attempt: u32) -> String {
    format!("{ATTEMPTS}{attempt}")
}

/// Deliveries counted by commit metadata (0 when it says nothing).
pub(crate) fn attempts_in(metadata: &str) -> u32 {
    metadata
        .strip_prefix(ATTEMPTS)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

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
    /// The offset the assignment started at, and the deliveries the
    /// commit metadata counted on it.
    resume: Option<(i64, u32)>,
}

/// A commit a window asks for: the offset, and the metadata that goes
/// with it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Commit {
    pub offset: i64,
    pub metadata: String,
}

impl PartitionAcks {
    /// A window for an assignment that starts at `start`, whose record
    /// was handed out `delivered` times before (commit metadata).
    pub(crate) fn new(start: Option<i64>, delivered: u32) -> Self {
        let at = start.unwrap_or(-1);
        PartitionAcks {
            window: Mutex::new(Window {
                sealed: false,
                next: at,
                committed: at,
                open: VecDeque::new(),
                resume: start.map(|offset| (offset, delivered)),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a record about to be handed out with the attempt its
    /// headers say, and returns the attempt it really is. The first record
    /// at the assignment's start counts the deliveries the commit metadata
    /// recorded; it then also returns the commit that records this one
    /// before it goes to a handler, so a process that dies in the handler
    /// is counted too. `None`: the window is sealed (the partition was
    /// revoked), and the record must not be handed out.
    pub(crate) fn received(&self, offset: i64, attempt: u32) -> Option<(u32, Option<Commit>)> {
        let mut window = self.lock();
        if window.sealed {
            return None;
        }
        if window.open.is_empty() && window.next < offset && window.next == window.committed {
            // A gap (compaction, transaction markers, a start before the
            // first record): nothing in it was handed out.
            window.next = offset;
            window.committed = offset;
        }
        let mut commit = None;
        let mut attempt = attempt;
        if let Some((start, delivered)) = window.resume.take()
            && start == offset
        {
            {
                attempt = attempt.max(delivered.saturating_add(1));
                commit = Some(Commit {
                    offset,
                    metadata: attempts_metadata(attempt),
                });
            }
        }
        window.open.push_back((offset, attempt, false));
        Some((attempt, commit))
    }

    /// Settles `offset`: true when the settled prefix grew.
    pub(crate) fn settle(&self, offset: i64) -> bool {
        let mut window = self.lock();
        if window.sealed {
            return false;
        }
        let Ok(at) = window.open.binary_search_by_key(&offset, |&(o, _, _)| o) else {
            return false;
        };
        window.open[at].2 = true;
        let mut grew = false;
        while let Some(&(offset, _, true)) = window.open.front() {
            window.open.pop_front();
            window.next = offset + 1;
            grew = true;
        }
        grew
    }

    /// The commit of the settled prefix, if it moved since the last one.
    pub(crate) fn take_commit(&self) -> Option<i64> {
        let mut window = self.lock();
        if window.sealed || window.next <= window.committed {
            return None;
        }
        window.committed = window.next;
        Some(window.next)
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
        let metadata = match window.open.front() {
            Some(&(offset, attempt, false)) if offset == window.next => attempts_metadata(attempt),
            _ => String::new(),
        };
        if metadata.is_empty() && window.next <= window.committed {
            return None;
        }
        window.committed = window.next;
        Some(Commit {
            offset: window.next,
            metadata,
        })
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

    #[test]
    fn out_of_order_settlements_commit_only_the_contiguous_prefix() {
        let acks = PartitionAcks::new(Some(10), 0);
        for offset in 10..15 {
            acks.received(offset, 1).unwrap();
        }
        assert!(!acks.settle(12));
        assert!(!acks.settle(11));
        assert_eq!(acks.take_commit(), None, "10 is still in a handler");
        assert!(acks.settle(10));
        assert_eq!(acks.take_commit(), Some(13));
        assert_eq!(acks.take_commit(), None, "nothing new");
        assert!(!acks.settle(14));
        assert!(acks.settle(13));
        assert_eq!(acks.take_commit(), Some(15));
    }

    #[test]
    fn a_sealed_window_ignores_late_settlements_and_hands_nothing_out() {
        let acks = PartitionAcks::new(Some(0), 0);
        acks.received(0, 1).unwrap();
        acks.received(1, 1).unwrap();
        assert!(!acks.settle(1));
        let last = acks.seal().unwrap();
        assert_eq!(last.offset, 0, "0 was never settled");
        assert_eq!(attempts_in(&last.metadata), 1, "handed out once");
        assert!(!acks.settle(0), "settled after the revocation");
        assert_eq!(acks.take_commit(), None);
        assert!(acks.received(2, 1).is_none());
    }

    #[test]
    fn the_first_record_of_an_assignment_counts_earlier_deliveries() {
        let acks = PartitionAcks::new(Some(7), 2);
        let (attempt, commit) = acks.received(7, 1).unwrap();
        assert_eq!(attempt, 3);
        assert_eq!(
            commit,
            Some(Commit {
                offset: 7,
                metadata: attempts_metadata(3)
            })
        );
        let (attempt, commit) = acks.received(8, 1).unwrap();
        assert_eq!((attempt, commit), (1, None));
    }

    #[test]
    fn gaps_before_the_first_record_are_skipped() {
        let acks = PartitionAcks::new(Some(3), 0);
        acks.received(9, 1).unwrap();
        assert!(acks.settle(9));
        assert_eq!(acks.take_commit(), Some(10));
        let fresh = PartitionAcks::new(None, 0);
        fresh.received(4, 1).unwrap();
        assert_eq!(fresh.seal().map(|c| c.offset), Some(4));
    }
}
