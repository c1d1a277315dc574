//! One receive queue of the memory Core: a FIFO bounded by a byte high-water
//! mark (JQ-1), shared by the members of a queue group or owned by one
//! fan-out subscription.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Poll;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{BrokerShared, Connection};
use crate::{Envelope, Error, Result, Text};

/// Why a frame was not admitted.
pub(crate) enum Refused {
    /// No room under the byte HWM right now; the envelope comes back.
    Full(Envelope),
    /// The queue is closed.
    Closed,
}

/// Queue capacity kept after a burst drains.
const SHRINK_ABOVE: usize = 1024;

struct State {
    items: VecDeque<Envelope>,
    bytes: usize,
    closed: bool,
}

pub(crate) struct Queue {
    state: Mutex<State>,
    /// Consumers wait here; one notification per admitted frame.
    readable: Notify,
    /// `CoreHwmBudgetBytes` for this queue.
    budget: usize,
    /// Subscriptions reading this queue; the last one to leave closes it.
    members: AtomicUsize,
    pub(crate) subject: Text,
    pub(crate) dead_letter: Option<Text>,
    pub(crate) shared: Arc<BrokerShared>,
    /// Back to the broker for dead-lettering; weak so queues never keep a
    /// closed broker alive.
    pub(crate) broker: Weak<super::Inner>,
}

impl Queue {
    pub(crate) fn new(
        subject: Text,
        dead_letter: Option<Text>,
        budget: usize,
        shared: Arc<BrokerShared>,
        broker: Weak<super::Inner>,
    ) -> Self {
        Queue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                bytes: 0,
                closed: false,
            }),
            readable: Notify::new(),
            budget,
            members: AtomicUsize::new(0),
            subject,
            dead_letter,
            shared,
            broker,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic never happens while the lock is held (no user code runs under
        // it), so a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `env` if the queue and the broker-wide limit have room. A frame
    /// larger than the budget is admitted into an empty queue, so no message
    /// is refused forever; memory stays bounded by budget + one frame.
    // The refused envelope comes back by value: boxing it would allocate on
    // the very path that is already under pressure.
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_push(&self, env: Envelope) -> Result<(), Refused> {
        let len = env.frame_bytes();
        let mut state = self.lock();
        if state.closed {
            return Err(Refused::Closed);
        }
        if state.bytes > 0 && state.bytes + len > self.budget {
            return Err(Refused::Full(env));
        }
        if !self.shared.charge(len) {
            return Err(Refused::Full(env));
        }
        state.bytes += len;
        state.items.push_back(env);
        drop(state);
        self.readable.notify_one();
        Ok(())
    }

    /// Admits `env`, waiting for space until `deadline` (JQ-19: refused →
    /// wait → submit once → `DeadlineExceeded`). Waiter slots are bounded; when
    /// they are all taken the call fails at once. Nothing is dropped to make
    /// room and nothing polls: waiters sleep until a consumer frees bytes.
    ///
    /// `deadline` is computed only if the publish has to wait, so the fast path
    /// never reads the clock.
    pub(crate) async fn push(
        &self,
        env: Envelope,
        deadline: impl FnOnce() -> Instant,
    ) -> Result<()> {
        tokio::task::coop::consume_budget().await;
        match self.try_push(env) {
            Ok(()) => Ok(()),
            Err(Refused::Closed) => Err(super::queue_closed()),
            // Out of line and boxed: the waiting state (waiter slot, space
            // notification, timer) never inflates the futures of the publish
            // path that does not wait.
            Err(Refused::Full(env)) => Box::pin(self.wait_push(env, deadline)).await,
        }
    }

    /// The waiting half of [`push`](Self::push), for a frame `try_push` just
    /// refused as full.
    pub(crate) async fn wait_push(
        &self,
        mut env: Envelope,
        deadline: impl FnOnce() -> Instant,
    ) -> Result<()> {
        let deadline = deadline();
        let Some(_slot) = self.shared.waiter_slot() else {
            crate::metrics::deadline_exceeded("memory");
            return Err(Error::DeadlineExceeded(
                "every publish waiter slot is taken",
            ));
        };
        loop {
            let mut space = pin!(self.shared.space.notified());
            space.as_mut().enable();
            env = match self.try_push(env) {
                Ok(()) => return Ok(()),
                Err(Refused::Closed) => return Err(super::queue_closed()),
                Err(Refused::Full(env)) => env,
            };
            if tokio::time::timeout_at(deadline, space).await.is_err() {
                crate::metrics::deadline_exceeded("memory");
                return Err(Error::DeadlineExceeded(
                    "receive queue stayed full until the deadline",
                ));
            }
        }
    }

    /// Puts a delivered frame back at the head for redelivery. It was already
    /// admitted once, so it is not refused again: the overshoot is bounded by the
    /// number of deliveries in flight.
    pub(crate) fn requeue(&self, env: Envelope) -> bool {
        let len = env.frame_bytes();
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        self.shared.charge_unchecked(len);
        state.bytes += len;
        state.items.push_front(env);
        drop(state);
        self.readable.notify_one();
        true
    }

    /// Waits for a frame after [`try_pop`](Self::try_pop) found the queue
    /// empty: `None` once closed and drained, or once `conn` closes while
    /// waiting. The frame is polled first, then the connection: a frame
    /// already signalled wins over a close that races it.
    pub(crate) async fn wait_pop(&self, conn: &Connection) -> Option<Envelope> {
        let mut closed = pin!(conn.closed());
        loop {
            let mut readable = pin!(self.readable.notified());
            readable.as_mut().enable();
            if let Some(taken) = self.try_pop() {
                return taken;
            }
            let woken = poll_fn(|cx| {
                if readable.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                closed.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if !woken {
                return None;
            }
        }
    }

    /// `Some(Some(frame))`, `Some(None)` when closed, `None` when empty.
    pub(crate) fn try_pop(&self) -> Option<Option<Envelope>> {
        let mut state = self.lock();
        if let Some(env) = state.items.pop_front() {
            let len = env.frame_bytes();
            state.bytes -= len;
            if state.items.is_empty() && state.items.capacity() > SHRINK_ABOVE {
                // Give a burst's memory back once it has drained.
                state.items.shrink_to(SHRINK_ABOVE);
            }
            drop(state);
            self.shared.release(len);
            return Some(Some(env));
        }
        state.closed.then_some(None)
    }

    pub(crate) fn join(&self) {
        self.members.fetch_add(1, Ordering::Relaxed);
    }

    /// Returns true when the last member left.
    pub(crate) fn leave(&self) -> bool {
        self.members.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Closes the queue: consumers drain nothing more and see the end; frames
    /// still queued are released.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let bytes = std::mem::take(&mut state.bytes);
        state.items.clear();
        drop(state);
        self.shared.release(bytes);
        self.readable.notify_waiters();
    }
}
