//! The rings of a `threads(n)` subscriber, and how its feeder finds one
//! to fill and waits for it.

use std::future::poll_fn;
use std::task::{Poll, Waker};

use super::ring::Ring;
use super::snooze_backoff::SnoozeBackoff;
use crate::sync::{Mutex, MutexGuard};

/// How many times a feeder with no ring to fill (no idle thread; by key, a
/// full ring) gives its CPU away before it waits (see
/// [`Rings::snooze_for_space`]): 1–3 measured best on 2 cores with
/// `threads(4)` when the feeder filled every ring, more kept the threads
/// from the CPU; with threads that claim in place, 3 still beat none
/// (median 3.94 M vs 3.68 M deliveries/s over 5 interleaved runs).
const FEEDER_SNOOZES: usize = 3;

/// Which rings the feeder fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// The ring of an idle thread (a busy one claims in place itself).
    Idle,
    /// Any ring, once every ring has a free slot: by key, the feeder
    /// learns a delivery's ring only after it took it.
    AllHaveRoom,
}

/// The rings of a `threads(n)` subscriber and its feeder's waker.
pub(crate) struct Rings<T> {
    pub(crate) rings: Vec<Ring<T>>,
    /// The feeder, while it waits for a ring to fill. Threads wake it when
    /// they turn idle ([`Fill::Idle`]) or their ring goes from full to not
    /// full ([`Fill::AllHaveRoom`]).
    feeder: Mutex<Option<Waker>>,
}

impl<T> Rings<T> {
    /// `n` empty rings, filled as `fill` says; with [`Fill::Idle`] every
    /// thread starts idle.
    pub(crate) fn new(n: usize, fill: Fill) -> Self {
        let rings: Vec<Ring<T>> = (0..n).map(|_| Ring::new()).collect();
        if fill == Fill::Idle {
            rings.iter().for_each(Ring::set_idle);
        }
        Rings {
            rings,
            feeder: Mutex::new(None),
        }
    }

    fn feeder(&self) -> MutexGuard<'_, Option<Waker>> {
        self.feeder.lock()
    }

    /// A ring to fill now: an idle thread's (round robin from `cursor`),
    /// or — [`Fill::AllHaveRoom`] — any, once every ring has a free slot.
    pub(crate) fn find_space(&self, fill: Fill, cursor: &mut usize) -> Option<usize> {
        if fill == Fill::AllHaveRoom {
            return self.rings.iter().all(Ring::has_space).then_some(0);
        }
        // Round robin without a division per step: `cursor < n` always.
        let n = self.rings.len();
        let wrap = |i: usize| if i >= n { i - n } else { i };
        let i = (0..n)
            .map(|k| wrap(*cursor + k))
            .find(|&i| self.rings[i].is_idle())?;
        *cursor = wrap(i + 1);
        Some(i)
    }

    /// [`find_space`](Self::find_space), giving the CPU away up to
    /// [`FEEDER_SNOOZES`] times for a thread to turn idle (or free a slot).
    ///
    /// This blocks the feeder's runtime thread for a few `sched_yield`
    /// calls: the threads it waits for are often runnable on that very CPU,
    /// and handing it to them directly beats a wake-up through Tokio's
    /// driver (a futex or eventfd call each way). The threads owed a
    /// wake-up must have it first. `backoff` says when it does not pay.
    pub(crate) fn snooze_for_space(
        &self,
        fill: Fill,
        cursor: &mut usize,
        backoff: &mut SnoozeBackoff,
    ) -> Option<usize> {
        backoff.snooze(FEEDER_SNOOZES, || self.find_space(fill, cursor))
    }

    /// Waits for [`find_space`](Self::find_space).
    pub(crate) async fn wait_space(&self, fill: Fill, cursor: &mut usize) -> usize {
        poll_fn(|cx| {
            if let Some(i) = self.find_space(fill, cursor) {
                return Poll::Ready(i);
            }
            // Register, then look again: a ring that turned idle or lost its
            // full state in between is seen now, one that does later wakes
            // us (its thread takes this lock after).
            *self.feeder() = Some(cx.waker().clone());
            match self.find_space(fill, cursor) {
                Some(i) => {
                    *self.feeder() = None;
                    Poll::Ready(i)
                }
                None => Poll::Pending,
            }
        })
        .await
    }

    /// A thread turned idle, or its ring went from full to not full.
    pub(crate) fn freed(&self) {
        let feeder = self.feeder().take();
        if let Some(feeder) = feeder {
            feeder.wake();
        }
    }
}
