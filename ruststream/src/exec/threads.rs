//! `threads(n)`: `n` OS threads, each with its own current-thread Tokio
//! runtime, fed by a task on the app runtime through rings of 8 slots. The
//! feeder takes a delivery from the broker only when a ring has a free slot,
//! so read-ahead never exceeds `n × 9` (8 in the ring, 1 in hand). A thread
//! runs the whole delivery, decode to ack, on its own runtime; the handler
//! future may therefore be `!Send`. An idle thread waits for its ring as
//! [`ring_wait`](super::ring_wait) describes.
//!
//! With `by_key`, the feeder decodes (to compute the key) and routes every
//! key to one thread, so a key's deliveries run in arrival order; it waits
//! until every ring has a free slot before taking a delivery, keeping the
//! same bound.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Poll, Waker};

use tokio::sync::oneshot;

use super::budget::Budget;
use super::ring::{RING_SLOTS, Ring};
use super::ring_wait::RingWait;
use super::slot;
use super::snooze_backoff::SnoozeBackoff;
use crate::binding::{Broker, Delivery, Subscription};
use crate::host::Stop;
use crate::ingress::{JobPermit, JobQueue};
use crate::pipeline::{Checked, Early, Unit, invoke};
use crate::subscriber::Subscriber;
use crate::sync::{Mutex, MutexGuard};

type DeliveryOf<B> = <<B as Broker>::Subscription as Subscription>::Delivery;

/// What a thread is handed: a delivery with the job permit taken before its
/// receive. One type per mode, so a ring slot is only as large as
/// its mode needs (a plain delivery moves without a `memcpy` call).
trait Job<B: Broker, S: Subscriber>: Send + Sized + 'static {
    /// Whether the feeder waits until every ring has a free slot (by key:
    /// it learns the ring only after taking the delivery) or any one.
    const ALL_RINGS: bool;

    /// Makes the job and pushes it into its ring (`free` had a slot),
    /// returning the waker of a thread that waits for it; the delivery and
    /// its permit back when it stops before the handler (settled by the
    /// feeder).
    #[allow(clippy::type_complexity)]
    fn push(
        unit: &Unit<B, S>,
        rings: &[Ring<Self>],
        delivery: DeliveryOf<B>,
        permit: JobPermit,
        free: usize,
    ) -> Result<Option<Waker>, (DeliveryOf<B>, Early, JobPermit)>;

    /// After a push, takes the deliveries at hand now for the room left in
    /// the rings and pushes them too; how many (see [`spread_at_hand`]).
    /// None by default, as by key: there the feeder decodes each delivery
    /// to find its ring, and takes one only when every ring has room.
    fn push_at_hand(
        _rings: &[Ring<Self>],
        _subscription: &mut B::Subscription,
        _jobs: &Arc<JobQueue>,
        _at_hand: &mut AtHand<DeliveryOf<B>>,
        _cursor: &mut usize,
        _wakes: &mut Wakes,
    ) -> u32 {
        0
    }

    /// The delivery, its body and its permit, decoding here (on the
    /// thread) what the feeder did not; the delivery and its permit back
    /// when it stops before the handler.
    #[allow(clippy::type_complexity)]
    fn open(
        self,
        unit: &Unit<B, S>,
    ) -> Result<(DeliveryOf<B>, S::Body, JobPermit), (DeliveryOf<B>, Early, JobPermit)>;
}

/// A raw delivery, decoded by its thread, into the next ring with room.
struct Raw<D>(D, JobPermit);

impl<B: Broker, S: Subscriber> Job<B, S> for Raw<DeliveryOf<B>> {
    const ALL_RINGS: bool = false;

    #[inline]
    fn push(
        _: &Unit<B, S>,
        rings: &[Ring<Self>],
        delivery: DeliveryOf<B>,
        permit: JobPermit,
        free: usize,
    ) -> Result<Option<Waker>, (DeliveryOf<B>, Early, JobPermit)> {
        Ok(rings[free].push(Raw(delivery, permit)))
    }

    fn push_at_hand(
        rings: &[Ring<Self>],
        subscription: &mut B::Subscription,
        jobs: &Arc<JobQueue>,
        at_hand: &mut AtHand<DeliveryOf<B>>,
        cursor: &mut usize,
        wakes: &mut Wakes,
    ) -> u32 {
        spread_at_hand(rings, subscription, jobs, at_hand, cursor, wakes, Raw)
    }

    #[inline]
    fn open(
        self,
        unit: &Unit<B, S>,
    ) -> Result<(DeliveryOf<B>, S::Body, JobPermit), (DeliveryOf<B>, Early, JobPermit)> {
        let Raw(delivery, permit) = self;
        match unit.check(&delivery) {
            Checked::Body(body) => Ok((delivery, body, permit)),
            Checked::Early(early) => Err((delivery, early, permit)),
        }
    }
}

/// A delivery the feeder decoded to route its key to one thread.
struct Decoded<D, Body>(D, Body, JobPermit);

impl<B: Broker, S: Subscriber> Job<B, S> for Decoded<DeliveryOf<B>, S::Body> {
    const ALL_RINGS: bool = true;

    fn push(
        unit: &Unit<B, S>,
        rings: &[Ring<Self>],
        delivery: DeliveryOf<B>,
        permit: JobPermit,
        _: usize,
    ) -> Result<Option<Waker>, (DeliveryOf<B>, Early, JobPermit)> {
        match unit.check(&delivery) {
            Checked::Body(body) => {
                let key = unit.subscriber.key(&body, delivery.envelope());
                let ring = &rings[slot(key, rings.len())];
                Ok(ring.push(Decoded(delivery, body, permit)))
            }
            Checked::Early(early) => Err((delivery, early, permit)),
        }
    }

    #[inline]
    fn open(
        self,
        _: &Unit<B, S>,
    ) -> Result<(DeliveryOf<B>, S::Body, JobPermit), (DeliveryOf<B>, Early, JobPermit)> {
        Ok((self.0, self.1, self.2))
    }
}

/// How many times a feeder whose rings are all full gives its CPU away
/// before it waits (see [`Rings::snooze_for_space`]): 1–3 measured best on
/// 2 cores with `threads(4)`, more kept the threads from the CPU.
const FEEDER_SNOOZES: usize = 3;

pub(crate) struct Rings<T> {
    pub(crate) rings: Vec<Ring<T>>,
    /// The feeder, while it waits for a free slot. Threads wake it only
    /// when their ring goes from full to not full.
    feeder: Mutex<Option<Waker>>,
}

impl<T> Rings<T> {
    /// `n` empty rings.
    pub(crate) fn new(n: usize) -> Self {
        Rings {
            rings: (0..n).map(|_| Ring::new()).collect(),
            feeder: Mutex::new(None),
        }
    }

    fn feeder(&self) -> MutexGuard<'_, Option<Waker>> {
        self.feeder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A ring with a free slot now (round robin from `cursor`), or — with
    /// `all` — whether every ring has one.
    pub(crate) fn find_space(&self, all: bool, cursor: &mut usize) -> Option<usize> {
        if all {
            return self.rings.iter().all(Ring::has_space).then_some(0);
        }
        // Round robin without a division per step: `cursor < n` always.
        let n = self.rings.len();
        let wrap = |i: usize| if i >= n { i - n } else { i };
        let i = (0..n)
            .map(|k| wrap(*cursor + k))
            .find(|&i| self.rings[i].has_space())?;
        *cursor = wrap(i + 1);
        Some(i)
    }

    /// [`find_space`](Self::find_space), giving the CPU away up to
    /// [`FEEDER_SNOOZES`] times for a thread to free a slot.
    ///
    /// This blocks the feeder's runtime thread for a few `sched_yield`
    /// calls: the threads it waits for are often runnable on that very CPU,
    /// and handing it to them directly beats a wake-up through Tokio's
    /// driver (a futex or eventfd call each way) per ring of 8. The threads
    /// owed a wake-up must have it first. `backoff` says when it does not
    /// pay.
    fn snooze_for_space(
        &self,
        all: bool,
        cursor: &mut usize,
        backoff: &mut SnoozeBackoff,
    ) -> Option<usize> {
        backoff.snooze(FEEDER_SNOOZES, || self.find_space(all, cursor))
    }

    /// Waits for [`find_space`](Self::find_space).
    pub(crate) async fn wait_space(&self, all: bool, cursor: &mut usize) -> usize {
        poll_fn(|cx| {
            if let Some(i) = self.find_space(all, cursor) {
                return Poll::Ready(i);
            }
            // Register, then look again: a ring that lost its full state in
            // between is seen now, one that loses it later wakes us (its
            // thread takes this lock after its pop).
            *self.feeder() = Some(cx.waker().clone());
            match self.find_space(all, cursor) {
                Some(i) => {
                    *self.feeder() = None;
                    Poll::Ready(i)
                }
                None => Poll::Pending,
            }
        })
        .await
    }

    /// A ring went from full to not full.
    pub(crate) fn freed(&self) {
        let feeder = self.feeder().take();
        if let Some(feeder) = feeder {
            feeder.wake();
        }
    }
}

pub(crate) async fn run<B: Broker, S: Subscriber>(
    unit: Arc<Unit<B, S>>,
    subscription: B::Subscription,
    stop: Stop,
    n: usize,
    by_key: bool,
) {
    if by_key {
        run_jobs::<B, S, Decoded<_, _>>(unit, subscription, stop, n).await;
    } else {
        run_jobs::<B, S, Raw<_>>(unit, subscription, stop, n).await;
    }
}

async fn run_jobs<B: Broker, S: Subscriber, J: Job<B, S>>(
    unit: Arc<Unit<B, S>>,
    mut subscription: B::Subscription,
    stop: Stop,
    n: usize,
) {
    let by_key = J::ALL_RINGS;
    let rings: Arc<Rings<J>> = Arc::new(Rings::new(n));
    let mut finished = Vec::with_capacity(n);
    for index in 0..n {
        let (done, finished_rx) = oneshot::channel::<()>();
        finished.push(finished_rx);
        let thread_unit = Arc::clone(&unit);
        let rings = Arc::clone(&rings);
        let name = format!("ruststream-thread-{index}");
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => {
                    runtime.block_on(thread_loop::<B, S, J>(&thread_unit, &rings, index))
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot start a dedicated thread's runtime")
                }
            }
            // Dropping `done` (also on a panic) tells the app this thread ended.
            drop(done);
        });
        if let Err(err) = spawned {
            tracing::error!(subject = %unit.config.subject, error = %err, "cannot spawn a dedicated thread");
        }
    }

    let jobs = Arc::clone(unit.app.jobs());
    let closer = CloseOnDrop(&rings.rings);
    // Threads that wait for the items pushed since the feeder last waited:
    // woken together right before the feeder waits (or ends), one wake-up
    // per batch rather than per delivery.
    let mut wakes = Wakes(Vec::with_capacity(n));
    let mut cursor = 0;
    // One stop waiter for the whole loop: registered once, not per wait.
    let mut stopped = pin!(stop.wait());
    let mut budget = Budget::new();
    let mut at_hand = AtHand::new();
    let mut backoff = SnoozeBackoff::new();
    loop {
        let target = match rings.find_space(by_key, &mut cursor) {
            Some(target) => target,
            None => {
                wakes.flush();
                match rings.snooze_for_space(by_key, &mut cursor, &mut backoff) {
                    Some(target) => target,
                    None => tokio::select! {
                        biased;
                        target = rings.wait_space(by_key, &mut cursor) => target,
                        () = &mut stopped => break,
                    },
                }
            }
        };
        // Permit before receive (JQ-4); it travels with the delivery. The
        // threads owed a wake-up get it before the feeder waits or yields.
        let Some((delivery, permit)) = super::receive!(
            &mut subscription,
            jobs,
            jobs.try_acquire(),
            jobs.acquire(),
            &stop,
            stopped.as_mut(),
            &mut budget,
            wakes.flush(),
        ) else {
            break;
        };
        match J::push(&unit, &rings.rings, delivery, permit, target) {
            Ok(Some(waker)) => wakes.0.push(waker),
            Ok(None) => {}
            Err((delivery, early, permit)) => {
                wakes.flush();
                Box::pin(unit.settle_early(delivery, early)).await;
                drop(permit);
                continue;
            }
        }
        if stop.is_stopped() {
            continue;
        }
        let more = J::push_at_hand(
            &rings.rings,
            &mut subscription,
            &jobs,
            &mut at_hand,
            &mut cursor,
            &mut wakes,
        );
        // Yield before the next take when these spent the budget, or took
        // the last free permit (as `receive!` does).
        if budget.spend_many(more) || jobs.saturated() {
            budget.end_batch();
        }
    }
    drop(wakes);
    // Threads drain their rings (deliveries in hand are processed and
    // settled), then end.
    drop(closer);
    for thread in finished {
        let _ = thread.await;
    }
}

/// Reused buffers of [`spread_at_hand`].
struct AtHand<D> {
    permits: Vec<JobPermit>,
    claimed: Vec<D>,
}

impl<D> AtHand<D> {
    fn new() -> Self {
        AtHand {
            permits: Vec::new(),
            claimed: Vec::new(),
        }
    }
}

/// Takes as many deliveries as the subscription has at hand now and the
/// rings have room for, each with a job permit taken before it is claimed
/// (JQ-4), and never waits; returns how many. A backlog thus fills the
/// rings with one claim (one lock of the memory Core's queue) and one lock
/// per ring, rather than both per delivery.
///
/// They are shared out round robin from `cursor`, each ring with room an
/// equal part as far as its room goes, so deliveries at hand spread over
/// the threads as single ones do: a thread never idles while another's
/// ring holds the work.
fn spread_at_hand<Sub: Subscription, T>(
    rings: &[Ring<T>],
    subscription: &mut Sub,
    jobs: &Arc<JobQueue>,
    at_hand: &mut AtHand<Sub::Delivery>,
    cursor: &mut usize,
    wakes: &mut Wakes,
    job: impl Fn(Sub::Delivery, JobPermit) -> T,
) -> u32 {
    let room: usize = rings.iter().map(Ring::room).sum();
    // One delivery first: with nothing at hand (a trickle, not a backlog)
    // one permit goes back, not a permit for every free slot.
    let Some(first) = (room > 0).then(|| jobs.try_acquire()).flatten() else {
        return 0;
    };
    let Some(delivery) = subscription.try_next() else {
        return 0;
    };
    let AtHand { permits, claimed } = at_hand;
    claimed.push(delivery);
    permits.push(first);
    permits.extend(std::iter::from_fn(|| jobs.try_acquire()).take(room - 1));
    let taken = 1 + subscription.try_next_batch(permits.len() - 1, claimed);
    // Dropping what is left of `permits` returns the ones not needed.
    let mut jobs = claimed
        .drain(..)
        .zip(permits.drain(..))
        .map(|(delivery, permit)| job(delivery, permit));
    let n = rings.len();
    let wrap = |i: usize| if i >= n { i - n } else { i };
    let mut left = taken;
    // Room only grows behind the feeder's back, so the rings that had it
    // take everything; a ring that holds less than its share leaves the
    // rest to the next pass.
    while left > 0 {
        let with_room = rings.iter().filter(|ring| ring.has_space()).count();
        if with_room == 0 {
            debug_assert!(false, "the rings had room for all");
            break;
        }
        let share = left.div_ceil(with_room);
        for k in 0..n {
            let at = wrap(*cursor + k);
            let put = rings[at].room().min(share).min(left);
            if put == 0 {
                continue;
            }
            if let Some(waker) = rings[at].push_all(jobs.by_ref().take(put)) {
                wakes.0.push(waker);
            }
            left -= put;
            *cursor = wrap(at + 1);
            if left == 0 {
                break;
            }
        }
    }
    u32::try_from(taken).unwrap_or(u32::MAX)
}

async fn thread_loop<B: Broker, S: Subscriber, J: Job<B, S>>(
    unit: &Unit<B, S>,
    rings: &Rings<J>,
    index: usize,
) {
    let ring = &rings.rings[index];
    let mut wait = RingWait::new();
    let mut taken = VecDeque::with_capacity(RING_SLOTS);
    // A traced `!Send` handler has no stack to take its span: its own path.
    let traced_local = unit.traced && unit.service.is_none();
    while wait.take_all(ring, &mut taken).await {
        while let Some(job) = taken.pop_front() {
            ring.start(|| rings.freed());
            // JQ-4 step 5: the permit returns right before the handler (or after
            // a malformed record's bounded processing). Each delivery runs inside
            // this loop's own future (`invoke!`), never in a future moved into it.
            match job.open(unit) {
                Ok((delivery, body, permit)) => {
                    drop(permit);
                    if traced_local {
                        Box::pin(unit.traced_local(delivery, body)).await;
                    } else {
                        invoke!(unit, delivery, handle(body));
                    }
                }
                Err((delivery, early, permit)) => {
                    Box::pin(unit.settle_early(delivery, early)).await;
                    drop(permit);
                }
            }
        }
    }
}

/// Wakers of threads with new items, woken by [`flush`](Self::flush) or
/// when the feeder ends however it ends.
struct Wakes(Vec<Waker>);

impl Wakes {
    fn flush(&mut self) {
        for waker in self.0.drain(..) {
            waker.wake();
        }
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Closes the rings however the feeder ends (also when it is aborted), so the
/// threads drain them and end.
struct CloseOnDrop<'a, T>(&'a [Ring<T>]);

impl<T> Drop for CloseOnDrop<'_, T> {
    fn drop(&mut self) {
        for ring in self.0 {
            ring.close();
        }
    }
}
