//! `threads(n)`: `n` OS threads, each with its own current-thread Tokio
//! runtime. A thread runs the whole delivery, decode to ack, on its own
//! runtime; the handler future may therefore be `!Send`.
//!
//! A thread takes its next deliveries itself once its hands are empty: it
//! claims what the subscription has at hand, up to the 8 slots of its ring
//! (one while another thread is idle, which the feeder serves), in place
//! under the subscription's lock, each with a job permit taken first
//! (JQ-4) — on a backlog, no hand-off and no wake-up between threads.
//! Waiting is the feeder's part, a task on the app runtime: when a thread
//! finds nothing to claim it turns idle, and the feeder waits with the
//! subscription as every loop waits (ready, then a permit, then the claim),
//! fills the idle threads' rings and wakes them. So a thread holds at most 8
//! deliveries it has not started (read-ahead never exceeds `n × 9` with the
//! ones in hand), only the app runtime ever waits on the subscription (a
//! claim runs in its context), and the subscriber stands in the job queue's
//! permit line once. An idle thread waits for its ring as
//! [`ring_wait`](super::ring_wait) describes.
//!
//! With `by_key`, the feeder alone takes deliveries: it decodes (to compute
//! the key) and routes every key to one thread, so a key's deliveries run in
//! arrival order; it waits until every ring has a free slot before taking a
//! delivery, keeping the same bound.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::budget::Budget;
use super::feed::{AtHand, Feed, Wakes, spread_at_hand};
use super::ring::{RING_SLOTS, Ring};
use super::ring_wait::RingWait;
use super::rings::{Fill, Rings};
use super::shared_subscription::Shared;
use super::slot;
use super::snooze_backoff::SnoozeBackoff;
use crate::binding::{Broker, Delivery, Subscription};
use crate::host::Stop;
use crate::ingress::{JobPermit, JobQueue, Permits};
use crate::pipeline::{Checked, Early, Unit, invoke};
use crate::subscriber::Subscriber;

type DeliveryOf<B> = <<B as Broker>::Subscription as Subscription>::Delivery;

/// What a thread is handed: a delivery with the job permit taken before its
/// receive. One type per mode, so a ring slot is only as large as
/// its mode needs (a plain delivery moves without a `memcpy` call).
trait Job<B: Broker, S: Subscriber>: Send + Sized + 'static {
    /// Which rings the feeder fills: an idle thread's (threads claim in
    /// place), or any once all have room (by key).
    const FILL: Fill;

    /// Pushes the job made of the delivery the feeder took (when
    /// [`Rings::find_space`] found `target`); without `by_key`, with it the
    /// deliveries at hand now for every idle thread, `more` permitting (see
    /// [`spread_at_hand`]). Returns how many it took beyond the first; the
    /// delivery and its permit back when it stops before the handler
    /// (settled by the feeder).
    #[allow(clippy::type_complexity)]
    fn push(
        unit: &Unit<B, S>,
        feed: Feed<'_, B::Subscription, Self>,
        delivery: DeliveryOf<B>,
        permit: JobPermit,
        target: usize,
        more: bool,
    ) -> Result<u32, (DeliveryOf<B>, Early, JobPermit)>;

    /// A thread with empty hands and an empty ring claims up to `max` of
    /// the deliveries at hand itself, as far as its ring's room goes, into
    /// `taken`; how many. None by default, as by key: keys keep their order
    /// only through the feeder.
    fn claim_in_place<'j>(
        _ring: &Ring<Self>,
        _max: usize,
        _shared: &Shared<B::Subscription>,
        _jobs: &'j JobQueue,
        _held: &mut Permits<'j>,
        _claimed: &mut Vec<DeliveryOf<B>>,
        _taken: &mut VecDeque<Self>,
    ) -> usize {
        0
    }

    /// The delivery, its body and its permit, decoding here (on the
    /// thread) what the feeder did not; the delivery and its permit back
    /// when it stops before the handler.
    #[allow(clippy::type_complexity)]
    fn open(
        self,
        unit: &Unit<B, S>,
    ) -> Result<(DeliveryOf<B>, S::Body, Permit), (DeliveryOf<B>, Early, Permit)>;
}

/// A job's permit: `None` for one its thread claimed in place, whose permit
/// is one of the count the thread holds for its claims (taken and given
/// back in bulk, with no reference count per permit).
type Permit = Option<JobPermit>;

/// A raw delivery, decoded by its thread.
struct Raw<D>(D, Permit);

impl<B: Broker, S: Subscriber> Job<B, S> for Raw<DeliveryOf<B>> {
    const FILL: Fill = Fill::Idle;

    fn push(
        _: &Unit<B, S>,
        feed: Feed<'_, B::Subscription, Self>,
        delivery: DeliveryOf<B>,
        permit: JobPermit,
        target: usize,
        more: bool,
    ) -> Result<u32, (DeliveryOf<B>, Early, JobPermit)> {
        let job = |delivery, permit| Raw(delivery, Some(permit));
        Ok(spread_at_hand(
            feed,
            job(delivery, permit),
            target,
            more,
            job,
        ))
    }

    fn claim_in_place<'j>(
        ring: &Ring<Self>,
        max: usize,
        shared: &Shared<B::Subscription>,
        jobs: &'j JobQueue,
        held: &mut Permits<'j>,
        claimed: &mut Vec<DeliveryOf<B>>,
        taken: &mut VecDeque<Self>,
    ) -> usize {
        let room = ring.room().min(max);
        // One permit first: with nothing at hand one goes back, not eight.
        let mut permits = jobs.try_acquire_up_to(room.min(1));
        if permits.is_empty() {
            return 0;
        }
        let claim = |subscription: &mut B::Subscription| {
            let Some(delivery) = subscription.try_next() else {
                return 0;
            };
            claimed.push(delivery);
            permits.merge(jobs.try_acquire_up_to(room - 1));
            1 + subscription.try_next_batch(permits.len() - 1, claimed)
        };
        // Not at hand (the feeder waits with it) or closed: nothing.
        let got = shared.with(claim).unwrap_or(0);
        // The ones not needed go back; the rest are the thread's to hold.
        permits.truncate(got);
        held.merge(permits);
        ring.claimed(got);
        taken.extend(claimed.drain(..).map(|delivery| Raw(delivery, None)));
        got
    }

    #[inline]
    fn open(
        self,
        unit: &Unit<B, S>,
    ) -> Result<(DeliveryOf<B>, S::Body, Permit), (DeliveryOf<B>, Early, Permit)> {
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
    const FILL: Fill = Fill::AllHaveRoom;

    fn push(
        unit: &Unit<B, S>,
        feed: Feed<'_, B::Subscription, Self>,
        delivery: DeliveryOf<B>,
        permit: JobPermit,
        _: usize,
        _: bool,
    ) -> Result<u32, (DeliveryOf<B>, Early, JobPermit)> {
        match unit.check(&delivery) {
            Checked::Body(body) => {
                let key = unit.subscriber.key(&body, delivery.envelope());
                let ring = &feed.rings[slot(key, feed.rings.len())];
                if let Some(waker) = ring.push(Decoded(delivery, body, permit)) {
                    feed.wakes.0.push(waker);
                }
                Ok(0)
            }
            Checked::Early(early) => Err((delivery, early, permit)),
        }
    }

    #[inline]
    fn open(
        self,
        _: &Unit<B, S>,
    ) -> Result<(DeliveryOf<B>, S::Body, Permit), (DeliveryOf<B>, Early, Permit)> {
        Ok((self.0, self.1, Some(self.2)))
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
    subscription: B::Subscription,
    stop: Stop,
    n: usize,
) {
    let fill = J::FILL;
    let rings: Arc<Rings<J>> = Arc::new(Rings::new(n, fill));
    let shared = Arc::new(Shared::new(subscription));
    // Threads claim on the app runtime's context: a binding may make a
    // timer or a task while it hands a delivery out, and those belong with
    // the subscription, not with a thread's runtime.
    let app = tokio::runtime::Handle::current();
    let mut finished = Vec::with_capacity(n);
    for index in 0..n {
        let (done, finished_rx) = oneshot::channel::<()>();
        finished.push(finished_rx);
        let thread = Thread {
            unit: Arc::clone(&unit),
            rings: Arc::clone(&rings),
            shared: Arc::clone(&shared),
            stop: stop.clone(),
            app: app.clone(),
            index,
        };
        let name = format!("ruststream-thread-{index}");
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(thread.run()),
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
    let closer = CloseOnDrop {
        rings: &rings.rings,
        shared: &shared,
    };
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
    // The subscription while the feeder has it out. By key it keeps it;
    // otherwise it gives it back before it waits for an idle thread, so
    // the busy ones claim in place meanwhile.
    let mut held = None;
    'feed: loop {
        let target = match rings.find_space(fill, &mut cursor) {
            Some(target) => target,
            None => {
                wakes.flush();
                if fill == Fill::Idle {
                    held = None;
                }
                match rings.snooze_for_space(fill, &mut cursor, &mut backoff) {
                    Some(target) => target,
                    None => tokio::select! {
                        biased;
                        target = rings.wait_space(fill, &mut cursor) => target,
                        () = &mut stopped => break,
                    },
                }
            }
        };
        let subscription = match &mut held {
            Some(subscription) => subscription,
            None => match shared.take(stopped.as_mut()).await {
                Some(subscription) => held.insert(subscription),
                None => break,
            },
        };
        // Permit before receive (JQ-4); it travels with the delivery. The
        // threads owed a wake-up get it before the feeder waits or yields.
        super::receive!(
            let (delivery, permit) = &mut **subscription,
            jobs,
            jobs.try_acquire(),
            jobs.acquire(),
            &stop,
            stopped.as_mut(),
            &mut budget,
            wakes.flush(),
            else: break 'feed,
            again: continue 'feed,
        );
        let feed = Feed {
            rings: &rings.rings,
            subscription: &mut **subscription,
            jobs: &jobs,
            at_hand: &mut at_hand,
            cursor: &mut cursor,
            wakes: &mut wakes,
        };
        let more = match J::push(&unit, feed, delivery, permit, target, !stop.is_stopped()) {
            Ok(more) => more,
            Err((delivery, early, permit)) => {
                wakes.flush();
                Box::pin(unit.settle_early(delivery, early)).await;
                drop(permit);
                continue;
            }
        };
        // Yield before the next take when these spent the budget, or took
        // the last free permit (as `receive!` does).
        if budget.spend_many(more) || jobs.saturated() {
            budget.end_batch();
        }
    }
    drop(held);
    drop(wakes);
    // Threads drain their rings and hands (deliveries in hand are processed
    // and settled), then end; the subscription goes last, here.
    drop(closer);
    for thread in finished {
        let _ = thread.await;
    }
    drop(shared.take_closed());
}

/// What a dedicated thread works with.
struct Thread<B: Broker, S: Subscriber, J> {
    unit: Arc<Unit<B, S>>,
    rings: Arc<Rings<J>>,
    shared: Arc<Shared<B::Subscription>>,
    stop: Stop,
    /// The app runtime, whose context a claim in place runs in.
    app: tokio::runtime::Handle,
    index: usize,
}

impl<B: Broker, S: Subscriber, J: Job<B, S>> Thread<B, S, J> {
    async fn run(self) {
        let Thread {
            unit,
            rings,
            shared,
            stop,
            app,
            index,
        } = &self;
        let ring = &rings.rings[*index];
        let jobs = Arc::clone(unit.app.jobs());
        let mut wait = RingWait::new();
        let mut taken = VecDeque::with_capacity(RING_SLOTS);
        let mut claimed = Vec::with_capacity(RING_SLOTS);
        // The permits of the jobs this thread claimed in place.
        let mut held = jobs.no_permits();
        let mut budget = Budget::new();
        // A traced `!Send` handler has no stack to take its span: its own path.
        let traced_local = unit.traced && unit.service.is_none();
        // By key the feeder waits for room in every ring; otherwise only
        // for an idle thread, which says so itself.
        let freed = || {
            if J::FILL == Fill::AllHaveRoom {
                rings.freed();
            }
        };
        let claims = J::FILL == Fill::Idle;
        loop {
            // The feeder's part: always by key, otherwise when idle (from
            // the start, so the feeder spreads a first backlog evenly).
            if taken.is_empty() && !wait.take_all(ring, &mut taken).await {
                break;
            }
            while let Some(job) = taken.pop_front() {
                ring.start(freed);
                // JQ-4 step 5: the permit returns right before the handler (or
                // after a malformed record's bounded processing). Each delivery
                // runs inside this loop's own future (`invoke!`), never in a
                // future moved into it.
                match job.open(unit) {
                    Ok((mut delivery, body, permit)) => {
                        if unit.abort.is_cancelled() {
                            give_back(permit, &mut held);
                            unit.not_started(delivery);
                        } else if traced_local {
                            give_back(permit, &mut held);
                            Box::pin(unit.traced_local(delivery, body)).await;
                        } else {
                            invoke!(
                                unit,
                                delivery,
                                handle(body),
                                release: give_back(permit, &mut held),
                                // One claimed in place is one of `held`'s.
                                hand_over: permit.or_else(|| Some(held.split_one(unit.app.jobs())))
                            );
                        }
                    }
                    Err((delivery, early, permit)) => {
                        Box::pin(unit.settle_early(delivery, early)).await;
                        give_back(permit, &mut held);
                    }
                }
            }
            if !claims || ring.has_items() {
                continue;
            }
            if !stop.is_stopped() {
                // A batch only while no other thread is idle: deliveries at
                // hand never wait behind this thread's handler while another
                // thread could take them (the feeder serves the idle ones).
                let others_idle = rings.rings.iter().any(Ring::is_idle);
                let max = if others_idle { 1 } else { RING_SLOTS };
                let entered = app.enter();
                let got = J::claim_in_place(
                    ring,
                    max,
                    shared,
                    &jobs,
                    &mut held,
                    &mut claimed,
                    &mut taken,
                );
                drop(entered);
                // Tasks a handler spawned on this runtime get their turn.
                if budget.spend_many(u32::try_from(got).unwrap_or(u32::MAX)) {
                    tokio::task::yield_now().await;
                }
            }
            if taken.is_empty() {
                // Nothing here: the feeder fills this ring when it can.
                ring.set_idle();
                rings.freed();
            }
        }
    }
}

/// Gives a job's permit back: its own, or one of the count `held` for the
/// jobs claimed in place.
#[inline]
fn give_back(permit: Permit, held: &mut Permits<'_>) {
    match permit {
        Some(permit) => drop(permit),
        None => held.truncate(held.len() - 1),
    }
}

/// Closes the rings and the shared subscription however the feeder ends
/// (also when it is aborted), so the threads claim no more, drain their
/// rings and end.
struct CloseOnDrop<'a, T, Sub> {
    rings: &'a [Ring<T>],
    shared: &'a Shared<Sub>,
}

impl<T, Sub> Drop for CloseOnDrop<'_, T, Sub> {
    fn drop(&mut self) {
        self.shared.close();
        for ring in self.rings {
            ring.close();
        }
    }
}
