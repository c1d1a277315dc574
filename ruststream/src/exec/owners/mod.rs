//! Owner FIFOs for `workers(n, by_key)`: every key is an owner with its
//! own FIFO; a level-triggered, duplicate-free ready-owner set feeds the
//! workers; admission is one atomic commit.
//!
//! Invariants, all under one lock:
//! * an owner is in `ready` exactly when its FIFO is non-empty and no worker
//!   is running it, so a key's deliveries run one at a time, in order;
//! * counts and bytes are charged at admission and released when the worker
//!   finishes the item's turn (the reservation moves with the item from
//!   the FIFO to the worker without being counted twice or nowhere);
//! * a failed admission changes nothing (no enqueue-then-remove);
//! * a one-way record whose key is at its limit is *held* behind the key's
//!   FIFO, in arrival order, counted in the total: it returns its permit and
//!   takes a new one when its key has room again, so a full key holds
//!   up only itself, never the receive loop or the other keys. Nothing else
//!   joins a key's FIFO while it holds records, so order within a key stays.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::{Context, Poll, Waker};

use rustc_hash::FxHashMap as HashMap;

use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Mutex, MutexGuard};

mod owner;
mod refusal;
mod wait;

use owner::{Owner, Queued};
pub(crate) use refusal::Refusal;
pub(crate) use wait::Sleep;
use wait::register_space;

/// Per-owner and total limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OwnerLimits {
    /// Items one owner's FIFO may hold (queued plus running).
    pub(crate) max_count: usize,
    /// Bytes one owner's FIFO may hold.
    pub(crate) max_bytes: usize,
    /// Items all owners may hold together, held records included: the
    /// read-ahead bound of a by-key subscriber.
    pub(crate) max_total: usize,
}

/// Whether the total is still below its limit after an admission: the
/// receive loop, the only producer, then takes its next delivery without
/// looking again (turns that end only make more room).
pub(crate) type Room = bool;

/// Where a one-way record went.
#[derive(Debug)]
pub(crate) enum Admitted<P> {
    /// Into its owner's FIFO.
    Queued,
    /// Held behind its full owner; its permit comes back, to be returned
    /// outside the lock.
    Held(P),
}

/// Where an owner is in the set's slots.
pub(crate) type Slot = usize;

/// Emptied FIFO buffers kept for new owners, so a key that comes and goes
/// does not allocate every time. Bounded, and only small buffers are kept.
const SPARE_FIFOS: usize = 64;
const SPARE_FIFO_CAPACITY: usize = 16;

struct State<T, P> {
    /// Each key's owner, by its slot in `slots`. Keys are already hashes:
    /// Fx hashing them again is enough.
    index: HashMap<u64, Slot>,
    /// The owners. The ready and promotable lists and the turns name them
    /// by slot, so only admission hashes a key; the slots of owners that
    /// went are reused (`free`), so there are never many more slots than
    /// owners at once: `max_total` busy ones and as many idle ones.
    slots: Vec<Owner<T, P>>,
    free: Vec<Slot>,
    ready: VecDeque<Slot>,
    /// Owners whose oldest held record fits into their FIFO again, each
    /// listed once, in the order they got room.
    promotable: VecDeque<Slot>,
    /// Held records, all owners together.
    held: usize,
    total: usize,
    closed: bool,
    /// Owners with nothing queued, running or held, kept for their key's
    /// next delivery (see [`State::owner`]).
    idle: usize,
    spare: Vec<VecDeque<Queued<T, P>>>,
    /// Workers waiting for a ready owner, each listed once under the token
    /// of its wait.
    sleepers: Vec<(u64, Waker)>,
    next_token: u64,
    /// Producers waiting for capacity or a promotable owner (normally just
    /// the receive loop).
    space: Vec<Waker>,
}

/// The wake-ups a finished turn owes, made once the lock is released.
struct Wakes {
    /// The receive loop, if it waits for capacity (normally the only
    /// producer).
    producer: Option<Waker>,
    /// The rare rest: every worker once the set is closed and drained,
    /// other producers.
    rest: Option<Vec<Waker>>,
}

impl Wakes {
    #[inline]
    fn is_empty(&self) -> bool {
        self.producer.is_none() && self.rest.is_none()
    }

    #[inline]
    fn wake(self, worker: Option<Waker>) {
        if let Some(worker) = worker {
            worker.wake();
        }
        if let Some(producer) = self.producer {
            producer.wake();
        }
        if let Some(rest) = self.rest {
            rest.into_iter().for_each(Waker::wake);
        }
    }
}

impl<T, P> State<T, P> {
    /// The head item of the oldest ready owner, which stays out of the
    /// ready set (running) until its turn ends.
    fn take_ready(&mut self) -> Option<Turn<T, P>> {
        let owner = self.ready.pop_front()?;
        let o = &mut self.slots[owner];
        let Queued {
            item,
            permit,
            bytes,
        } = o.fifo.pop_front().expect("ready owner has work");
        o.running = true;
        Some(Turn {
            owner,
            item,
            permit,
            bytes,
        })
    }

    /// Counts an item just appended to `owner`'s FIFO and lists the owner
    /// ready if it `became_ready`; the worker to wake once the lock is
    /// released.
    #[inline]
    fn enqueued(&mut self, owner: Slot, became_ready: bool) -> Option<Waker> {
        self.total += 1;
        if !became_ready {
            return None;
        }
        self.ready.push_back(owner);
        self.wake_one()
    }

    /// Wakes one waiting worker, if any; returns its waker to wake once the
    /// lock is released.
    fn wake_one(&mut self) -> Option<Waker> {
        self.sleepers.pop().map(|(_, waker)| waker)
    }

    fn wake_all_workers(&mut self) -> Vec<Waker> {
        self.sleepers.drain(..).map(|(_, waker)| waker).collect()
    }

    /// `key`'s owner and its slot, found with one hash lookup (or made); an
    /// idle one is counted busy from here (the caller gives it an item or a
    /// held record).
    #[inline]
    fn owner(&mut self, key: u64) -> (Slot, &mut Owner<T, P>) {
        if let Some(&slot) = self.index.get(&key) {
            let o = &mut self.slots[slot];
            if o.is_idle() {
                self.idle -= 1;
            }
            return (slot, o);
        }
        self.new_owner(key)
    }

    /// A new owner for `key`, in a free slot if there is one. Out of line:
    /// a key's owner stays while it has work or is idle, so most
    /// deliveries find theirs.
    #[inline(never)]
    fn new_owner(&mut self, key: u64) -> (Slot, &mut Owner<T, P>) {
        let o = Owner::new(key, self.spare.pop().unwrap_or_default());
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = o;
                slot
            }
            None => {
                self.slots.push(o);
                self.slots.len() - 1
            }
        };
        self.index.insert(key, slot);
        (slot, &mut self.slots[slot])
    }

    /// An owner just went idle: kept for its key's next delivery (no remove
    /// and insert per delivery while keys come and go), until idle owners
    /// outnumber what the set may hold, when they all go.
    fn went_idle(&mut self, max_total: usize) {
        self.idle += 1;
        if self.idle <= max_total {
            return;
        }
        for (slot, o) in self.slots.iter_mut().enumerate() {
            // A slot that went before is free, or holds its key's new owner.
            if !o.is_idle() || self.index.get(&o.key) != Some(&slot) {
                continue;
            }
            self.index.remove(&o.key);
            Self::recycle(&mut self.spare, std::mem::take(&mut o.fifo));
            self.free.push(slot);
        }
        self.idle = 0;
    }

    fn recycle(spare: &mut Vec<VecDeque<Queued<T, P>>>, fifo: VecDeque<Queued<T, P>>) {
        if spare.len() < SPARE_FIFOS && fifo.capacity() <= SPARE_FIFO_CAPACITY {
            spare.push(fifo);
        }
    }
}

/// One item taken by a worker: run it, then end it with [`OwnerSet::finish_and_next`].
#[derive(Debug)]
pub(crate) struct Turn<T, P> {
    /// The owner's slot.
    pub(crate) owner: Slot,
    /// The item.
    pub(crate) item: T,
    /// The permit it carried (returned right before the handler).
    pub(crate) permit: Option<P>,
    pub(crate) bytes: usize,
}

/// Owner FIFOs plus the ready-owner set.
///
/// Waiting is notification-driven with plain wakers kept under the same lock
/// as the state they wait for, so a check and the registration of a waiter
/// are one step (no lost wake-up), and a wake happens only when someone
/// waits: an admission that makes an owner ready wakes one sleeping worker, a
/// finished turn wakes the receive loop only if it waits for capacity.
pub(crate) struct OwnerSet<T, P> {
    state: Mutex<State<T, P>>,
    limits: OwnerLimits,
    /// Mirrors `!state.promotable.is_empty()`, for the receive loop's look
    /// on every delivery without the lock.
    has_promotable: AtomicBool,
}

impl<T, P> OwnerSet<T, P> {
    /// An empty set.
    pub(crate) fn new(limits: OwnerLimits) -> Self {
        OwnerSet {
            state: Mutex::new(State {
                index: HashMap::default(),
                slots: Vec::new(),
                free: Vec::new(),
                ready: VecDeque::new(),
                promotable: VecDeque::new(),
                held: 0,
                total: 0,
                closed: false,
                idle: 0,
                spare: Vec::new(),
                sleepers: Vec::new(),
                next_token: 0,
                space: Vec::new(),
            }),
            limits,
            has_promotable: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T, P>> {
        self.state.lock()
    }

    /// checks, reservation, sequence, append and ready-set insert as
    /// one commit, for a request (a new submission with a caller waiting).
    /// On refusal the item and its permit come back and nothing changed.
    #[allow(clippy::type_complexity)]
    pub(crate) fn try_admit(
        &self,
        owner: u64,
        item: T,
        permit: P,
        bytes: usize,
    ) -> Result<(u64, Room), (Refusal, T, P)> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.closed {
            return Err((Refusal::Closed, item, permit));
        }
        if state.total >= self.limits.max_total {
            return Err((Refusal::Total, item, permit));
        }
        if let Some(refusal) = state
            .index
            .get(&owner)
            .and_then(|&slot| state.slots[slot].refusal(&self.limits, bytes))
        {
            return Err((refusal, item, permit));
        }
        let (seq, worker) = self.enqueue(state, owner, item, Some(permit), bytes);
        let room = state.total < self.limits.max_total;
        drop(guard);
        if let Some(worker) = worker {
            worker.wake();
        }
        Ok((seq, room))
    }

    /// Admits a one-way record: into its owner's FIFO, or held behind it
    /// when the owner is at a limit (the record was received already and is
    /// never capacity-rejected). The receive loop waited for
    /// [`wait_capacity`](Self::wait_capacity) first, and it alone admits, so
    /// the total has room. The item and permit come back only if the set is
    /// closed.
    pub(crate) fn admit(
        &self,
        owner: u64,
        item: T,
        permit: P,
        bytes: usize,
    ) -> Result<(Admitted<P>, Room), (T, P)> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.closed {
            return Err((item, permit));
        }
        // The owner is found (or made) once.
        let (slot, o) = state.owner(owner);
        if o.refusal(&self.limits, bytes).is_some() {
            o.held.push_back((item, bytes));
            state.held += 1;
            state.total += 1;
            let room = state.total < self.limits.max_total;
            return Ok((Admitted::Held(permit), room));
        }
        let (_, became_ready) = o.enqueue(item, Some(permit), bytes);
        let worker = state.enqueued(slot, became_ready);
        let room = state.total < self.limits.max_total;
        drop(guard);
        if let Some(worker) = worker {
            worker.wake();
        }
        Ok((Admitted::Queued, room))
    }

    /// Appends to `owner`'s FIFO (making the owner if needed) and lists it
    /// ready if it became so; returns the worker to wake once the lock is
    /// released.
    fn enqueue(
        &self,
        state: &mut State<T, P>,
        owner: u64,
        item: T,
        permit: Option<P>,
        bytes: usize,
    ) -> (u64, Option<Waker>) {
        // A new or idle owner is empty and always takes one item (limits
        // are at least 1), so no owner is ever made for a refusal.
        let (slot, o) = state.owner(owner);
        let (seq, became_ready) = o.enqueue(item, permit, bytes);
        (seq, state.enqueued(slot, became_ready))
    }

    /// Whether a held record can move into its owner's FIFO: the receive
    /// loop then takes a permit for it before anything new.
    #[inline]
    pub(crate) fn has_promotable(&self) -> bool {
        self.has_promotable.load(Ordering::Acquire)
    }

    /// Moves the oldest held record of the first owner with room into its
    /// FIFO, with `permit` (a new permit per runnable turn). The
    /// permit comes back when no held record has room (or the set closed).
    pub(crate) fn promote(&self, permit: P) -> Result<(), P> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let Some(owner) = state.promotable.pop_front() else {
            return Err(permit);
        };
        let o = &mut state.slots[owner];
        let (item, bytes) = o.held.pop_front().expect("promotable owner holds records");
        state.held -= 1;
        let (_, became_ready) = o.enqueue(item, Some(permit), bytes);
        // Still room (several turns ended before a permit came): it stays
        // listed, behind the other keys.
        if o.can_promote(&self.limits) {
            state.promotable.push_back(owner);
        } else {
            o.promotable = false;
        }
        self.has_promotable
            .store(!state.promotable.is_empty(), Ordering::Release);
        let worker = if became_ready {
            state.ready.push_back(owner);
            state.wake_one()
        } else {
            None
        };
        drop(guard);
        if let Some(worker) = worker {
            worker.wake();
        }
        Ok(())
    }

    /// Whether the total is below its limit now (`false` once closed);
    /// `None` when the receive loop must [`wait_capacity`](Self::wait_capacity).
    #[inline]
    pub(crate) fn capacity_now(&self) -> Option<bool> {
        let state = self.lock();
        if state.closed {
            return Some(false);
        }
        (state.total < self.limits.max_total).then_some(true)
    }

    /// Waits until the total is below its limit (the receive loop calls this
    /// before taking the next delivery from the broker). False once closed.
    pub(crate) async fn wait_capacity(&self) -> bool {
        poll_fn(|cx| {
            let mut state = self.lock();
            if state.closed {
                return Poll::Ready(false);
            }
            if state.total < self.limits.max_total {
                return Poll::Ready(true);
            }
            register_space(&mut state.space, cx);
            Poll::Pending
        })
        .await
    }

    /// Ready once a held record can be promoted (or the set closed):
    /// wakes the receive loop out of a wait for new records. Without held
    /// records nothing can become promotable, so the wait registers only
    /// while some are held: an idle loop is not woken by every turn.
    pub(crate) fn poll_promotable(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_promotable() {
            return Poll::Ready(());
        }
        let mut state = self.lock();
        if state.closed || !state.promotable.is_empty() {
            return Poll::Ready(());
        }
        if state.held > 0 {
            register_space(&mut state.space, cx);
        }
        Poll::Pending
    }

    /// A worker's wait for turns. Polled, it yields the head item of the
    /// oldest ready owner, which stays out of the ready set until
    /// its turn ends; `None` once the set is closed and fully
    /// drained. Reusable from one turn to the next.
    pub(crate) fn waiter(&self) -> Sleep<'_, T, P> {
        Sleep {
            set: self,
            token: None,
        }
    }

    /// Ends a turn: releases its reservation, puts the owner back into the
    /// ready set if it has more work, and lists it promotable if a held
    /// record now fits. (Workers end theirs with
    /// [`finish_and_next`](Self::finish_and_next).)
    #[cfg(all(test, not(loom)))]
    pub(crate) fn finish(&self, owner: Slot, bytes: usize) {
        let mut guard = self.lock();
        let wakes = self.end_turn(&mut guard, owner, bytes);
        let worker = (!guard.ready.is_empty())
            .then(|| guard.wake_one())
            .flatten();
        drop(guard);
        wakes.wake(worker);
    }

    /// `finish` (the end of a turn), then the next turn for the same worker in
    /// the same lock, if an owner is ready: a worker with work at hand takes
    /// it without a wake-up (the head of the oldest ready owner, as
    /// [`waiter`](Self::waiter) hands out).
    pub(crate) fn finish_and_next(&self, owner: Slot, bytes: usize) -> Option<Turn<T, P>> {
        let mut guard = self.lock();
        let wakes = self.end_turn(&mut guard, owner, bytes);
        // More work than this worker takes: another sleeping worker runs it.
        let worker = (guard.ready.len() > 1).then(|| guard.wake_one()).flatten();
        if worker.is_none() && wakes.is_empty() {
            // Nothing to wake (the common case): the turn goes straight to
            // the caller, not through a local kept across the wake-ups.
            return guard.take_ready();
        }
        let turn = guard.take_ready();
        drop(guard);
        wakes.wake(worker);
        turn
    }

    /// The bookkeeping of a finished turn under the lock; what to wake
    /// once it is released.
    fn end_turn(&self, state: &mut State<T, P>, owner: Slot, bytes: usize) -> Wakes {
        state.total -= 1;
        let o = &mut state.slots[owner];
        o.running = false;
        o.count -= 1;
        o.bytes -= bytes;
        let made_ready = !o.fifo.is_empty();
        if !o.promotable && o.can_promote(&self.limits) {
            o.promotable = true;
            state.promotable.push_back(owner);
            self.has_promotable.store(true, Ordering::Release);
        }
        if made_ready {
            state.ready.push_back(owner);
        } else if o.is_idle() {
            state.went_idle(self.limits.max_total);
        }
        // Normally the receive loop alone; the buffer stays for its next wait.
        let producer = state.space.pop();
        let drained = state.closed && state.total == 0;
        let rest = (drained || !state.space.is_empty()).then(|| {
            let mut rest = if drained {
                state.wake_all_workers()
            } else {
                Vec::new()
            };
            rest.append(&mut state.space);
            rest
        });
        Wakes { producer, rest }
    }

    /// Stops admissions; held records join their FIFOs (they were received:
    /// they are processed like the rest), workers drain what is queued and
    /// then see `None`.
    pub(crate) fn close(&self) {
        let mut guard = self.lock();
        let state = &mut *guard;
        state.closed = true;
        state.promotable.clear();
        self.has_promotable.store(false, Ordering::Release);
        for (id, o) in state.slots.iter_mut().enumerate() {
            o.promotable = false;
            let was_idle = o.fifo.is_empty() && !o.running;
            while let Some((item, bytes)) = o.held.pop_front() {
                o.enqueue(item, None, bytes);
            }
            if was_idle && !o.fifo.is_empty() {
                state.ready.push_back(id);
            }
        }
        state.held = 0;
        let workers = state.wake_all_workers();
        let space = std::mem::take(&mut state.space);
        drop(guard);
        workers.into_iter().chain(space).for_each(Waker::wake);
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
