//! The default loop: one task per subscriber polls the next delivery
//! only after the previous one is settled, so at most one delivery is in
//! flight and backpressure is simply not polling.

use std::pin::pin;
use std::sync::Arc;

use super::budget::Budget;
use crate::binding::Broker;
use crate::host::Stop;
use crate::pipeline::{Checked, Unit, invoke};
use crate::subscriber::SendSubscriber;

/// Runs until `stop` or the end of the subscription. A delivery taken before
/// `stop` is processed and settled before the loop returns.
pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Unit<B, S>,
    mut subscription: B::Subscription,
    stop: Stop,
) {
    // `receive!` and `invoke!` spelled out in place, so each delivery is
    // taken and runs inside this loop's own future rather than in futures
    // moved into it.
    let jobs = Arc::clone(unit.app.jobs());
    // One stop waiter for the whole loop: registered once, not per wait.
    let mut stopped = pin!(stop.wait());
    let mut budget = Budget::new();
    'deliveries: loop {
        // JQ-4: the permit borrows `jobs`, which this loop keeps alive.
        super::receive!(
            let (mut delivery, permit) = &mut subscription,
            jobs,
            jobs.try_acquire_borrowed(),
            jobs.acquire_borrowed(),
            &stop,
            stopped.as_mut(),
            &mut budget,
            else: break 'deliveries,
            again: continue 'deliveries,
        );
        // The check's result is taken apart before anything waits: held
        // across the handler's `.await`s it would be kept in this loop's
        // future, and the body copied in and out of it.
        let early = 'early: {
            let body = match unit.check(&delivery) {
                Checked::Body(body) => body,
                Checked::Early(early) => break 'early early,
            };
            // JQ-4 step 5: the permit returns right before the handler.
            invoke!(&unit, delivery, handle_send(body), permit);
            continue 'deliveries;
        };
        Box::pin(unit.settle_early(delivery, early)).await;
        drop(permit);
    }
}
