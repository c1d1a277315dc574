//! What a receive queue of the memory Core looks like from outside.

use crate::Text;

/// What a queue looks like right now (see
/// [`MemoryBroker::queues`](super::MemoryBroker::queues)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// The subscribed subject or pattern.
    pub subject: Text,
    /// The queue group, for a shared queue.
    pub queue_group: Option<Text>,
    /// Subscriptions reading the queue.
    pub members: usize,
    /// Frames waiting to be received.
    pub queued: usize,
    /// Bytes those frames are charged (payload + headers + framing).
    pub bytes: usize,
    /// Peers (publishing connections) with frames waiting.
    pub peers: usize,
    /// Whether the remote pause blocks publishers now: every member
    /// is a request/reply source and the job queue of each is PAUSED.
    pub receive_paused: bool,
}
