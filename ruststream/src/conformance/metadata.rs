//! What travels with a message: headers, key, correlation id, dead-letter
//! reasons; and which subjects a pattern matches.

use super::Outcome;
use super::helpers::*;
use crate::Message;
use crate::binding::{Broker, Delivery, SubscribeOptions};
use crate::message::header;

pub(super) async fn headers_key_and_correlation_id_round_trip<B: Broker>(
    broker: &B,
    p: &str,
) -> Outcome {
    let subject = format!("{p}.meta");
    let mut sub = subscribe(broker, SubscribeOptions::new(subject.as_str())).await?;
    let message = Message::new("body")
        .with_header("x-tenant", "acme")
        .with_header("x-trace", "t-1")
        .with_key("k-7")
        .with_correlation_id("c-9");
    broker
        .publish_message(&subject, message, None)
        .await
        .map_err(failed("publish"))?;
    let d = next(&mut sub, "the message").await?;
    let env = d.envelope();
    let got = (
        env.headers().get("x-tenant").map(str::to_owned),
        env.headers().get("x-trace").map(str::to_owned),
        env.key().map(|k| k.as_str().to_owned()),
        env.correlation_id().map(|c| c.as_str().to_owned()),
        text(&d),
    );
    d.ack().await.map_err(failed("ack"))?;
    let want = (
        Some("acme".to_owned()),
        Some("t-1".to_owned()),
        Some("k-7".to_owned()),
        Some("c-9".to_owned()),
        "body".to_owned(),
    );
    ensure(got == want, || format!("got {got:?}, expected {want:?}"))
}

pub(super) async fn reject_dead_letters_with_the_reason<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.work");
    let dlq = format!("{p}.dlq");
    let mut dead = subscribe(broker, SubscribeOptions::new(dlq.as_str())).await?;
    let mut sub = subscribe(
        broker,
        SubscribeOptions::new(subject.as_str())
            .queue_group("w")
            .dead_letter(dlq.as_str()),
    )
    .await?;
    publish(broker, &subject, "poison").await?;
    let d = next(&mut sub, "the message").await?;
    d.reject("bad input").await.map_err(failed("reject"))?;
    let d = next(&mut dead, "the dead letter").await?;
    let env = d.envelope();
    let got = (
        text(&d),
        env.headers().get(header::ERROR).map(str::to_owned),
        env.headers()
            .get(header::ORIGINAL_SUBJECT)
            .map(str::to_owned),
    );
    d.ack().await.map_err(failed("ack"))?;
    let want = (
        "poison".to_owned(),
        Some("bad input".to_owned()),
        Some(subject),
    );
    ensure(got == want, || format!("got {got:?}, expected {want:?}"))
}

pub(super) async fn wildcards_match_one_and_many_tokens<B: Broker>(broker: &B, p: &str) -> Outcome {
    let mut one = subscribe(broker, SubscribeOptions::new(format!("{p}.w.*"))).await?;
    let mut many = subscribe(broker, SubscribeOptions::new(format!("{p}.w.>"))).await?;
    publish(broker, &format!("{p}.w.a"), "1").await?;
    publish(broker, &format!("{p}.w.a.b"), "2").await?;
    publish(broker, &format!("{p}.w.c"), "3").await?;
    let mut got_one = Vec::new();
    for _ in 0..2 {
        let d = next(&mut one, "a `*` match").await?;
        got_one.push(text(&d));
        d.ack().await.map_err(failed("ack"))?;
    }
    let mut got_many = Vec::new();
    for _ in 0..3 {
        let d = next(&mut many, "a `>` match").await?;
        got_many.push(text(&d));
        d.ack().await.map_err(failed("ack"))?;
    }
    ensure(got_one == ["1", "3"] && got_many == ["1", "2", "3"], || {
        format!("`*` got {got_one:?} (expected [1, 3]); `>` got {got_many:?} (expected [1, 2, 3])")
    })
}
