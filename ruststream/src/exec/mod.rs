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
use std::sync::Arc;

use crate::ingress::{BorrowedPermit, JobPermit, JobQueue};
use stop::Stop;

/// [`permit`] with its common case inline: a free permit is taken without
/// building the wait's future (it is on every delivery's path). `None`
/// when `stop` came first.
macro_rules! take_permit {
    ($jobs:expr, $stop:expr) => {
        match $jobs.try_acquire() {
            Some(permit) => Some(permit),
            None => $crate::exec::permit($jobs, $stop).await,
        }
    };
}
pub(crate) use take_permit;

/// JQ-4 step 1: a job permit before the next record is taken from the
/// binding, unless `stop` comes first. The oldest waiting source is served
/// first (JQ-7); a cancelled wait takes nothing (JQ-11).
pub(crate) async fn permit(jobs: &Arc<JobQueue>, stop: &Stop) -> Option<JobPermit> {
    if let Some(permit) = jobs.try_acquire() {
        return Some(permit);
    }
    tokio::select! {
        biased;
        permit = jobs.acquire() => Some(permit),
        () = stop.wait() => None,
    }
}

/// [`permit`] for the default loop, which keeps `jobs` alive itself: the
/// permit borrows it.
pub(crate) async fn borrowed_permit<'a>(
    jobs: &'a JobQueue,
    stop: &Stop,
) -> Option<BorrowedPermit<'a>> {
    tokio::select! {
        biased;
        permit = jobs.acquire_borrowed() => Some(permit),
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
