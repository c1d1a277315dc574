//! The ring between a `threads(n)` feeder and one dedicated thread: 8 slots
//! (RT-5). The feeder is the only producer and checks for space before it
//! takes a delivery from the broker, so a push never finds the ring full.
//!
//! Wake-ups happen only on the edges someone waits for: a push hands the
//! feeder the waker of a thread that waits (its ring was empty), which the
//! feeder wakes in a batch before it waits itself; a pop wakes the feeder
//! only if the ring was full and the feeder waits for space.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// Slots per ring (RT-5).
pub(crate) const RING_SLOTS: usize = 8;

pub(crate) struct Ring<T> {
    state: Mutex<RingState<T>>,
    /// `items.len()`, written under the lock and read without it: the feeder
    /// (the only producer) looks for space without taking every ring's
    /// lock. A stale read errs on the side of "full" only, since the count
    /// can drop but never rise behind the feeder's back.
    len: AtomicUsize,
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
        }
    }

    fn lock(&self) -> MutexGuard<'_, RingState<T>> {
        // No user code runs under this lock: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn has_space(&self) -> bool {
        self.len.load(Ordering::Acquire) < RING_SLOTS
    }

    /// Appends an item; the caller checked [`has_space`](Self::has_space).
    /// Returns the thread's waker if it waits for this item: the caller
    /// wakes it, at the latest before it waits itself.
    #[must_use = "a waiting thread must be woken"]
    pub(crate) fn push(&self, item: T) -> Option<Waker> {
        let mut state = self.lock();
        debug_assert!(state.items.len() < RING_SLOTS, "feeder checks space first");
        state.items.push_back(item);
        self.len.store(state.items.len(), Ordering::Release);
        state.reader.take()
    }

    /// The next item, waiting for one; `None` once closed and drained.
    /// `freed` runs (outside the lock) when the pop turned a full ring into
    /// one with a free slot.
    // A plain `poll_fn` rather than an `async fn` around one: one future
    // layer less to resume for every delivery.
    pub(crate) fn pop<'a>(&'a self, freed: impl Fn() + 'a) -> impl Future<Output = Option<T>> + 'a {
        poll_fn(move |cx| self.poll_pop(cx, &freed))
    }

    fn poll_pop(&self, cx: &mut Context<'_>, freed: &impl Fn()) -> Poll<Option<T>> {
        let mut state = self.lock();
        let was_full = state.items.len() == RING_SLOTS;
        if let Some(item) = state.items.pop_front() {
            state.reader = None;
            self.len.store(state.items.len(), Ordering::Release);
            drop(state);
            if was_full {
                freed();
            }
            return Poll::Ready(Some(item));
        }
        if state.closed {
            return Poll::Ready(None);
        }
        match &mut state.reader {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            reader => *reader = Some(cx.waker().clone()),
        }
        Poll::Pending
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
