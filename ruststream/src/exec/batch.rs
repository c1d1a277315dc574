//! The batch loop (`batch(max, wait)`): one task per subscriber gathers up
//! to `max` records, each under a job permit of its own (JQ-7), hands their
//! bodies to the handler in one call, and settles every record by the
//! batch's outcome. One batch is in flight at a time.
//!
//! A batch is handed over when it is full, when `wait` has passed since its
//! first record, when no job permit is free for another record (it never
//! waits for a permit while it holds some: two batch loops cannot hold each
//! other's permits), or when the app stops.

use std::pin::pin;
use std::sync::Arc;

use tokio::time::Instant;

use super::budget::Budget;
use crate::binding::{Broker, Delivery, Subscription};
use crate::host::Stop;
use crate::pipeline::{Caught, Checked, Outcome, Unit, or_abort};
use crate::subscriber::{Batch, Scope, SendSubscriber};
use crate::{HandlerError, spans};
use tracing::Instrument;

/// Runs until `stop` or the end of the subscription. Records taken before
/// `stop` are handled and settled before the loop returns.
pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Unit<B, S>,
    mut subscription: B::Subscription,
    stop: Stop,
) {
    let Some(Batch { max, wait }) = unit.config.batch else {
        unreachable!("the batch loop runs batch subscribers only");
    };
    let jobs = Arc::clone(unit.app.jobs());
    let mut stopped = pin!(stop.wait());
    let mut budget = Budget::new();
    // Reused from batch to batch: claimed records and the ones that
    // decoded; only the bodies move to the handler. `held` counts one job
    // permit per record claimed and not yet settled or handed over.
    let mut claimed = Vec::with_capacity(max);
    let mut deliveries = Vec::with_capacity(max);
    let mut bodies = Vec::with_capacity(max);
    'batches: loop {
        // The first record, like every loop's (JQ-4): no permit held while
        // the subscription is idle.
        super::receive!(
            let (delivery, permit) = &mut subscription,
            jobs,
            jobs.try_acquire_borrowed(),
            jobs.acquire_borrowed(),
            &stop,
            stopped.as_mut(),
            &mut budget,
            else: break 'batches,
            again: continue 'batches,
        );
        let mut held = jobs.no_permits();
        held.adopt(permit);
        claimed.push(delivery);
        let deadline = Instant::now() + wait;
        loop {
            for delivery in claimed.drain(..) {
                match unit.check(&delivery) {
                    Checked::Body(body) => {
                        deliveries.push(delivery);
                        bodies.push(body);
                    }
                    // A record that stops here (malformed, oversized, ..)
                    // is settled on its own, and its permit returns; the
                    // batch goes on without it.
                    Checked::Early(early) => {
                        Box::pin(unit.settle_early(delivery, early)).await;
                        held.truncate(held.len() - 1);
                    }
                }
            }
            let room = max - deliveries.len();
            if room == 0 || stop.is_stopped() {
                break;
            }
            // One permit per record asked for, taken without waiting.
            let mut more = jobs.try_acquire_up_to(room);
            if more.is_empty() {
                break;
            }
            let taken = subscription.try_next_batch(more.len(), &mut claimed);
            more.truncate(taken);
            held.merge(more);
            if taken > 0 {
                continue;
            }
            // Nothing at hand: wait for more until the deadline, holding
            // the permits of the records gathered so far.
            if deadline <= Instant::now() {
                break;
            }
            let ready = super::wait_ready(&mut subscription, stopped.as_mut());
            if !matches!(tokio::time::timeout_at(deadline, ready).await, Ok(true)) {
                break;
            }
            budget.refill();
        }
        // JQ-4 step 5: the permits return right before the handler.
        drop(held);
        // A backlog taken a batch at a time still lets the other tasks of
        // the runtime run every so many records, as every loop does.
        let gathered = u32::try_from(deliveries.len()).unwrap_or(u32::MAX);
        if budget.spend_many(gathered.saturating_sub(1)) {
            budget.end_batch();
        }
        if deliveries.is_empty() {
            continue;
        }
        let batch = std::mem::replace(&mut bodies, Vec::with_capacity(max));
        if unit.traced {
            let span = spans::process_batch(
                unit.broker.name(),
                unit.subscriber.name(),
                &unit.config.subject,
                batch.len(),
            );
            handle(&unit, &mut deliveries, batch).instrument(span).await;
        } else {
            handle(&unit, &mut deliveries, batch).await;
        }
    }
}

/// Runs the batch handler and settles every record by its outcome; a
/// batch the shutdown timeout aborts is dropped unsettled (redelivered).
async fn handle<B: Broker, S: SendSubscriber, D: Delivery>(
    unit: &Unit<B, S>,
    deliveries: &mut Vec<D>,
    bodies: Vec<S::Body>,
) {
    if unit.abort.is_cancelled() {
        // RT-10: past the shutdown timeout nothing more starts.
        return unit.not_started(std::mem::take(deliveries));
    }
    let mut aborted = pin!(async { unit.abort.cancelled().await });
    let started = unit.metrics.started();
    let (outcome, follow_ups) = {
        let scope = Scope::new(deliveries[0].envelope(), &unit.app, &unit.broker);
        let outcome = {
            let handler = pin!(unit.subscriber.handle_batch(bodies, &scope));
            or_abort(Caught(handler), aborted.as_mut()).await
        };
        (outcome, scope.into_follow_ups())
    };
    unit.metrics.finished(started);
    let Some(outcome) = outcome else {
        deliveries.clear();
        return unit.aborted();
    };
    let failure = match outcome {
        Outcome::Ack(_) => None,
        Outcome::Failed(err) => Some(err),
    };
    let count = deliveries.len();
    // A failed batch is settled last record first: a broker that puts a
    // nacked record back at the head of its queue (the memory Core) then
    // redelivers the batch in its first order.
    if failure.is_some() {
        deliveries.reverse();
    }
    for mut delivery in deliveries.drain(..) {
        let outcome = match &failure {
            None if !unit.after_ack => {
                unit.acked();
                match delivery.try_ack() {
                    Some(acked) => unit.settled(acked),
                    None => match or_abort(pin!(delivery.ack()), aborted.as_mut()).await {
                        Some(acked) => unit.settled(acked),
                        None => return unit.aborted(),
                    },
                }
                continue;
            }
            None => Outcome::Ack(None),
            // Each record is retried (or rejected) on its own attempt count.
            Some(err) => Outcome::Failed(batch_failure(err, count)),
        };
        let settle = pin!(unit.settle_outcome(delivery, outcome, None));
        if or_abort(settle, aborted.as_mut()).await.is_none() {
            return unit.aborted();
        }
    }
    if let Some(follow_ups) = follow_ups {
        follow_ups.settled(failure.is_none());
    }
}

/// The failure of one record of a failed batch: retried or rejected as the
/// batch's error says, with its message.
fn batch_failure(err: &HandlerError, count: usize) -> HandlerError {
    let message = format!("batch of {count} failed: {err}");
    if err.is_retry() {
        HandlerError::retry(message)
    } else {
        HandlerError::reject(message)
    }
}
