//! One receive queue of the memory Core: FIFO lanes, one per publishing
//! connection (a peer), each bounded by the byte high-water mark, read
//! in fair rounds, shared by the members of a queue group or owned by
//! one fan-out subscription.
//!
//! * Accounting is per peer: a peer that fills its lane waits
//!   for space while other peers still get in.
//! * A receive round takes at most
//!   [`ROUND_RECORDS`](super::lanes::ROUND_RECORDS) frames, a byte budget
//!   and a time budget, whichever ends first; the next round starts at the
//!   lane after the one where it stopped, so a peer that keeps sending never
//!   starves the others.
//! * Remote pause: members that serve requests register a
//!   receive-flow switch; while every member is paused, publishers wait as
//!   if the queue were full. The pause and the byte HWM are independent
//!   blockers: resuming lifts only the pause.

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use parking_lot::{Mutex, MutexGuard};
use tokio::time::Instant;

use super::lanes::{Lane, Popped, ReceiveRound, Round};
use super::queue_state::State;
pub use super::stats::QueueStats;
use super::{BrokerShared, Connection};
use crate::waiters::Waiters;
use crate::{Envelope, Error, Result, Text};

/// Why a frame was not admitted.
pub(crate) enum Refused {
    /// No room under the byte HWM (or the queue is remotely paused) right
    /// now; the envelope comes back.
    Full(Envelope),
    /// The queue is closed.
    Closed,
}

pub(crate) struct Queue {
    /// Names the queue in single-lane reply subjects.
    pub(crate) id: u64,
    /// Set once a single-lane requester uses this queue: heads are then
    /// checked for replies.
    carries_replies: AtomicBool,
    /// Subjects of single-lane replies start with this.
    reply_prefix: Text,
    state: Mutex<State>,
    /// `CoreHwmBudgetBytes` for each peer's lane.
    budget: usize,
    round: ReceiveRound,
    /// Subscriptions reading this queue; the last one to leave closes it.
    members: AtomicUsize,
    pub(crate) subject: Text,
    pub(crate) group: Option<Text>,
    pub(crate) dead_letter: Option<Text>,
    pub(crate) shared: Arc<BrokerShared>,
    /// Back to the broker for dead-lettering; weak so queues never keep a
    /// closed broker alive.
    pub(crate) broker: Weak<super::Inner>,
}

impl Queue {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        reply_prefix: Text,
        subject: Text,
        group: Option<Text>,
        dead_letter: Option<Text>,
        budget: usize,
        round: ReceiveRound,
        shared: Arc<BrokerShared>,
        broker: Weak<super::Inner>,
    ) -> Self {
        Queue {
            id,
            carries_replies: AtomicBool::new(false),
            reply_prefix,
            state: Mutex::new(State {
                lanes: vec![Lane::new(0)],
                cursor: 0,
                round: Round::default(),
                closed: false,
                paused_members: 0,
                readers: Waiters::default(),
            }),
            budget,
            round,
            members: AtomicUsize::new(0),
            subject,
            group,
            dead_letter,
            shared,
            broker,
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Whether a lane that still holds `left` bytes is at its low-water
    /// mark (see `BrokerShared::release`).
    #[inline]
    fn drained(&self, left: usize) -> bool {
        left <= self.budget / 2
    }

    fn paused(&self, state: &State) -> bool {
        state.paused_members > 0 && state.paused_members >= self.members.load(Ordering::Acquire)
    }

    /// Admits `env` from `peer` if its lane and the broker-wide limit have
    /// room and the queue is not remotely paused. A frame larger than the
    /// budget is admitted into an empty lane, so no message is refused
    /// forever; memory stays bounded by budget + one frame per peer.
    // The refused envelope comes back by value: boxing it would allocate on
    // the very path that is already under pressure.
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_push(&self, peer: u64, env: Envelope) -> Result<(), Refused> {
        let len = env.frame_bytes();
        let mut state = self.lock();
        if state.closed {
            return Err(Refused::Closed);
        }
        if state.paused_members > 0 && self.paused(&state) {
            return Err(Refused::Full(env));
        }
        let budget = self.budget;
        let lane = state.lane(peer);
        if lane.bytes > 0 && lane.bytes + len > budget {
            return Err(Refused::Full(env));
        }
        if lane.items.is_empty() && self.is_reply(&env) {
            // A single-lane reply at the head: it bypasses the permit and
            // completes its caller now, without ever being a delivery.
            drop(state);
            self.complete(env);
            return Ok(());
        }
        if !self.shared.charge(len) {
            return Err(Refused::Full(env));
        }
        lane.bytes += len;
        lane.items.push_back(env);
        let reader = state.readers.take_one();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
        Ok(())
    }

    fn is_reply(&self, env: &Envelope) -> bool {
        self.carries_replies.load(Ordering::Relaxed)
            && env.subject().starts_with(self.reply_prefix.as_str())
    }

    pub(crate) fn carry_replies(&self) {
        self.carries_replies.store(true, Ordering::Relaxed);
    }

    fn complete(&self, reply: Envelope) {
        match self.broker.upgrade() {
            Some(broker) => broker.complete_lane_reply(reply),
            None => crate::metrics::late_reply("memory"),
        }
    }

    /// Admits `env`, which [`try_push`](Self::try_push) just refused as
    /// full, waiting for space until `deadline` (refused → wait → submit
    /// once → `DeadlineExceeded`). Waiter slots are bounded; when they are
    /// all taken the call fails at once. Nothing is dropped to make room and
    /// nothing polls: waiters sleep until a consumer frees bytes or the
    /// remote pause lifts. The publishing connection `conn` closing ends the
    /// wait with `Closed`, the message not admitted.
    pub(crate) async fn wait_push(
        &self,
        peer: u64,
        conn: Option<&Connection>,
        mut env: Envelope,
        deadline: Instant,
    ) -> Result<()> {
        let Some(_slot) = self.shared.waiter_slot() else {
            crate::metrics::deadline_exceeded("memory");
            return Err(Error::DeadlineExceeded(
                "every publish waiter slot is taken",
            ));
        };
        loop {
            let mut space = pin!(self.shared.space.notified());
            space.as_mut().enable();
            if conn.is_some_and(Connection::is_closed) {
                return Err(super::connection_closed());
            }
            env = match self.try_push(peer, env) {
                Ok(()) => return Ok(()),
                Err(Refused::Closed) => return Err(super::queue_closed()),
                Err(Refused::Full(env)) => env,
            };
            if tokio::time::timeout_at(deadline, space).await.is_err() {
                // Space below the low-water mark wakes waiters; space above
                // it may have come since without a wake-up: one last look.
                if conn.is_some_and(Connection::is_closed) {
                    return Err(super::connection_closed());
                }
                match self.try_push(peer, env) {
                    Ok(()) => return Ok(()),
                    Err(Refused::Closed) => return Err(super::queue_closed()),
                    Err(Refused::Full(_)) => {}
                }
                crate::metrics::deadline_exceeded("memory");
                return Err(Error::DeadlineExceeded(
                    "receive queue stayed full or paused until the deadline",
                ));
            }
        }
    }

    /// Puts a frame delivered from `peer`'s lane back at the head of that
    /// lane, for redelivery: its bytes count against its own publisher's
    /// budget again, never another's. It was already admitted once, so it
    /// is not refused again: the overshoot is bounded by the number of
    /// deliveries in flight.
    pub(crate) fn requeue(&self, peer: u64, env: Envelope) -> bool {
        let len = env.frame_bytes();
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        self.shared.charge_unchecked(len);
        let lane = state.lane(peer);
        lane.bytes += len;
        lane.items.push_front(env);
        let reader = state.readers.take_one();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
        true
    }

    /// Waits for a frame: `None` once closed and drained, or once `conn`
    /// closes while waiting. A frame at hand wins over a close that races
    /// it. Looking and registering happen in one lock (see [`Waiters`]); a
    /// closing connection wakes the readers of every queue
    /// ([`wake_readers`](Self::wake_readers)).
    pub(crate) async fn wait_pop(&self, conn: &Connection) -> Option<(Envelope, u64)> {
        let mut reader = Reader {
            queue: self,
            token: None,
        };
        poll_fn(|cx| self.poll_pop(conn, &mut reader.token, cx)).await
    }

    fn poll_pop(
        &self,
        conn: &Connection,
        token: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<(Envelope, u64)>> {
        let mut state = self.lock();
        if let Some(popped) = state.pop(&self.round) {
            // Done waiting: nothing for the `Reader` to hand on.
            state.readers.forget(token.take());
            self.taken(state, popped.len, popped.left);
            return Poll::Ready(Some((popped.env, popped.peer)));
        }
        if state.closed || conn.is_closed() {
            state.readers.forget(token.take());
            return Poll::Ready(None);
        }
        state.readers.register(token, cx.waker());
        Poll::Pending
    }

    /// Waits until a frame is at hand, taking nothing: `false` once the
    /// queue is closed or `conn` closes. For a consumer that takes its job
    /// permit only once there is something to receive; it then takes
    /// the frame with [`try_pop`](Self::try_pop), which may find it gone to
    /// another member of the group (it waits again).
    pub(crate) fn wait_ready<'a>(&'a self, conn: &'a Connection) -> WaitReady<'a> {
        WaitReady {
            reader: Reader {
                queue: self,
                token: None,
            },
            conn,
        }
    }

    /// Wakes every consumer waiting on this queue, to look again.
    pub(crate) fn wake_readers(&self) {
        let readers = self.lock().readers.take_all();
        for reader in readers {
            reader.wake();
        }
    }

    /// The head frame in fair order, made into what `make` makes of it and
    /// the peer whose lane it left (no user code: `make` runs under the
    /// queue's lock); `None` if there is none (a closed queue holds none).
    #[inline]
    pub(crate) fn try_pop_into<R>(&self, make: impl FnOnce(Envelope, u64) -> R) -> Option<R> {
        let mut state = self.lock();
        let Popped {
            env,
            peer,
            len,
            left,
        } = state.pop(&self.round)?;
        if self.carries_replies.load(Ordering::Relaxed) {
            let made = make(env, peer);
            self.taken(state, len, left);
            return Some(made);
        }
        if !self.shared.release_bytes(len, self.drained(left)) {
            // Nothing to wake (the common case): what `make` makes goes
            // straight to the caller, not through a local kept across the
            // unlock and a wake-up.
            return Some(make(env, peer));
        }
        drop(state);
        self.shared.space.notify_waiters();
        Some(make(env, peer))
    }

    /// Up to `max` head frames in fair order, each handed to `each`, under
    /// one lock; how many. A queue that carries replies pops one at a time
    /// (replies reaching the head complete as each frame leaves).
    pub(crate) fn try_pop_many(&self, max: usize, mut each: impl FnMut(Envelope, u64)) -> usize {
        let mut state = self.lock();
        if self.carries_replies.load(Ordering::Relaxed) {
            drop(state);
            let popped = std::iter::from_fn(|| self.try_pop_into(|env, peer| (env, peer)));
            return popped.take(max).map(|(env, peer)| each(env, peer)).count();
        }
        let (mut taken, mut bytes, mut drained) = (0, 0, false);
        while taken < max {
            let Some(popped) = state.pop(&self.round) else {
                break;
            };
            bytes += popped.len;
            // Any lane that fell to its low-water mark wakes the publishers.
            drained |= self.drained(popped.left);
            each(popped.env, popped.peer);
            taken += 1;
        }
        drop(state);
        if taken > 0 {
            self.shared.release(bytes, drained);
        }
        taken
    }

    /// The bookkeeping of a frame of `len` bytes just popped under `state`
    /// from a lane that still holds `left` bytes.
    #[inline]
    fn taken(&self, mut state: MutexGuard<'_, State>, len: usize, left: usize) {
        let lane_drained = self.drained(left);
        if self.carries_replies.load(Ordering::Relaxed) {
            // Replies that reached a head with this pop complete now.
            let (replies, bytes) = state.take_head_replies(&self.reply_prefix);
            drop(state);
            self.shared.release(len + bytes, lane_drained);
            for reply in replies {
                self.complete(reply);
            }
            return;
        }
        drop(state);
        self.shared.release(len, lane_drained);
    }

    /// One member more; `paused`: its receive flow is paused from the
    /// start (counted with it under the queue's lock, so no publish sees
    /// the member without its pause).
    pub(crate) fn join(&self, paused: bool) {
        let mut state = self.lock();
        self.members.fetch_add(1, Ordering::AcqRel);
        state.paused_members += usize::from(paused);
    }

    /// Returns true when the last member left.
    pub(crate) fn leave(&self) -> bool {
        let last = self.members.fetch_sub(1, Ordering::AcqRel) == 1;
        // One member fewer may leave only paused members: publishers that
        // waited for the running one must look again.
        self.shared.space.notify_waiters();
        last
    }

    /// One member's receive flow paused or resumed. Publishers
    /// waiting on the pause are woken when it lifts.
    pub(crate) fn set_member_paused(&self, paused: bool) {
        let mut state = self.lock();
        if paused {
            state.paused_members += 1;
        } else {
            state.paused_members -= 1;
        }
        drop(state);
        if !paused {
            self.shared.space.notify_waiters();
        }
    }

    /// Closes the queue: consumers drain nothing more and see the end; frames
    /// still queued are released.
    pub(crate) fn close(&self) {
        if self.carries_replies.load(Ordering::Relaxed)
            && let Some(broker) = self.broker.upgrade()
        {
            broker.forget_reply_lane(self.id);
        }
        let mut state = self.lock();
        state.closed = true;
        let bytes: usize = state.lanes.iter().map(|l| l.bytes).sum();
        state.lanes = vec![Lane::new(0)];
        state.cursor = 0;
        let readers = state.readers.take_all();
        drop(state);
        self.shared.release(bytes, true);
        for reader in readers {
            reader.wake();
        }
    }

    pub(crate) fn stats(&self) -> QueueStats {
        let state = self.lock();
        QueueStats {
            subject: self.subject.clone(),
            queue_group: self.group.clone(),
            members: self.members.load(Ordering::Acquire),
            queued: state.lanes.iter().map(|l| l.items.len()).sum(),
            bytes: state.lanes.iter().map(|l| l.bytes).sum(),
            peers: state.lanes.iter().filter(|l| !l.items.is_empty()).count(),
            receive_paused: self.paused(&state),
        }
    }
}

/// The future of [`Queue::wait_ready`]: by hand, so a consumer's every wait
/// is one poll function and not nested `async` state.
pub(crate) struct WaitReady<'a> {
    reader: Reader<'a>,
    conn: &'a Connection,
}

impl Future for WaitReady<'_> {
    type Output = bool;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let this = self.get_mut();
        let reader = &mut this.reader;
        let mut state = reader.queue.lock();
        // A closed connection takes nothing more (`try_pop` is never
        // called), so it must not look ready.
        if state.closed || this.conn.is_closed() {
            state.readers.forget(reader.token.take());
            return Poll::Ready(false);
        }
        if state.lanes.iter().any(|lane| !lane.items.is_empty()) {
            state.readers.forget(reader.token.take());
            return Poll::Ready(true);
        }
        state.readers.register(&mut reader.token, cx.waker());
        Poll::Pending
    }
}

/// A consumer's place among a queue's [`Waiters`] while it waits. Dropped
/// after it was woken for a frame it never took (its wait was cancelled),
/// it hands the wake-up on, so the frame does not sit while others wait.
struct Reader<'a> {
    queue: &'a Queue,
    token: Option<u64>,
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if self.token.is_none() {
            return;
        }
        let mut state = self.queue.lock();
        if state.readers.forget(self.token) {
            return;
        }
        // Woken (taken off the list) but gone: pass it on if frames wait.
        let next = state
            .lanes
            .iter()
            .any(|lane| !lane.items.is_empty())
            .then(|| state.readers.take_one())
            .flatten();
        drop(state);
        if let Some(next) = next {
            next.wake();
        }
    }
}
