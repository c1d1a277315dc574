//! The ring between a `threads(n)` feeder and one dedicated thread: 8 slots
//! (RT-5). The feeder is the only producer and checks for space before it
//! takes a delivery from the broker, so a push never finds the ring full.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// Slots per ring (RT-5).
pub(crate) const RING_SLOTS: usize = 8;

pub(crate) struct Ring<T> {
    state: Mutex<RingState<T>>,
    /// The thread waits here for an item.
    readable: Notify,
}

struct RingState<T> {
    items: VecDeque<T>,
    closed: bool,
}

impl<T> Ring<T> {
    pub(crate) fn new() -> Self {
        Ring {
            state: Mutex::new(RingState {
                items: VecDeque::with_capacity(RING_SLOTS),
                closed: false,
            }),
            readable: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RingState<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn has_space(&self) -> bool {
        self.lock().items.len() < RING_SLOTS
    }

    /// Appends an item; the caller checked [`has_space`](Self::has_space).
    pub(crate) fn push(&self, item: T) {
        let mut state = self.lock();
        debug_assert!(state.items.len() < RING_SLOTS, "feeder checks space first");
        state.items.push_back(item);
        drop(state);
        self.readable.notify_one();
    }

    /// The next item, waiting for one; `None` once closed and drained.
    pub(crate) async fn pop(&self) -> Option<T> {
        loop {
            let mut readable = pin!(self.readable.notified());
            readable.as_mut().enable();
            {
                let mut state = self.lock();
                if let Some(item) = state.items.pop_front() {
                    return Some(item);
                }
                if state.closed {
                    return None;
                }
            }
            readable.await;
        }
    }

    /// No more items: the thread drains what is left, then stops.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.readable.notify_one();
    }
}
