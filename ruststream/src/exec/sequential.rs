//! The default loop (RT-2): one task per subscriber polls the next delivery
//! only after the previous one is settled, so at most one delivery is in
//! flight and backpressure is simply not polling.

use super::stop::Stop;
use crate::binding::{Broker, Subscription};
use crate::pipeline::Unit;
use crate::subscriber::SendSubscriber;

/// Runs until `stop` or the end of the subscription. A delivery taken before
/// `stop` is processed and settled before the loop returns.
pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Unit<B, S>,
    mut subscription: B::Subscription,
    stop: Stop,
) {
    while let Some(delivery) = next(&mut subscription, &stop).await {
        unit.process(delivery).await;
    }
}

/// The next delivery, or `None` once `stop` was called or the subscription
/// ended. A delivery already available wins over a stop that races it only
/// if the stop was not yet visible: checked first, so a stopped loop never
/// takes another delivery.
pub(crate) async fn next<S: Subscription>(
    subscription: &mut S,
    stop: &Stop,
) -> Option<S::Delivery> {
    if stop.is_stopped() {
        return None;
    }
    tokio::select! {
        biased;
        delivery = subscription.next() => delivery,
        () = stop.wait() => None,
    }
}
