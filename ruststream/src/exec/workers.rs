//! `workers(n)`: the loop hands each delivery to one of `n` worker
//! tasks, each with a mailbox of one. The loop first waits for an idle worker
//! and only then takes a delivery from the broker, so at most `n` deliveries
//! are in flight and none waits in the framework.
//!
//! The mailboxes and the idle stack share one small lock; the wake-ups are
//! plain wakers kept under it, so a hand-off costs one lock and at most one
//! wake in each direction, and the loop is woken only when it waits for an
//! idle worker.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::budget::Budget;
use crate::binding::Broker;
use crate::host::Stop;
use crate::pipeline::{Checked, Unit, invoke};
use crate::subscriber::SendSubscriber;
use crate::sync::{Mutex, MutexGuard};

pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Arc<Unit<B, S>>,
    mut subscription: B::Subscription,
    stop: Stop,
    n: usize,
) {
    let jobs = Arc::clone(unit.app.jobs());
    let pool = Arc::new(Pool::new(n));
    // Closes the mailboxes however the loop ends (also when it is aborted):
    // workers finish the delivery in hand, see the close and stop.
    let closer = CloseOnDrop(Arc::clone(&pool));
    let mut workers = Vec::with_capacity(n);
    for id in 0..n {
        let unit = Arc::clone(&unit);
        let pool = Arc::clone(&pool);
        workers.push(tokio::spawn(async move {
            let _alive = Alive(&pool);
            while let Some((delivery, permit)) = pool.recv(id).await {
                match unit.check(&delivery) {
                    Checked::Body(body) => {
                        // JQ-4 step 5: the permit returns right before the handler.
                        drop(permit);
                        invoke!(&*unit, delivery, handle_send(body));
                    }
                    Checked::Early(early) => {
                        Box::pin(unit.settle_early(delivery, early)).await;
                        drop(permit);
                    }
                }
            }
        }));
    }

    // One stop waiter for the whole loop: registered once, not per wait.
    let mut stopped = pin!(stop.wait());
    let mut budget = Budget::new();
    // An idle worker reserved by the last hand-off, if one was idle then.
    let mut reserved = None;
    loop {
        // No race with `stop` here: a worker always ends its delivery, and the
        // loop then sees the stop before it takes another one (`receive!`),
        // so the loop ends exactly when it would have (after its workers).
        let id = match reserved.take() {
            Some(id) => id,
            None => match pool.idle().await {
                Some(id) => id,
                None => break,
            },
        };
        // Permit before receive (JQ-4); it travels with the delivery.
        let Some((delivery, permit)) = super::receive!(
            &mut subscription,
            jobs,
            jobs.try_acquire(),
            jobs.acquire(),
            &stop,
            stopped.as_mut(),
            &mut budget,
        ) else {
            break;
        };
        reserved = pool.hand(id, (delivery, permit));
    }
    drop(closer);
    for worker in workers {
        if let Err(err) = worker.await {
            tracing::error!(subject = %unit.config.subject, error = %err, "worker ended abnormally");
        }
    }
}

/// The workers' mailboxes and the idle stack.
pub(crate) struct Pool<D> {
    state: Mutex<PoolState<D>>,
}

struct PoolState<D> {
    /// Workers waiting on an empty mailbox, each listed once.
    idle: Vec<usize>,
    mailboxes: Vec<Mailbox<D>>,
    /// The loop, while it waits for an idle worker.
    loop_waker: Option<Waker>,
    /// Workers whose task still runs.
    alive: usize,
    closed: bool,
}

struct Mailbox<D> {
    item: Option<D>,
    /// The worker, while it waits on this mailbox.
    waker: Option<Waker>,
    /// True while the worker's id is on the idle stack.
    listed: bool,
    /// True from its reservation by the loop until its delivery arrives: a
    /// reserved worker polled meanwhile must not list itself again.
    reserved: bool,
}

impl<D> Pool<D> {
    pub(crate) fn new(n: usize) -> Self {
        Pool {
            state: Mutex::new(PoolState {
                idle: Vec::with_capacity(n),
                mailboxes: (0..n)
                    .map(|_| Mailbox {
                        item: None,
                        waker: None,
                        listed: false,
                        reserved: false,
                    })
                    .collect(),
                loop_waker: None,
                alive: n,
                closed: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState<D>> {
        // No user code runs under this lock: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle worker, now reserved for the next delivery; `Err(true)` when
    /// none is idle yet, `Err(false)` when none will ever be (all ended).
    fn pop_idle(state: &mut PoolState<D>) -> Result<usize, bool> {
        match state.idle.pop() {
            Some(id) => {
                let mailbox = &mut state.mailboxes[id];
                mailbox.listed = false;
                mailbox.reserved = true;
                Ok(id)
            }
            None => Err(state.alive > 0),
        }
    }

    /// Waits for an idle worker; `None` once every worker has ended.
    pub(crate) fn idle(&self) -> impl Future<Output = Option<usize>> + '_ {
        poll_fn(|cx| {
            let mut state = self.lock();
            match Self::pop_idle(&mut state) {
                Ok(id) => {
                    state.loop_waker = None;
                    Poll::Ready(Some(id))
                }
                Err(false) => Poll::Ready(None),
                Err(true) => {
                    register(&mut state.loop_waker, cx);
                    Poll::Pending
                }
            }
        })
    }

    /// Puts a delivery into the mailbox of a worker reserved by
    /// [`idle`](Self::idle), and wakes it. Under the same lock, reserves the
    /// next idle worker if there is one, for the next delivery: the loop
    /// then needs no lock of its own to find it. (A reserved worker waits
    /// like any other; closing the mailboxes ends it.)
    pub(crate) fn hand(&self, id: usize, delivery: D) -> Option<usize> {
        let mut state = self.lock();
        let next = Self::pop_idle(&mut state).ok();
        let mailbox = &mut state.mailboxes[id];
        debug_assert!(mailbox.item.is_none(), "an idle worker's mailbox is empty");
        mailbox.item = Some(delivery);
        mailbox.reserved = false;
        // Woken by reference and left in place: the worker's next wait
        // finds its own waker there and stores no clone. (Under the lock:
        // a tokio waker only schedules the task, it never runs it here.)
        if let Some(waker) = &mailbox.waker {
            waker.wake_by_ref();
        }
        next
    }

    /// The next delivery of worker `id`: announces the worker idle (waking
    /// the loop if it waits for one) and waits for its mailbox. `None` once
    /// the mailboxes are closed and this one is empty.
    // A plain `poll_fn` rather than an `async fn` around one: one future
    // layer less to resume for every delivery.
    pub(crate) fn recv(&self, id: usize) -> impl Future<Output = Option<D>> + '_ {
        poll_fn(move |cx| self.poll_recv(id, cx))
    }

    fn poll_recv(&self, id: usize, cx: &mut Context<'_>) -> Poll<Option<D>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let mailbox = &mut state.mailboxes[id];
        if let Some(item) = mailbox.item.take() {
            return Poll::Ready(Some(item));
        }
        if state.closed {
            return Poll::Ready(None);
        }
        register(&mut mailbox.waker, cx);
        if mailbox.listed || mailbox.reserved {
            return Poll::Pending;
        }
        mailbox.listed = true;
        state.idle.push(id);
        let waiting_loop = state.loop_waker.take();
        drop(guard);
        if let Some(waker) = waiting_loop {
            waker.wake();
        }
        Poll::Pending
    }

    /// No more deliveries: wakes every waiting worker so it can stop.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let wakers: Vec<Waker> = state
            .mailboxes
            .iter_mut()
            .filter_map(|m| m.waker.take())
            .collect();
        drop(state);
        for waker in wakers {
            waker.wake();
        }
    }
}

/// Stores the current task's waker in `slot` unless it is already there.
#[inline]
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(waker) if waker.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

struct CloseOnDrop<D>(Arc<Pool<D>>);

impl<D> Drop for CloseOnDrop<D> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Held by a worker task: when it ends (also by a panic), the loop stops
/// waiting for it.
pub(crate) struct Alive<'a, D>(pub(crate) &'a Pool<D>);

impl<D> Drop for Alive<'_, D> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.alive -= 1;
        let waker = state.loop_waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::task::{Context, Poll, Waker};

    use super::Pool;

    #[test]
    fn a_reserved_worker_polled_again_is_not_listed_twice() {
        let pool = Pool::<u32>::new(1);
        let mut cx = Context::from_waker(Waker::noop());
        // The worker waits: it is listed idle once.
        assert!(pool.poll_recv(0, &mut cx).is_pending());
        let id = Pool::pop_idle(&mut pool.lock()).expect("the worker is idle");
        // Polled again (a spurious wake) while reserved: not listed again,
        // so no second delivery can be handed to its mailbox of one.
        assert!(pool.poll_recv(0, &mut cx).is_pending());
        assert_eq!(Pool::pop_idle(&mut pool.lock()), Err(true), "listed once");
        assert_eq!(pool.hand(id, 7), None, "no other worker is idle");
        assert_eq!(pool.poll_recv(0, &mut cx), Poll::Ready(Some(7)));
        // Back to waiting: listed, and reserved by the next hand-off.
        assert!(pool.poll_recv(0, &mut cx).is_pending());
        assert_eq!(Pool::pop_idle(&mut pool.lock()), Ok(0));
    }
}
