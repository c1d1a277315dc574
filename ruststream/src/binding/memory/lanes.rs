//! The lanes of a receive queue — one FIFO per publishing connection, each
//! with its own byte budget — and the fair receive rounds across them: at
//! most [`ROUND_RECORDS`] frames, a byte budget and a time budget per
//! round, whichever ends first.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::Envelope;

/// Frames one receive round takes at most (fixed).
pub const ROUND_RECORDS: u32 = 64;

/// The byte and time budgets of one receive round; the record budget
/// is fixed at [`ROUND_RECORDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveRound {
    /// Bytes one round takes at most (the frame that crosses it ends the round).
    pub bytes: usize,
    /// Time one round may last, from its first frame.
    pub time: Duration,
}

impl Default for ReceiveRound {
    /// 1 MiB or 5 ms.
    fn default() -> Self {
        ReceiveRound {
            bytes: 1024 * 1024,
            time: Duration::from_millis(5),
        }
    }
}

/// Lane capacity kept after a burst drains.
const SHRINK_ABOVE: usize = 1024;

/// A frame taken from its lane.
pub(super) struct Popped {
    pub(super) env: Envelope,
    /// The peer whose lane it left: where a redelivery puts it back.
    pub(super) peer: u64,
    /// The bytes it was charged.
    pub(super) len: usize,
    /// The bytes its lane still holds.
    pub(super) left: usize,
}

/// The frames of one peer. Peer 0 is the broker itself (dead letters,
/// retries, requests).
pub(super) struct Lane {
    pub(super) peer: u64,
    pub(super) items: VecDeque<Envelope>,
    pub(super) bytes: usize,
}

impl Lane {
    pub(super) fn new(peer: u64) -> Self {
        Lane {
            peer,
            items: VecDeque::new(),
            bytes: 0,
        }
    }

    /// The head frame.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Popped> {
        let env = self.items.pop_front()?;
        let len = env.frame_bytes();
        self.bytes -= len;
        if self.items.is_empty() && self.items.capacity() > SHRINK_ABOVE {
            // Give a burst's memory back once it has drained.
            self.items.shrink_to(SHRINK_ABOVE);
        }
        Some(Popped {
            env,
            peer: self.peer,
            len,
            left: self.bytes,
        })
    }
}

/// What the current round has taken so far.
#[derive(Default)]
pub(super) struct Round {
    pub(super) records: u32,
    pub(super) bytes: usize,
    pub(super) started: Option<Instant>,
}
