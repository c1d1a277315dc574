//! Execution modes: how a subscriber's deliveries are scheduled.
//!
//! | mode | where handlers run | in flight | read-ahead beyond the broker's queue |
//! |---|---|---|---|
//! | sequential (RT-2) | the loop task | 1 | none |
//! | `workers(n)` (RT-3) | `n` tasks on the app runtime | `n` | none: the loop polls only for an idle worker |
//! | `workers(n, by_key)` (RT-4) | `n` tasks, one key at a time each | `n` | `max_pending` deliveries in owner FIFOs |
//! | `threads(n)` (RT-5) | `n` OS threads, own runtimes | `n` | `n × 8` in rings (`n × 9` with the ones in hand) |

pub(crate) mod budget;
pub(crate) mod by_key;
pub(crate) mod owners;
pub(crate) mod ring;
pub(crate) mod ring_wait;
pub(crate) mod sequential;
pub(crate) mod stop;
pub(crate) mod threads;
pub(crate) mod workers;

use std::hash::{BuildHasher, Hash};

use stop::Stop;

/// JQ-4 step 1: a job permit before the next record is taken from the
/// binding, `None` when `stop` came first. `$try` takes a free permit
/// inline, without building the wait's future (it is on every delivery's
/// path); only when none is free is `$wait` built and awaited
/// ([`wait_permit`]).
macro_rules! take_permit {
    ($try:expr, $wait:expr, $stop:expr) => {
        match $try {
            Some(permit) => Some(permit),
            None => $crate::exec::wait_permit($wait, $stop).await,
        }
    };
}
pub(crate) use take_permit;

/// Waits for a permit (`wait`: the oldest waiting source is served first,
/// JQ-7), unless `stop` comes first; a cancelled wait takes nothing (JQ-11).
pub(crate) async fn wait_permit<P>(wait: impl Future<Output = P>, stop: &Stop) -> Option<P> {
    tokio::select! {
        biased;
        permit = wait => Some(permit),
        () = stop.wait() => None,
    }
}

/// Hash of an ordering key. Equal keys always hash alike, so they always meet
/// the same owner; different keys that collide only share an owner (less
/// parallelism, never a broken order).
pub fn key_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(key)
}

/// Maps a key hash onto `0..n` using its high bits.
pub(crate) fn slot(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}
