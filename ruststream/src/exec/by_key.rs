//! `workers(n, by_key)` on owner FIFOs.
//!
//! The loop waits until the owner FIFOs hold fewer than `max_pending`
//! deliveries, takes one from the broker, runs the accept layers and decode
//! (outside any lock), computes the key and admits the delivery to its owner
//! in one commit. `n` workers take turns from the ready-owner set: one key runs
//! on one worker at a time, in arrival order.
//!
//! A slow key holds only its own FIFO, never the other keys: a one-way
//! record whose key is at `max_pending_per_key` is held behind that key (in
//! order, counted in `max_pending`) and returns its permit; when the key
//! has room again the loop takes a new permit for it before it receives
//! anything new. A request for a full key is refused at once with
//! the reason.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use super::budget::Budget;
use super::owners::{Admitted, OwnerLimits, OwnerSet, Refusal, Turn};
use crate::binding::{Broker, Delivery, Subscription};
use crate::host::Stop;
use crate::ingress::JobPermit;
use crate::pipeline::{Checked, Unit, invoke};
use crate::subscriber::{SendSubscriber, Subscriber};

type Item<B, S> = (
    <<B as Broker>::Subscription as Subscription>::Delivery,
    <S as Subscriber>::Body,
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
    let owners: Arc<OwnerSet<Item<B, S>, JobPermit>> = Arc::new(OwnerSet::new(OwnerLimits {
        max_count: per_key,
        max_bytes: unit.config.max_pending_bytes_per_key.unwrap_or(usize::MAX),
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
                let Some(mut turn) = poll_fn(|cx| wait.poll(cx)).await else {
                    return;
                };
                loop {
                    // Taken apart at once: only the delivery and the body
                    // live on in this task's state, the turn itself never
                    // does (it is larger than both, and moving it costs).
                    let Turn {
                        owner,
                        item: (mut delivery, body),
                        permit,
                        bytes,
                    } = turn;
                    if unit.abort.is_cancelled() {
                        drop(permit);
                        unit.not_started(delivery);
                    } else {
                        // JQ-4 step 5: the permit returns right before the handler.
                        invoke!(&*unit, delivery, handle_send(body), permit);
                    }
                    // The next turn at hand is taken in the same lock.
                    turn = match owners.finish_and_next(owner, bytes) {
                        Some(turn) => turn,
                        None => match poll_fn(|cx| wait.poll(cx)).await {
                            Some(turn) => turn,
                            None => break,
                        },
                    };
                }
            })
        })
        .collect();

    let closer = CloseOnDrop(&owners);
    // One stop waiter for the whole loop: registered once, not per wait.
    let mut stopped = pin!(stop.wait());
    let mut budget = Budget::new();
    // Whether the last admission left room: only this loop raises the
    // total, so room it saw stays until it admits again.
    let mut room = false;
    loop {
        if owners.has_promotable() {
            // JQ-5: a held record whose key has room again takes a new
            // permit before anything new is received.
            let permit = match jobs.try_acquire() {
                Some(permit) => permit,
                None => match super::wait_permit(jobs.acquire(), &stop).await {
                    Some(permit) => permit,
                    None => break,
                },
            };
            // Only this loop promotes: the owner it saw is still there.
            drop(owners.promote(permit));
            continue;
        }
        // Looked at in place first: the wait is for a full set.
        room = room
            || match owners.capacity_now() {
                Some(room) => room,
                None => tokio::select! {
                    biased;
                    room = owners.wait_capacity() => room,
                    () = &mut stopped => false,
                },
            };
        if !room {
            break;
        }
        // Permit before receive (JQ-4); it travels with the delivery into
        // the owner FIFO. A wait for new records also ends when a held
        // record can move on.
        let received = {
            let mut woken = pin!(StopOrPromotable {
                stopped: stopped.as_mut(),
                owners: &owners,
            });
            super::receive!(
                &mut subscription,
                jobs,
                jobs.try_acquire(),
                jobs.acquire(),
                &stop,
                woken.as_mut(),
                &mut budget,
            )
        };
        let Some((delivery, permit)) = received else {
            if !stop.is_stopped() && owners.has_promotable() {
                continue;
            }
            break;
        };
        let body = match unit.check(&delivery) {
            Checked::Body(body) => body,
            Checked::Early(early) => {
                // Malformed or settled by a layer: its permit returns after.
                Box::pin(unit.settle_early(delivery, early)).await;
                drop(permit);
                continue;
            }
        };
        let key = unit.subscriber.key(&body, delivery.envelope());
        let bytes = delivery.envelope().frame_bytes();
        if delivery.envelope().expects_reply() {
            // A request is a new submission with a caller waiting: a full
            // owner refuses it at once, with the reason (JQ-10).
            match owners.try_admit(key, (delivery, body), permit, bytes) {
                Ok((_, left)) => room = left,
                Err((Refusal::Closed, ..)) => break,
                Err((refusal, (delivery, _), permit)) => {
                    drop(permit);
                    unit.refuse(delivery, refusal.reason()).await;
                }
            }
            continue;
        }
        match owners.admit(key, (delivery, body), permit, bytes) {
            Ok((Admitted::Queued, left)) => room = left,
            // Held behind its full key: the permit returns now (JQ-5).
            Ok((Admitted::Held(permit), left)) => {
                room = left;
                drop(permit);
            }
            Err(_) => break,
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

/// The loop's stop signal, which also ends a wait for new records when a
/// held record can be promoted (the loop then tells the two apart).
struct StopOrPromotable<'a, F, T, P> {
    stopped: Pin<&'a mut F>,
    owners: &'a OwnerSet<T, P>,
}

impl<F: Future<Output = ()>, T, P> Future for StopOrPromotable<'_, F, T, P> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        self.owners.poll_promotable(cx)
    }
}

/// Closes the owner set however the loop ends (also when it is aborted), so
/// the workers drain what is queued and stop.
struct CloseOnDrop<'a, T, P>(&'a OwnerSet<T, P>);

impl<T, P> Drop for CloseOnDrop<'_, T, P> {
    fn drop(&mut self) {
        self.0.close();
    }
}
