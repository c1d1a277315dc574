//! What the checks share: subscribing, publishing, receiving within a bound.

use super::{Outcome, RECEIVE_TIMEOUT};
use crate::binding::{Broker, Delivery, SubscribeOptions, Subscription};
use crate::{Error, Message};

pub(super) fn ensure(cond: bool, what: impl FnOnce() -> String) -> Outcome {
    if cond { Ok(()) } else { Err(what()) }
}

pub(super) fn failed(what: &str) -> impl FnOnce(Error) -> String + '_ {
    move |err| format!("{what}: {err}")
}

pub(super) async fn next<S: Subscription>(
    sub: &mut S,
    what: &str,
) -> std::result::Result<S::Delivery, String> {
    match tokio::time::timeout(RECEIVE_TIMEOUT, sub.next()).await {
        Ok(Some(delivery)) => Ok(delivery),
        Ok(None) => Err(format!("{what}: the subscription ended")),
        Err(_) => Err(format!("{what}: nothing within {RECEIVE_TIMEOUT:?}")),
    }
}

pub(super) fn text(delivery: &impl Delivery) -> String {
    String::from_utf8_lossy(delivery.envelope().payload()).into_owned()
}

pub(super) async fn publish<B: Broker>(broker: &B, subject: &str, payload: &str) -> Outcome {
    broker
        .publish_message(subject, Message::new(payload.to_owned()), None)
        .await
        .map_err(failed("publish"))
}

pub(super) async fn subscribe<B: Broker>(
    broker: &B,
    options: SubscribeOptions,
) -> std::result::Result<B::Subscription, String> {
    broker.subscribe(options).await.map_err(failed("subscribe"))
}

/// A queue-group member of `subject`, and the delivery of one `payload`
/// published to it.
pub(super) async fn one_to_a_worker<B: Broker>(
    broker: &B,
    subject: &str,
    payload: &str,
    what: &str,
) -> std::result::Result<(B::Subscription, <B::Subscription as Subscription>::Delivery), String> {
    let mut sub = subscribe(broker, SubscribeOptions::new(subject).queue_group("w")).await?;
    publish(broker, subject, payload).await?;
    let delivery = next(&mut sub, what).await?;
    Ok((sub, delivery))
}
