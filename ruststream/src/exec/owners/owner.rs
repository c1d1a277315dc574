//! One owner (one key): its FIFO, the records it holds back, and its
//! counts.

use std::collections::VecDeque;

use super::{OwnerLimits, Refusal};

/// An item in an owner's FIFO, with the permit it carries to its turn
/// (`None` for a held record moved in at close, when nothing waits for
/// permits any more).
pub(super) struct Queued<T, P> {
    pub(super) item: T,
    pub(super) permit: Option<P>,
    pub(super) bytes: usize,
}

pub(super) struct Owner<T, P> {
    /// The key (hash) it owns.
    pub(super) key: u64,
    pub(super) fifo: VecDeque<Queued<T, P>>,
    /// One-way records that found the FIFO full, oldest first.
    pub(super) held: VecDeque<(T, usize)>,
    /// Items charged to this owner: queued plus the one running.
    pub(super) count: usize,
    pub(super) bytes: usize,
    pub(super) next_seq: u64,
    pub(super) running: bool,
    /// Listed in `State::promotable`.
    pub(super) promotable: bool,
}

impl<T, P> Owner<T, P> {
    /// An empty owner of `key` on `fifo` (a spare buffer, or a new one). Empty, it
    /// always takes one item (limits are at least 1), so no owner is ever
    /// made for a refusal.
    pub(super) fn new(key: u64, fifo: VecDeque<Queued<T, P>>) -> Self {
        Owner {
            key,
            fifo,
            held: VecDeque::new(),
            count: 0,
            bytes: 0,
            next_seq: 0,
            running: false,
            promotable: false,
        }
    }

    /// Nothing queued, running or held.
    #[inline]
    pub(super) fn is_idle(&self) -> bool {
        self.count == 0 && self.held.is_empty()
    }

    /// Whether a new item would find the FIFO at a limit: a request is
    /// refused then, a one-way record held. A key that holds records is
    /// full for everyone until they are in, so nothing overtakes them.
    pub(super) fn refusal(&self, limits: &OwnerLimits, bytes: usize) -> Option<Refusal> {
        if self.count >= limits.max_count || !self.held.is_empty() {
            return Some(Refusal::OwnerCount);
        }
        // An empty owner always takes one item, so an item larger than the
        // byte limit is not refused forever.
        if self.count > 0 && self.bytes + bytes > limits.max_bytes {
            return Some(Refusal::OwnerBytes);
        }
        None
    }

    /// Whether the oldest held record fits into the FIFO now.
    pub(super) fn can_promote(&self, limits: &OwnerLimits) -> bool {
        self.held.front().is_some_and(|&(_, bytes)| {
            self.count < limits.max_count
                && (self.count == 0 || self.bytes + bytes <= limits.max_bytes)
        })
    }

    /// Appends to the FIFO: returns the sequence and whether the owner
    /// became ready (it was idle and empty).
    pub(super) fn enqueue(&mut self, item: T, permit: Option<P>, bytes: usize) -> (u64, bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.count += 1;
        self.bytes += bytes;
        let became_ready = self.fifo.is_empty() && !self.running;
        self.fifo.push_back(Queued {
            item,
            permit,
            bytes,
        });
        (seq, became_ready)
    }
}
