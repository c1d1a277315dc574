//! `workers(n)`: `n` worker tasks share the subscription, and a worker
//! takes its next delivery itself once it is idle, so at most `n`
//! deliveries are in flight and none waits in the framework.
//!
//! With deliveries at hand, a worker claims one under the subscription's
//! lock without a hand-off, a wake-up or a task switch: `n` busy workers
//! cost about what the default loop costs. With nothing at hand (or no job
//! permit free), one worker takes the subscription out and waits with it
//! as the default loop waits — ready, then a permit, then the claim — while
//! the other idle workers wait for it back; so a subscriber stands in the
//! job queue's permit line once, however many workers it has. Given back,
//! the subscription wakes one waiting worker, which takes the next delivery
//! or waits with it in turn.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;

use super::budget::Budget;
use super::shared_subscription::{Out, Shared};
use crate::binding::{Broker, Subscription};
use crate::host::Stop;
use crate::ingress::{BorrowedPermit, JobQueue};
use crate::pipeline::{Checked, Unit, invoke};
use crate::subscriber::SendSubscriber;

pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Arc<Unit<B, S>>,
    subscription: B::Subscription,
    stop: Stop,
    n: usize,
) {
    let shared = Arc::new(Shared::new(subscription));
    // Closed however this future ends (also when it is dropped, as at a
    // runtime's teardown): a worker then finishes the delivery in hand and
    // claims no other (one waiting with the subscription stops at the stop
    // signal or the subscription's end, as every loop does).
    let closer = CloseOnDrop(Arc::clone(&shared));
    let workers: Vec<_> = (0..n)
        .map(|_| {
            let unit = Arc::clone(&unit);
            let shared = Arc::clone(&shared);
            let stop = stop.clone();
            tokio::spawn(async move { work(&unit, &shared, &stop).await })
        })
        .collect();
    for worker in workers {
        if let Err(err) = worker.await {
            tracing::error!(subject = %unit.config.subject, error = %err, "worker ended abnormally");
        }
    }
    drop(closer);
}

/// One worker: takes a delivery, runs it to settlement, and again, until
/// `stop`, the end of the subscription or the close of `shared`.
async fn work<B: Broker, S: SendSubscriber>(
    unit: &Unit<B, S>,
    shared: &Shared<B::Subscription>,
    stop: &Stop,
) {
    let jobs = Arc::clone(unit.app.jobs());
    // One stop waiter for the worker's whole life: registered once.
    let mut stopped = pin!(stop.wait());
    let mut budget = Budget::new();
    'deliveries: while let Some((mut delivery, permit)) =
        next(shared, &jobs, stop, stopped.as_mut(), &mut budget).await
    {
        // Taken apart before the handler runs, as in the default loop.
        let early = 'early: {
            let body = match unit.check(&delivery) {
                Checked::Body(body) => body,
                Checked::Early(early) => break 'early early,
            };
            // JQ-4 step 5: the permit returns right before the handler.
            invoke!(unit, delivery, handle_send(body), permit);
            continue 'deliveries;
        };
        Box::pin(unit.settle_early(delivery, early)).await;
        drop(permit);
    }
}

/// A worker's next delivery with the job permit taken before it was claimed
/// (JQ-4); `None` once the worker is to end.
async fn next<'j, T: Subscription>(
    shared: &Shared<T>,
    jobs: &'j JobQueue,
    stop: &Stop,
    mut stopped: Pin<&mut impl Future<Output = ()>>,
    budget: &mut Budget,
) -> Option<(T::Delivery, BorrowedPermit<'j>)> {
    if budget.spend() {
        tokio::task::yield_now().await;
    }
    // The path of a backlog: a free permit, and the delivery at hand claimed
    // in place.
    if let Some(permit) = jobs.try_acquire_borrowed() {
        if jobs.saturated() {
            budget.end_batch();
        }
        if stop.is_stopped() {
            return None;
        }
        match shared.with(Subscription::try_next) {
            Ok(Some(delivery)) => return Some((delivery, permit)),
            Ok(None) | Err(Out::Taken) => drop(permit),
            Err(Out::Closed) => return None,
        }
    }
    // Otherwise wait with the subscription, as every loop waits; the other
    // idle workers wait for it meanwhile.
    let mut subscription = shared.take(stopped.as_mut()).await?;
    super::receive!(
        &mut *subscription,
        jobs,
        jobs.try_acquire_borrowed(),
        jobs.acquire_borrowed(),
        stop,
        stopped.as_mut(),
        budget,
    )
}

struct CloseOnDrop<T>(Arc<Shared<T>>);

impl<T> Drop for CloseOnDrop<T> {
    fn drop(&mut self) {
        self.0.close();
    }
}
