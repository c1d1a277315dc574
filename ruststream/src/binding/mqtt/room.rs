//! Room in a connection's request channel: publishes (and acks at close)
//! that find `rumqttc`'s channel full wait here, and the event loop
//! announces room each time it takes a request off the channel — which it
//! does for every ack it writes, so the announcement costs one atomic load
//! unless someone actually waits.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

#[derive(Default)]
pub(super) struct Room {
    notify: Notify,
    /// Callers counted by [`Room::waiter`] now.
    waiters: AtomicUsize,
}

/// A caller that may wait for room, until dropped.
pub(super) struct Waiter<'a>(&'a Room);

impl Room {
    /// Counts the caller as one that may wait: [`made`](Self::made)
    /// notifies while it is counted. Count first, then look for room
    /// (with a [`notified`](Waiter::notified) made before the look): a
    /// `made` that saw no waiter came before the look, which finds its room.
    pub(super) fn waiter(&self) -> Waiter<'_> {
        self.waiters.fetch_add(1, SeqCst);
        Waiter(self)
    }

    /// The event loop took a request off the channel.
    #[inline]
    pub(super) fn made(&self) {
        if self.waiters.load(SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Wakes every waiter, counted or not (close, a broken connection).
    pub(super) fn wake_all(&self) {
        self.notify.notify_waiters();
    }
}

impl Waiter<'_> {
    /// Resolves at the next announcement after this call.
    pub(super) fn notified(&self) -> Notified<'_> {
        self.0.notify.notified()
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, SeqCst);
    }
}
