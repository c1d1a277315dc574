//! The ring between a `threads(n)` feeder and one dedicated thread: 8 slots.
//! The feeder is the only producer and checks for space before it
//! takes a delivery from the broker, so a push never finds the ring full.
//!
//! The thread takes everything queued in one swap under the lock (no
//! element moves) and then works through it without the lock; a slot counts
//! as taken until its item is in the thread's hand, so the ring, the taken
//! items and the one in hand never exceed 8 + 1.
//!
//! Wake-ups happen only on the edges someone waits for: a push hands the
//! feeder the waker of a thread that waits (its ring was empty), which the
//! feeder wakes in a batch before it waits itself; taking an item wakes the
//! feeder only if the ring was full and the feeder waits for space.
//!
//! Without `by_key`, a thread also claims deliveries in place (see
//! [`threads`](super::threads)) and the feeder fills only the ring of an
//! *idle* thread: the thread marks itself idle ([`set_idle`](Ring::set_idle))
//! only with nothing in hand, in its ring or at the subscription, and only
//! the feeder's push marks it busy again; so while a thread claims in place
//! nobody else adds to its slots, and the two never fill one ring together.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::{Mutex, MutexGuard};

/// Slots per ring. The loom models use rings of 2, which have every
/// edge of a ring of 8 (empty, full, in between) in far fewer steps.
#[cfg(not(loom))]
pub(crate) const RING_SLOTS: usize = 8;
#[cfg(loom)]
pub(crate) const RING_SLOTS: usize = 2;

pub(crate) struct Ring<T> {
    state: Mutex<RingState<T>>,
    /// Slots in use: items in the ring plus items the thread took but has
    /// not started. Read without the lock: the feeder (the only producer)
    /// looks for space without taking every ring's lock, and the thread
    /// frees a slot without taking it. A stale read errs on the side of
    /// "full" only, since the count can drop but never rise behind the
    /// feeder's back.
    len: AtomicUsize,
    /// The thread has nothing to do and waits for the feeder (see the
    /// module doc): set by the thread, cleared by the feeder's push.
    idle: AtomicBool,
}

struct RingState<T> {
    items: VecDeque<T>,
    closed: bool,
    /// The thread, while it waits for an item.
    reader: Option<Waker>,
}

impl<T> Ring<T> {
    pub(crate) fn new() -> Self {
        Ring {
            state: Mutex::new(RingState {
                items: VecDeque::with_capacity(RING_SLOTS),
                closed: false,
                reader: None,
            }),
            len: AtomicUsize::new(0),
            idle: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RingState<T>> {
        self.state.lock()
    }

    pub(crate) fn has_space(&self) -> bool {
        self.room() > 0
    }

    /// Free slots now; a stale read errs on the side of fewer.
    pub(crate) fn room(&self) -> usize {
        RING_SLOTS.saturating_sub(self.len.load(Ordering::Acquire))
    }

    /// Appends an item; the caller checked [`has_space`](Self::has_space).
    /// Returns the thread's waker if it waits for this item: the caller
    /// wakes it, at the latest before it waits itself.
    #[must_use = "a waiting thread must be woken"]
    pub(crate) fn push(&self, item: T) -> Option<Waker> {
        self.push_all(std::iter::once(item))
    }

    /// [`push`](Self::push) for several items under one lock; the caller
    /// checked that there is [`room`](Self::room) for all of them.
    #[must_use = "a waiting thread must be woken"]
    pub(crate) fn push_all(&self, items: impl IntoIterator<Item = T>) -> Option<Waker> {
        let mut state = self.lock();
        let before = state.items.len();
        state.items.extend(items);
        let added = state.items.len() - before;
        let len = self.len.fetch_add(added, Ordering::AcqRel) + added;
        debug_assert!(len <= RING_SLOTS, "feeder checks room first");
        self.idle.store(false, Ordering::Release);
        state.reader.take()
    }

    /// The thread claimed `count` items in place, beside the ring: they hold
    /// slots until [`start`](Self::start) like items taken from it.
    pub(crate) fn claimed(&self, count: usize) {
        let len = self.len.fetch_add(count, Ordering::AcqRel) + count;
        debug_assert!(len <= RING_SLOTS, "a thread claims only its room");
    }

    /// The thread has nothing in hand or in its ring and found nothing to
    /// claim: the feeder may fill its ring (it alone clears this, by its
    /// push). The thread then wakes the feeder and waits for its ring.
    pub(crate) fn set_idle(&self) {
        debug_assert!(!self.has_items(), "an idle thread holds nothing");
        // SeqCst, with the feeder's registration under the lock of `Rings`:
        // the feeder either sees this or is woken after it.
        self.idle.store(true, Ordering::SeqCst);
    }

    /// Whether the thread waits for the feeder to fill its ring.
    pub(crate) fn is_idle(&self) -> bool {
        self.idle.load(Ordering::SeqCst)
    }

    /// Waits until the ring holds items and swaps them all into `taken`
    /// (empty, with room for [`RING_SLOTS`]); `false` once the ring is closed
    /// and drained. Each item's slot stays in use until [`start`](Self::start).
    pub(crate) fn take_all<'a>(
        &'a self,
        taken: &'a mut VecDeque<T>,
    ) -> impl Future<Output = bool> + 'a {
        poll_fn(move |cx| self.poll_take_all(taken, cx.waker()))
    }

    /// Whether an item waits now; a stale read may miss one just pushed.
    pub(crate) fn has_items(&self) -> bool {
        self.len.load(Ordering::Acquire) != 0
    }

    /// [`take_all`](Self::take_all) for a thread that parks itself, not a
    /// task: `unpark` wakes it. Every `recheck` (and after each wake-up) it
    /// asks `idle` and returns `None` once it should wait in its runtime
    /// instead.
    pub(crate) fn take_all_parked(
        &self,
        taken: &mut VecDeque<T>,
        unpark: &Waker,
        recheck: Duration,
        idle: impl Fn() -> bool,
    ) -> Option<bool> {
        loop {
            if let Poll::Ready(more) = self.poll_take_all(taken, unpark) {
                return Some(more);
            }
            std::thread::park_timeout(recheck);
            if !idle() {
                return None;
            }
        }
    }

    fn poll_take_all(&self, taken: &mut VecDeque<T>, waker: &Waker) -> Poll<bool> {
        debug_assert!(taken.is_empty(), "the thread works through a batch first");
        let mut state = self.lock();
        if !state.items.is_empty() {
            state.reader = None;
            std::mem::swap(&mut state.items, taken);
            return Poll::Ready(true);
        }
        if state.closed {
            return Poll::Ready(false);
        }
        match &mut state.reader {
            Some(reader) if reader.will_wake(waker) => {}
            reader => *reader = Some(waker.clone()),
        }
        Poll::Pending
    }

    /// The thread starts on an item it took: its slot is free. `freed`
    /// runs when that turned a full ring into one with room.
    #[inline]
    pub(crate) fn start(&self, freed: impl Fn()) {
        if self.len.fetch_sub(1, Ordering::AcqRel) == RING_SLOTS {
            freed();
        }
    }

    /// No more items: the thread drains what is left, then stops.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
    }
}
