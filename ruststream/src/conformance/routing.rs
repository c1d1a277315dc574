//! Where messages go: order per subject, fan-out and queue groups.

use std::collections::BTreeSet;

use super::helpers::*;
use super::{Outcome, RECEIVE_TIMEOUT};
use crate::binding::{Broker, Delivery, SubscribeOptions, Subscription};

pub(super) async fn publish_order_per_subject<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.orders");
    let mut sub = subscribe(broker, SubscribeOptions::new(subject.as_str())).await?;
    for i in 0..50 {
        publish(broker, &subject, &i.to_string()).await?;
    }
    for i in 0..50 {
        let d = next(&mut sub, "an ordered message").await?;
        let got = text(&d);
        d.ack().await.map_err(failed("ack"))?;
        ensure(got == i.to_string(), || format!("expected {i}, got {got}"))?;
    }
    Ok(())
}

pub(super) async fn fan_out_and_queue_groups<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.fan");
    let mut fan = Vec::new();
    for _ in 0..2 {
        fan.push(subscribe(broker, SubscribeOptions::new(subject.as_str())).await?);
    }
    let mut g1 = subscribe(
        broker,
        SubscribeOptions::new(subject.as_str()).queue_group("g"),
    )
    .await?;
    let mut g2 = subscribe(
        broker,
        SubscribeOptions::new(subject.as_str()).queue_group("g"),
    )
    .await?;
    for i in 0..20 {
        publish(broker, &subject, &i.to_string()).await?;
    }
    for sub in &mut fan {
        for i in 0..20 {
            let d = next(sub, "a fan-out copy").await?;
            let got = text(&d);
            d.ack().await.map_err(failed("ack"))?;
            ensure(got == i.to_string(), || {
                format!("fan-out subscription: expected {i}, got {got}")
            })?;
        }
    }
    let mut seen = BTreeSet::new();
    let mut count = 0;
    while count < 20 {
        let d = tokio::time::timeout(RECEIVE_TIMEOUT, async {
            tokio::select! {
                d = g1.next() => d,
                d = g2.next() => d,
            }
        })
        .await
        .map_err(|_| format!("queue group got {count} of 20 messages"))?
        .ok_or("a queue-group subscription ended")?;
        seen.insert(text(&d));
        count += 1;
        d.ack().await.map_err(failed("ack"))?;
    }
    ensure(seen.len() == 20, || {
        format!(
            "queue group: {count} deliveries but {} distinct messages",
            seen.len()
        )
    })
}
