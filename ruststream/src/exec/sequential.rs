//! The default loop (RT-2): one task per subscriber polls the next delivery
//! only after the previous one is settled, so at most one delivery is in
//! flight and backpressure is simply not polling.

use super::stop::Stop;
use crate::binding::{Broker, Subscription};
use crate::pipeline::Unit;
use crate::subscriber::Subscriber;

/// Runs until `stop` or the subscription ends. A delivery taken
/// before `stop` is processed and settled before the loop returns.
pub(crate) async fn run<B: Broker, S: Subscriber>(
    unit: Unit<B, S>,
    mut subscription: B::Subscription,
    stop: Stop,
) {
    while !stop.is_stopped() {
        let delivery = tokio::select! {
            biased;
            delivery = subscription.next() => match delivery {
                Some(delivery) => delivery,
                None => break,
            },
            () = stop.wait() => break,
        };
        unit.process(delivery).await;
    }
}
