//! Settlement: ack, nack, delayed retry, and deliveries left unsettled.

use std::time::Duration;

use super::helpers::*;
use super::{Capabilities, Outcome, RECEIVE_TIMEOUT};
use crate::binding::{Broker, Delivery, RetryAfter, SubscribeOptions, Subscription};

pub(super) async fn ack_never_redelivers<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.ack");
    let (mut sub, d) = one_to_a_worker(broker, &subject, "once", "the message").await?;
    d.ack().await.map_err(failed("ack"))?;
    publish(broker, &subject, "marker").await?;
    let d = next(&mut sub, "the marker").await?;
    let got = text(&d);
    d.ack().await.map_err(failed("ack"))?;
    ensure(got == "marker", || {
        format!("an acked message came back: {got}")
    })
}

pub(super) async fn nack_redelivers_with_attempt_plus_one<B: Broker>(
    broker: &B,
    p: &str,
) -> Outcome {
    let subject = format!("{p}.nack");
    let (mut sub, first) = one_to_a_worker(broker, &subject, "again", "the first delivery").await?;
    let attempt = first.envelope().attempt();
    ensure(attempt == 1, || {
        format!("first delivery has attempt {attempt}")
    })?;
    first.nack().await.map_err(failed("nack"))?;
    let second = next(&mut sub, "the redelivery").await?;
    let (got, attempt) = (text(&second), second.envelope().attempt());
    second.ack().await.map_err(failed("ack"))?;
    ensure(got == "again" && attempt == 2, || {
        format!("redelivery: payload {got:?}, attempt {attempt} (expected \"again\", 2)")
    })
}

/// `Delivery::retry_after`: a broker that holds the delay redelivers the
/// same message, as its own subject, no sooner than the delay and with one
/// more attempt counted; one that cannot hands the delivery back unsettled.
pub(super) async fn retry_after_is_held_no_sooner_or_handed_back<B: Broker>(
    broker: &B,
    p: &str,
) -> Outcome {
    const DELAY: Duration = Duration::from_millis(500);
    let subject = format!("{p}.retry");
    let (mut sub, first) = one_to_a_worker(broker, &subject, "later", "the first delivery").await?;
    let asked = tokio::time::Instant::now();
    match first.retry_after(DELAY).await {
        RetryAfter::NotHeld(first) => {
            let got = text(&first);
            first
                .ack()
                .await
                .map_err(failed("ack of the handed-back delivery"))?;
            ensure(got == "later", || format!("handed back {got:?}"))
        }
        RetryAfter::Held(Err(err)) => Err(format!("retry_after: {err}")),
        RetryAfter::Held(Ok(())) => {
            let again = next(&mut sub, "the held retry").await?;
            let waited = asked.elapsed();
            let env = again.envelope();
            let (got, attempt) = (text(&again), env.total_attempt());
            let same_subject = env.subject().as_str() == subject;
            again.ack().await.map_err(failed("ack"))?;
            ensure(waited >= DELAY, || {
                format!("redelivered after {waited:?}, before the {DELAY:?} delay")
            })?;
            ensure(got == "later" && attempt == 2 && same_subject, || {
                format!(
                    "retry: payload {got:?}, total attempt {attempt}, own subject {same_subject} \
                     (expected \"later\", 2, true)"
                )
            })
        }
    }
}

/// Attempts never go down: a retry the broker holds after a `nack` comes
/// back as the third attempt.
pub(super) async fn a_held_retry_after_a_redelivery_counts_both<B: Broker>(
    broker: &B,
    p: &str,
) -> Outcome {
    let subject = format!("{p}.retry2");
    let (mut sub, first) = one_to_a_worker(broker, &subject, "again", "the first delivery").await?;
    first.nack().await.map_err(failed("nack"))?;
    let second = next(&mut sub, "the redelivery").await?;
    match second.retry_after(Duration::from_millis(10)).await {
        RetryAfter::NotHeld(second) => second.ack().await.map_err(failed("ack")),
        RetryAfter::Held(Err(err)) => Err(format!("retry_after: {err}")),
        RetryAfter::Held(Ok(())) => {
            let third = next(&mut sub, "the held retry").await?;
            let attempt = third.envelope().total_attempt();
            third.ack().await.map_err(failed("ack"))?;
            ensure(attempt == 3, || {
                format!("the retry after a redelivery has total attempt {attempt} (expected 3)")
            })
        }
    }
}

pub(super) async fn unsettled_delivery_of_a_dropped_consumer_is_redelivered<B: Broker>(
    broker: &B,
    p: &str,
    caps: Capabilities,
) -> Outcome {
    let subject = format!("{p}.drop");
    let options = || SubscribeOptions::new(subject.as_str()).queue_group("w");
    let mut a = subscribe(broker, options()).await?;
    let mut b = subscribe(broker, options()).await?;
    publish(broker, &subject, "orphan").await?;
    // Whichever member takes it drops it unsettled, and itself.
    let a_took = tokio::time::timeout(RECEIVE_TIMEOUT, async {
        tokio::select! {
            d = a.next() => d.map(|d| (true, d)),
            d = b.next() => d.map(|d| (false, d)),
        }
    })
    .await
    .map_err(|_| "nobody received the message".to_owned())?
    .ok_or("a subscription ended")?;
    let (took_a, delivery) = a_took;
    drop(delivery);
    let mut other = if took_a {
        drop(a);
        b
    } else {
        drop(b);
        a
    };
    let d = next(&mut other, "the redelivery to the other member").await?;
    let (got, attempt) = (text(&d), d.envelope().attempt());
    d.ack().await.map_err(failed("ack"))?;
    // A broker that counts returns may also count one from the dropped
    // consumer's channel, which can take the message back once more while
    // it closes.
    let expected = if caps.counts_returns {
        attempt >= 2
    } else {
        attempt == 2
    };
    ensure(got == "orphan" && expected, || {
        format!("redelivery: payload {got:?}, attempt {attempt} (expected \"orphan\", 2)")
    })
}

/// A consumer that acks a few deliveries and goes away with more in hand
/// or in flight: the other member of its queue group gets exactly the
/// others. Acks settle when they are made, not when the consumer next reads
/// (bindings that coalesce or defer acks send them before it leaves).
pub(super) async fn acks_of_a_consumer_that_leaves_are_kept<B: Broker>(
    broker: &B,
    p: &str,
) -> Outcome {
    const SENT: usize = 10;
    const ACKED: usize = 3;
    let subject = format!("{p}.leave");
    let options = || SubscribeOptions::new(subject.as_str()).queue_group("stay");
    let mut first = subscribe(broker, options()).await?;
    for i in 0..SENT {
        publish(broker, &subject, &i.to_string()).await?;
    }
    let mut acked = Vec::new();
    for _ in 0..ACKED {
        let d = next(&mut first, "a message for the first member").await?;
        acked.push(text(&d));
        d.ack().await.map_err(failed("ack"))?;
    }
    // The group keeps a member (a group without one keeps nothing on some
    // brokers), which reads only after the first one has left.
    let mut second = subscribe(broker, options()).await?;
    drop(first);
    let mut rest = Vec::new();
    while rest.len() < SENT - ACKED {
        let d = next(&mut second, "the messages the first member left").await?;
        let got = text(&d);
        d.ack().await.map_err(failed("ack"))?;
        if acked.contains(&got) {
            return Err(format!(
                "{got:?} was acked by a member that then left, and delivered again"
            ));
        }
        if !rest.contains(&got) {
            rest.push(got);
        }
    }
    Ok(())
}
