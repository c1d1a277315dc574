//! Owner FIFOs for `workers(n, by_key)` (RT-4): every key is an owner with its
//! own FIFO; a level-triggered, duplicate-free ready-owner set (JQ-9) feeds the
//! workers; admission is one atomic commit (JQ-10).
//!
//! Invariants, all under one lock:
//! * an owner is in `ready` exactly when its FIFO is non-empty and no worker
//!   is running it, so a key's deliveries run one at a time, in order;
//! * counts and bytes are charged at admission and released when the worker
//!   finishes the item's turn (JQ-22: the reservation moves with the item from
//!   the FIFO to the worker without being counted twice or nowhere);
//! * a failed admission changes nothing (no enqueue-then-remove).

use std::collections::VecDeque;
use std::collections::hash_map::Entry;
use std::future::poll_fn;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use rustc_hash::FxHashMap as HashMap;

/// Per-owner and total limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OwnerLimits {
    /// Items one owner's FIFO may hold (queued plus running).
    pub(crate) max_count: usize,
    /// Bytes one owner's FIFO may hold.
    pub(crate) max_bytes: usize,
    /// Items all owners may hold together: the read-ahead bound of a by-key
    /// subscriber.
    pub(crate) max_total: usize,
}

/// Why an admission was refused: a structural limit (JQ-21), distinct from a
/// deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The owner's FIFO is at its count limit.
    OwnerCount,
    /// The owner's FIFO is at its byte limit.
    OwnerBytes,
    /// All owners together are at the total limit.
    Total,
    /// The set is closed.
    Closed,
}

impl From<Refusal> for crate::Error {
    /// A structural limit (JQ-21), never a deadline: the caller can tell a
    /// full owner FIFO from a publish that ran out of time (JQ-24 item 16).
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::OwnerCount => {
                crate::Error::StructuralLimit("owner FIFO is at its count limit".into())
            }
            Refusal::OwnerBytes => {
                crate::Error::StructuralLimit("owner FIFO is at its byte limit".into())
            }
            Refusal::Total => {
                crate::Error::StructuralLimit("owner FIFOs are at their total limit".into())
            }
            Refusal::Closed => crate::Error::Closed("owner FIFOs are closed"),
        }
    }
}

struct Owner<T> {
    fifo: VecDeque<(T, usize)>,
    /// Items charged to this owner: queued plus the one running.
    count: usize,
    bytes: usize,
    next_seq: u64,
    running: bool,
}

/// Emptied FIFO buffers kept for new owners, so a key that comes and goes
/// does not allocate every time. Bounded, and only small buffers are kept.
const SPARE_FIFOS: usize = 64;
const SPARE_FIFO_CAPACITY: usize = 16;

struct State<T> {
    /// Keys are already hashes: Fx hashing them again is enough.
    owners: HashMap<u64, Owner<T>>,
    ready: VecDeque<u64>,
    total: usize,
    closed: bool,
    spare: Vec<VecDeque<(T, usize)>>,
    /// Workers waiting for a ready owner, each listed once under the token
    /// of its wait.
    sleepers: Vec<(u64, Waker)>,
    next_token: u64,
    /// Producers waiting for capacity (normally just the receive loop).
    space: Vec<Waker>,
}

impl<T> State<T> {
    /// Wakes one waiting worker, if any; returns its waker to wake once the
    /// lock is released.
    fn wake_one(&mut self) -> Option<Waker> {
        self.sleepers.pop().map(|(_, waker)| waker)
    }

    fn wake_all_workers(&mut self) -> Vec<Waker> {
        self.sleepers.drain(..).map(|(_, waker)| waker).collect()
    }

    fn recycle(&mut self, fifo: VecDeque<(T, usize)>) {
        if self.spare.len() < SPARE_FIFOS && fifo.capacity() <= SPARE_FIFO_CAPACITY {
            self.spare.push(fifo);
        }
    }
}

/// One item taken by a worker: run it, then call [`OwnerSet::finish`].
#[derive(Debug)]
pub(crate) struct Turn<T> {
    /// The owner (key hash).
    pub(crate) owner: u64,
    /// The item.
    pub(crate) item: T,
    pub(crate) bytes: usize,
}

/// Owner FIFOs plus the ready-owner set.
///
/// Waiting is notification-driven with plain wakers kept under the same lock
/// as the state they wait for, so a check and the registration of a waiter
/// are one step (no lost wake-up), and a wake happens only when someone
/// waits: an admission that makes an owner ready wakes one sleeping worker, a
/// finished turn wakes the receive loop only if it waits for capacity.
pub(crate) struct OwnerSet<T> {
    state: Mutex<State<T>>,
    limits: OwnerLimits,
}

impl<T> OwnerSet<T> {
    /// An empty set.
    pub(crate) fn new(limits: OwnerLimits) -> Self {
        OwnerSet {
            state: Mutex::new(State {
                owners: HashMap::default(),
                ready: VecDeque::new(),
                total: 0,
                closed: false,
                spare: Vec::new(),
                sleepers: Vec::new(),
                next_token: 0,
                space: Vec::new(),
            }),
            limits,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // No user code runs under this lock: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// JQ-10: checks, reservation, sequence, append and ready-set insert as
    /// one commit. On refusal the item comes back and nothing changed.
    // The receive loop uses it for requests; one-way records use the waiting
    // `admit`.
    pub(crate) fn try_admit(&self, owner: u64, item: T, bytes: usize) -> Result<u64, (Refusal, T)> {
        let mut state = self.lock();
        let (seq, worker) = self.admit_locked(&mut state, owner, item, bytes)?;
        drop(state);
        if let Some(worker) = worker {
            worker.wake();
        }
        Ok(seq)
    }

    /// [`try_admit`](Self::try_admit) under the lock; also returns the worker
    /// to wake once the lock is released.
    fn admit_locked(
        &self,
        state: &mut State<T>,
        owner: u64,
        item: T,
        bytes: usize,
    ) -> Result<(u64, Option<Waker>), (Refusal, T)> {
        if state.closed {
            return Err((Refusal::Closed, item));
        }
        if state.total >= self.limits.max_total {
            return Err((Refusal::Total, item));
        }
        let limits = self.limits;
        let (seq, became_ready) = {
            let o = match state.owners.entry(owner) {
                Entry::Occupied(e) => {
                    let o = e.into_mut();
                    if o.count >= limits.max_count {
                        return Err((Refusal::OwnerCount, item));
                    }
                    // An empty owner always takes one item, so an item larger
                    // than the byte limit is not refused forever.
                    if o.count > 0 && o.bytes + bytes > limits.max_bytes {
                        return Err((Refusal::OwnerBytes, item));
                    }
                    o
                }
                // A new owner is empty and always takes one item (limits are
                // at least 1), so no owner is ever created for a refusal.
                Entry::Vacant(e) => e.insert(Owner {
                    fifo: state.spare.pop().unwrap_or_default(),
                    count: 0,
                    bytes: 0,
                    next_seq: 0,
                    running: false,
                }),
            };
            let seq = o.next_seq;
            o.next_seq += 1;
            o.count += 1;
            o.bytes += bytes;
            let became_ready = o.fifo.is_empty() && !o.running;
            o.fifo.push_back((item, bytes));
            (seq, became_ready)
        };
        state.total += 1;
        if !became_ready {
            return Ok((seq, None));
        }
        state.ready.push_back(owner);
        Ok((seq, state.wake_one()))
    }

    /// Admits `item`, waiting while a limit refuses it. For the receive loop,
    /// which already holds the item (JQ-22: an accepted record is never
    /// capacity-rejected). Returns the item back only if the set closed.
    pub(crate) async fn admit(&self, owner: u64, item: T, bytes: usize) -> Result<u64, T> {
        let mut item = Some(item);
        poll_fn(|cx| {
            let Some(it) = item.take() else {
                unreachable!("polled after completion")
            };
            let mut state = self.lock();
            match self.admit_locked(&mut state, owner, it, bytes) {
                Ok((seq, worker)) => {
                    drop(state);
                    if let Some(worker) = worker {
                        worker.wake();
                    }
                    Poll::Ready(Ok(seq))
                }
                Err((Refusal::Closed, back)) => Poll::Ready(Err(back)),
                Err((_, back)) => {
                    // Checked and registered under one lock: the turn that
                    // makes room wakes us.
                    register_space(&mut state.space, cx);
                    item = Some(back);
                    Poll::Pending
                }
            }
        })
        .await
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

    /// One turn, through a fresh [`waiter`](Self::waiter).
    #[cfg(test)]
    pub(crate) async fn next_turn(&self) -> Option<Turn<T>> {
        let mut wait = self.waiter();
        poll_fn(|cx| wait.poll(cx)).await
    }

    /// A worker's wait for turns. Polled, it yields the head item of the
    /// oldest ready owner, which stays out of the ready set until
    /// [`finish`](Self::finish); `None` once the set is closed and fully
    /// drained. Reusable from one turn to the next.
    pub(crate) fn waiter(&self) -> Sleep<'_, T> {
        Sleep {
            set: self,
            token: None,
        }
    }

    /// Ends a turn: releases its reservation and puts the owner back into the
    /// ready set if it has more work.
    pub(crate) fn finish(&self, owner: u64, bytes: usize) {
        let mut guard = self.lock();
        let state = &mut *guard;
        state.total -= 1;
        let o = state.owners.get_mut(&owner).expect("running owner exists");
        o.running = false;
        o.count -= 1;
        o.bytes -= bytes;
        let mut worker = None;
        if !o.fifo.is_empty() {
            state.ready.push_back(owner);
            worker = state.wake_one();
        } else if o.count == 0 {
            let o = state.owners.remove(&owner).expect("running owner exists");
            state.recycle(o.fifo);
        }
        let mut workers = Vec::new();
        if state.closed && state.total == 0 {
            workers = state.wake_all_workers();
        }
        // Normally the receive loop alone; the buffer stays for its next wait.
        let producer = state.space.pop();
        let producers = if state.space.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut state.space)
        };
        drop(guard);
        if let Some(worker) = worker {
            worker.wake();
        }
        if let Some(producer) = producer {
            producer.wake();
        }
        workers.into_iter().chain(producers).for_each(Waker::wake);
    }

    /// Stops admissions; workers drain what is queued and then see `None`.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let workers = state.wake_all_workers();
        let space = std::mem::take(&mut state.space);
        drop(state);
        workers.into_iter().chain(space).for_each(Waker::wake);
    }

    /// `(count, bytes, next_seq)` of one owner.
    #[cfg(test)]
    pub(crate) fn owner_stats(&self, owner: u64) -> Option<(usize, usize, u64)> {
        let state = self.lock();
        state
            .owners
            .get(&owner)
            .map(|o| (o.count, o.bytes, o.next_seq))
    }

    /// Items held by all owners.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.lock().total
    }
}

/// One worker waiting for a turn. Dropped while it waits (its task aborted),
/// it leaves the sleepers and hands a wake-up it may have received on to
/// another worker, so no ready owner is stranded.
pub(crate) struct Sleep<'a, T> {
    set: &'a OwnerSet<T>,
    /// Set while this wait is pending (it registered as a sleeper).
    token: Option<u64>,
}

impl<T> Sleep<'_, T> {
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Turn<T>>> {
        let mut guard = self.set.lock();
        let state = &mut *guard;
        // Level-triggered: whatever woke us (or not), re-check the set.
        if let Some(owner) = state.ready.pop_front() {
            let o = state.owners.get_mut(&owner).expect("ready owner exists");
            let (item, bytes) = o.fifo.pop_front().expect("ready owner has work");
            o.running = true;
            if let Some(token) = self.token.take() {
                // Polled without being woken: leave the sleepers.
                state.sleepers.retain(|(t, _)| *t != token);
            }
            // Hand the remaining work to another sleeping worker.
            let other = if state.ready.is_empty() {
                None
            } else {
                state.wake_one()
            };
            drop(guard);
            if let Some(other) = other {
                other.wake();
            }
            return Poll::Ready(Some(Turn { owner, item, bytes }));
        }
        if state.closed && state.total == 0 {
            if let Some(token) = self.token.take() {
                state.sleepers.retain(|(t, _)| *t != token);
            }
            return Poll::Ready(None);
        }
        match self.token {
            Some(token) => match state.sleepers.iter_mut().find(|(t, _)| *t == token) {
                Some((_, waker)) => {
                    if !waker.will_wake(cx.waker()) {
                        *waker = cx.waker().clone();
                    }
                }
                // Woken, but nothing is left: sleep again.
                None => state.sleepers.push((token, cx.waker().clone())),
            },
            None => {
                let token = state.next_token;
                state.next_token += 1;
                self.token = Some(token);
                state.sleepers.push((token, cx.waker().clone()));
            }
        }
        Poll::Pending
    }
}

impl<T> Drop for Sleep<'_, T> {
    fn drop(&mut self) {
        let Some(token) = self.token else {
            return;
        };
        let mut state = self.set.lock();
        let before = state.sleepers.len();
        state.sleepers.retain(|(t, _)| *t != token);
        // No longer listed: this wait was woken and will never re-check the
        // set, so another sleeper does.
        let other = if state.sleepers.len() == before && !state.ready.is_empty() {
            state.wake_one()
        } else {
            None
        };
        drop(state);
        if let Some(other) = other {
            other.wake();
        }
    }
}

/// Adds the current task to the capacity waiters unless it is there.
fn register_space(space: &mut Vec<Waker>, cx: &Context<'_>) {
    if !space.iter().any(|w| w.will_wake(cx.waker())) {
        space.push(cx.waker().clone());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn set(max_count: usize, max_bytes: usize, max_total: usize) -> OwnerSet<u32> {
        OwnerSet::new(OwnerLimits {
            max_count,
            max_bytes,
            max_total,
        })
    }

    /// JQ-10 / JQ-24 item 4: a refused admission changes no counter, no
    /// sequence and no queue, and says which structural limit refused it.
    #[test]
    fn refused_admission_leaves_owner_unchanged() {
        let owners = set(2, 100, 10);
        assert_eq!(owners.try_admit(7, 1, 40).unwrap(), 0);
        assert_eq!(owners.try_admit(7, 2, 40).unwrap(), 1);
        let before = owners.owner_stats(7).unwrap();
        assert_eq!(before, (2, 80, 2));

        let (why, back) = owners.try_admit(7, 3, 10).unwrap_err();
        assert_eq!((why, back), (Refusal::OwnerCount, 3));
        let err = crate::Error::from(why);
        assert!(
            matches!(err, crate::Error::StructuralLimit(_)) && !err.is_deadline(),
            "a structural limit, distinct from a deadline: {err:?}"
        );
        assert_eq!(owners.owner_stats(7).unwrap(), before);
        assert_eq!(owners.total(), 2);

        let bytes = set(10, 100, 10);
        bytes.try_admit(1, 1, 90).unwrap();
        let before = bytes.owner_stats(1).unwrap();
        let (why, _) = bytes.try_admit(1, 2, 20).unwrap_err();
        assert_eq!(why, Refusal::OwnerBytes);
        assert_eq!(bytes.owner_stats(1).unwrap(), before);

        let total = set(10, 100, 1);
        total.try_admit(1, 1, 1).unwrap();
        let (why, _) = total.try_admit(2, 2, 1).unwrap_err();
        assert_eq!(why, Refusal::Total);
        assert!(
            total.owner_stats(2).is_none(),
            "no owner created by a refusal"
        );
    }

    /// JQ-9: an owner is ready once, runs one item at a time, and comes back
    /// while it has work.
    #[tokio::test(start_paused = true)]
    async fn one_turn_per_owner_in_order() {
        let owners = set(10, 1000, 10);
        for i in 0..3 {
            owners.try_admit(1, i, 1).unwrap();
        }
        owners.try_admit(2, 100, 1).unwrap();
        let a = owners.next_turn().await.unwrap();
        let b = owners.next_turn().await.unwrap();
        assert_eq!((a.owner, a.item), (1, 0));
        assert_eq!((b.owner, b.item), (2, 100));
        // Owner 1 is running: nothing else is ready until it finishes (the
        // paused clock makes this wait instant and deterministic).
        let blocked = tokio::time::timeout(Duration::from_secs(1), owners.next_turn()).await;
        assert!(blocked.is_err(), "owner 1 must not run twice at once");
        owners.finish(a.owner, a.bytes);
        let c = owners.next_turn().await.unwrap();
        assert_eq!((c.owner, c.item), (1, 1));
        owners.finish(b.owner, b.bytes);
        assert!(
            owners.owner_stats(2).is_none(),
            "an idle empty owner is dropped"
        );
    }

    /// No lost wake-up: many waiting workers, admissions from another thread;
    /// every item is taken exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_lost_wakeup_under_stress() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        const ITEMS: u32 = 20_000;
        let owners = Arc::new(set(64, usize::MAX, 64));
        let taken = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let owners = Arc::clone(&owners);
                let taken = Arc::clone(&taken);
                tokio::spawn(async move {
                    while let Some(turn) = owners.next_turn().await {
                        taken.fetch_add(u64::from(turn.item), Ordering::Relaxed);
                        owners.finish(turn.owner, turn.bytes);
                    }
                })
            })
            .collect();
        for i in 0..ITEMS {
            assert!(owners.wait_capacity().await);
            owners.admit(u64::from(i % 97), i, 1).await.unwrap();
        }
        owners.close();
        for w in workers {
            tokio::time::timeout(Duration::from_secs(10), w)
                .await
                .expect("workers drain and stop: no lost wake-up")
                .unwrap();
        }
        let expected: u64 = (0..u64::from(ITEMS)).sum();
        assert_eq!(taken.load(Ordering::Relaxed), expected);
        assert_eq!(owners.total(), 0);
    }
}
