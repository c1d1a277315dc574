//! The `threads(n)` feeder's hand-off: what it fills idle threads' rings
//! with, in one step, and the wake-ups it owes them.

use std::sync::Arc;
use std::task::Waker;

use super::ring::Ring;
use crate::binding::Subscription;
use crate::ingress::{JobPermit, JobQueue};

/// Reused buffers of [`spread_at_hand`].
pub(super) struct AtHand<D> {
    permits: Vec<JobPermit>,
    claimed: Vec<D>,
    /// The idle rings the feeder fills in one go.
    idle: Vec<usize>,
}

impl<D> AtHand<D> {
    pub(super) fn new() -> Self {
        AtHand {
            permits: Vec::new(),
            claimed: Vec::new(),
            idle: Vec::new(),
        }
    }
}

/// What the feeder fills the rings with.
pub(super) struct Feed<'a, Sub: Subscription, T> {
    pub(super) rings: &'a [Ring<T>],
    pub(super) subscription: &'a mut Sub,
    pub(super) jobs: &'a Arc<JobQueue>,
    pub(super) at_hand: &'a mut AtHand<Sub::Delivery>,
    pub(super) cursor: &'a mut usize,
    pub(super) wakes: &'a mut Wakes,
}

/// Pushes `first` and — with `more` — as many deliveries as the
/// subscription has at hand now and the rings of the idle threads have
/// room for, each with a job permit taken before it is claimed (JQ-4),
/// without waiting; returns how many beyond `first`. A backlog that meets
/// idle threads thus reaches all of them with one claim (one lock of the
/// memory Core's queue) and one lock per ring.
///
/// They are shared out round robin from `target` (an idle thread's ring),
/// one push per ring: a push ends a thread's idle state, and with it the
/// feeder's right to add to its slots (the thread may claim in place from
/// then on).
pub(super) fn spread_at_hand<Sub: Subscription, T>(
    feed: Feed<'_, Sub, T>,
    first: T,
    target: usize,
    more: bool,
    job: impl Fn(Sub::Delivery, JobPermit) -> T,
) -> u32 {
    let Feed {
        rings,
        subscription,
        jobs,
        at_hand,
        cursor,
        wakes,
    } = feed;
    let n = rings.len();
    let wrap = |i: usize| if i >= n { i - n } else { i };
    let AtHand {
        permits,
        claimed,
        idle,
    } = at_hand;
    // Only the feeder ends an idle state: these stay idle until it pushes.
    idle.clear();
    idle.extend(
        (0..n)
            .map(|k| wrap(target + k))
            .filter(|&i| rings[i].is_idle()),
    );
    debug_assert_eq!(idle.first(), Some(&target), "the target is idle");
    let room: usize = idle.iter().map(|&i| rings[i].room()).sum();
    // One more delivery first: with nothing more at hand (a trickle, not a
    // backlog) one permit goes back, not a permit for every free slot.
    let mut taken = 0;
    if more
        && room > 1
        && let Some(second) = jobs.try_acquire()
        && let Some(delivery) = subscription.try_next()
    {
        claimed.push(delivery);
        permits.push(second);
        permits.extend(std::iter::from_fn(|| jobs.try_acquire()).take(room - 2));
        taken = 1 + subscription.try_next_batch(permits.len() - 1, claimed);
    }
    // Dropping what is left of `permits` returns the ones not needed.
    let mut jobs = std::iter::once(first).chain(
        claimed
            .drain(..)
            .zip(permits.drain(..))
            .map(|(delivery, permit)| job(delivery, permit)),
    );
    let mut left = 1 + taken;
    for (k, &at) in idle.iter().enumerate() {
        if left == 0 {
            break;
        }
        // An equal share of what is left for each ring left; an idle ring
        // is empty, so every share fits.
        let put = left.div_ceil(idle.len() - k).min(rings[at].room());
        if let Some(waker) = rings[at].push_all(jobs.by_ref().take(put)) {
            wakes.0.push(waker);
        }
        left -= put;
        *cursor = wrap(at + 1);
    }
    debug_assert_eq!(left, 0, "the idle rings had room for all");
    u32::try_from(taken).unwrap_or(u32::MAX)
}

/// Wakers of threads with new items, woken by [`flush`](Self::flush) or
/// when the feeder ends however it ends.
pub(super) struct Wakes(pub(super) Vec<Waker>);

impl Wakes {
    pub(super) fn flush(&mut self) {
        for waker in self.0.drain(..) {
            waker.wake();
        }
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        self.flush();
    }
}
