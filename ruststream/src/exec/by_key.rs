//! `workers(n, by_key)` (RT-4) on owner FIFOs (JQ-9, JQ-10, JQ-22).
//!
//! The loop waits until the owner FIFOs hold fewer than `max_pending`
//! deliveries, takes one from the broker, runs the accept layers and decode
//! (outside any lock), computes the key and admits the delivery to its owner
//! in one commit. `n` workers take turns from the ready-owner set: one key runs
//! on one worker at a time, in arrival order, and a slow key holds only its
//! own FIFO, never the other keys.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;

use super::budget::Budget;
use super::owners::{OwnerLimits, OwnerSet, Refusal};
use super::sequential::next;
use super::stop::Stop;
use crate::binding::{Broker, Delivery, Subscription};
use crate::ingress::JobPermit;
use crate::pipeline::{Checked, Unit, invoke};
use crate::subscriber::{SendSubscriber, Subscriber};

type Item<B, S> = (
    <<B as Broker>::Subscription as Subscription>::Delivery,
    <S as Subscriber>::Body,
    JobPermit,
);

pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Arc<Unit<B, S>>,
    mut subscription: B::Subscription,
    stop: Stop,
    n: usize,
) {
    let jobs = Arc::clone(unit.app.jobs());
    let max_pending = unit.config.pending_limit(n);
    let per_key = unit.config.max_pending_per_key.unwrap_or(max_pending);
    let owners: Arc<OwnerSet<Item<B, S>>> = Arc::new(OwnerSet::new(OwnerLimits {
        max_count: per_key,
        max_bytes: usize::MAX,
        max_total: max_pending,
    }));
    let workers: Vec<_> = (0..n)
        .map(|_| {
            let unit = Arc::clone(&unit);
            let owners = Arc::clone(&owners);
            tokio::spawn(async move {
                // One waiter for the worker's whole life, polled in place:
                // a turn is moved out of the set once, not through futures.
                let mut wait = owners.waiter();
                while let Some(turn) = poll_fn(|cx| wait.poll(cx)).await {
                    let (delivery, body, permit) = turn.item;
                    // JQ-4 step 5: the permit returns right before the handler.
                    drop(permit);
                    invoke!(&*unit, delivery, handle_send(body));
                    owners.finish(turn.owner, turn.bytes);
                }
            })
        })
        .collect();

    let closer = CloseOnDrop(&owners);
    // One stop waiter for the whole loop: registered once, not per wait.
    let mut stopped = pin!(stop.wait());
    let mut budget = Budget::new();
    loop {
        let has_room = tokio::select! {
            biased;
            room = owners.wait_capacity() => room,
            () = &mut stopped => false,
        };
        if !has_room {
            break;
        }
        // Permit before receive (JQ-4); it travels with the delivery into
        // the owner FIFO.
        let Some(permit) = super::take_permit!(jobs.try_acquire(), jobs.acquire(), &stop) else {
            break;
        };
        let Some(delivery) = next!(&mut subscription, &stop, stopped.as_mut(), &mut budget) else {
            break;
        };
        let body = match unit.check(&delivery) {
            Checked::Body(body) => body,
            Checked::Early(early) => {
                // Malformed or settled by a layer: its permit returns after.
                Box::pin(unit.settle_early(delivery, early)).await;
                continue;
            }
        };
        let key = unit.subscriber.key(&body, delivery.envelope());
        let bytes = delivery.envelope().frame_bytes();
        let request = delivery.envelope().reply_to().is_some();
        // The capacity checked above is ours alone (one producer), so this
        // normally admits at once, without a future to move the item into.
        let item = match owners.try_admit(key, (delivery, body, permit), bytes) {
            Ok(_) => continue,
            Err((Refusal::Closed, _)) => break,
            // A request is a new submission with a caller waiting: a full
            // owner refuses it at once, with the reason (JQ-10).
            Err((refusal @ (Refusal::OwnerCount | Refusal::OwnerBytes), (delivery, _, permit)))
                if request =>
            {
                drop(permit);
                unit.refuse(delivery, refusal.into()).await;
                continue;
            }
            Err((_, item)) => item,
        };
        // A one-way record waits while a per-key limit lower than the total
        // holds it (JQ-22: never capacity-rejected).
        if owners.admit(key, item, bytes).await.is_err() {
            break;
        }
    }
    // Workers drain every owner FIFO, then stop (deliveries in hand are
    // processed and settled).
    drop(closer);
    for worker in workers {
        if let Err(err) = worker.await {
            tracing::error!(subject = %unit.config.subject, error = %err, "worker ended abnormally");
        }
    }
}

/// Closes the owner set however the loop ends (also when it is aborted), so
/// the workers drain what is queued and stop.
struct CloseOnDrop<'a, T>(&'a OwnerSet<T>);

impl<T> Drop for CloseOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.close();
    }
}
