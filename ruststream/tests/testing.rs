//! Handlers in isolation (issue 21): `TestCtx` builds the delivery a
//! handler sees and records what it did — publishes, `retry_after`,
//! `and_after` (RT-8's follow-ups, run on `ack` as the pipeline would).

#![cfg(feature = "testing")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::testing::TestCtx;
use ruststream::{MainRuntime, header};

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Shipment {
    order: u64,
    tenant: String,
}

struct Counter(AtomicUsize);

#[subscriber("orders.paid")]
async fn ship(order: u64, ctx: Ctx) -> Result<(), HandlerError> {
    let tenant = ctx.headers().get("tenant").unwrap_or("public").to_owned();
    if ctx.attempt() == 1 && ctx.key().is_none() {
        ctx.retry_after(Duration::from_millis(250));
        return Ok(());
    }
    ctx.publish("shipments", &Shipment { order, tenant })
        .await?;
    let counter = ctx.state::<Counter>().expect("registered");
    ctx.and_after(async move {
        counter.0.fetch_add(1, Ordering::SeqCst);
    });
    Ok(())
}

#[tokio::test]
async fn a_handler_sees_the_delivery_it_was_given_and_its_publishes_are_recorded() {
    let test = TestCtx::new("orders.paid")
        .header("tenant", "acme")
        .key("customer-1")
        .attempt(2)
        .correlation_id("req-9")
        .payload("7")
        .state(Counter(AtomicUsize::new(0)))
        .build();
    let ctx = test.ctx();
    assert_eq!(ctx.subject().as_str(), "orders.paid");
    assert_eq!(ctx.attempt(), 2);
    assert_eq!(ctx.key().map(|k| k.as_str()), Some("customer-1"));
    assert_eq!(ctx.correlation_id().map(|k| k.as_str()), Some("req-9"));
    assert_eq!(ctx.payload().as_ref(), b"7");
    assert_eq!(
        ctx.headers().get("tenant"),
        Some("acme"),
        "payload() keeps the headers"
    );

    ship(7, ctx).await.unwrap();
    assert_eq!(
        test.published_as::<Shipment>("shipments"),
        [Shipment {
            order: 7,
            tenant: "acme".into()
        }]
    );
    let sent = test.published();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].1.headers().get(header::CONTENT_TYPE),
        Some("application/json"),
        "what was recorded is what the broker got"
    );
    assert_eq!(test.retry_requested(), None);

    // The continuation waits for the ack, then runs once.
    let counter = test.ctx().state::<Counter>().unwrap();
    assert_eq!(test.and_after_count(), 1);
    assert_eq!(counter.0.load(Ordering::SeqCst), 0);
    test.ack().await;
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    assert_eq!(test.and_after_count(), 0);
}

#[tokio::test]
async fn a_retry_the_handler_asked_for_is_recorded_and_nothing_is_sent() {
    let test = TestCtx::new("orders.paid")
        .state(Counter(AtomicUsize::new(0)))
        .build();
    ship(8, test.ctx()).await.unwrap();
    assert_eq!(test.retry_requested(), Some(Duration::from_millis(250)));
    assert!(test.published().is_empty());
    assert!(test.published_as::<Shipment>("shipments").is_empty());
    assert_eq!(test.and_after_count(), 0);
}

#[tokio::test]
#[should_panic(expected = "a message sent to `shipments` is not a `u64`")]
async fn a_wrong_expectation_fails_and_prints_what_was_sent() {
    let test = TestCtx::new("orders.paid")
        .key("k")
        .state(Counter(AtomicUsize::new(0)))
        .build();
    ship(9, test.ctx()).await.unwrap();
    let _: Vec<u64> = test.published_as("shipments");
}

#[tokio::test]
async fn the_failure_output_lists_every_message_sent() {
    let test = TestCtx::new("orders.paid")
        .key("k")
        .state(Counter(AtomicUsize::new(0)))
        .build();
    ship(10, test.ctx()).await.unwrap();
    let panic = tokio::task::spawn_blocking(move || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _: Vec<u64> = test.published_as("shipments");
        }))
    })
    .await
    .unwrap()
    .unwrap_err();
    let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains(r#"shipments: {"order":10,"tenant":"public"}"#),
        "the output shows what was sent: {text}"
    );
}

#[subscriber("thumbnails", threads(1))]
async fn thumbnail(job: String, ctx: Ctx<MainRuntime>) -> usize {
    ctx.run(async move { job.len() }).await.unwrap()
}

#[tokio::test]
async fn a_main_runtime_context_runs_work_on_the_test_runtime() {
    let test = TestCtx::new("thumbnails").build();
    assert_eq!(thumbnail("cat.png".into(), test.main_ctx()).await, 7);
}
