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

/// Nothing answers a request made from a `TestCtx`: it fails at once with
/// `NoResponders`, as a request nobody subscribes to does.
#[tokio::test]
async fn a_request_from_a_test_context_has_no_responders() {
    let test = TestCtx::new("orders.paid").build();
    let asked = test
        .ctx()
        .request::<u64, u64>("prices", &1, Duration::from_secs(5))
        .await;
    assert!(
        matches!(asked, Err(ruststream::Error::NoResponders(_))),
        "{asked:?}"
    );
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

// ------------------------------------------------------------------ TestApp

mod app {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use ruststream::prelude::*;
    use ruststream::testing::TestApp;

    static FOLLOW_UPS: AtomicUsize = AtomicUsize::new(0);

    #[subscriber("invoices", max_attempts = 3, dead_letter = "invoices.dead")]
    async fn invoice(amount: i64, ctx: Ctx) -> Result<(), HandlerError> {
        if amount < 0 {
            // Retryable: fails on every attempt, then dead-lettered.
            return Err(HandlerError::retry("ledger unavailable"));
        }
        if amount == 0 && ctx.attempt() == 1 {
            ctx.retry_after(Duration::from_secs(60));
            return Ok(());
        }
        ctx.publish("invoices.booked", &amount).await?;
        ctx.and_after(async {
            tokio::task::yield_now().await;
            FOLLOW_UPS.fetch_add(1, Ordering::SeqCst);
        });
        Ok(())
    }

    fn service<B: Broker>(broker: B) -> App<B> {
        App::new().broker(broker).subscriber(invoice)
    }

    /// Redelivery counts attempts, and after `max_attempts` the message is
    /// dead-lettered with its reason; `settle` waits for all of it (RT-6).
    #[tokio::test]
    async fn settle_returns_after_every_redelivery_and_the_dead_letter() {
        let test = TestApp::start(service(MemoryBroker::new())).await.unwrap();
        test.publish("invoices", &-5).await.unwrap();
        test.settle().await;
        let calls = test.calls("invoice");
        let attempts: Vec<u32> = calls.iter().map(|c| c.envelope.attempt()).collect();
        assert_eq!(attempts, [1, 2, 3], "{test:?}");
        assert_eq!(calls[2].body::<i64>(), -5, "the last call's argument");
        assert!(calls.iter().all(|c| c.outcome.is_err()));
        let dead = test.dead_lettered("invoices");
        assert_eq!(dead.len(), 1);
        assert_eq!(
            dead[0].reason,
            "handler failed at attempt 3: ledger unavailable"
        );
        assert!(test.published("invoices.booked").is_empty());
        test.shutdown().await.unwrap();
    }

    #[subscriber("refunds", dead_letter = "money.dead")]
    async fn refund(_amount: i64) -> Result<(), HandlerError> {
        Err(HandlerError::reject("refunds are closed"))
    }

    #[subscriber("payouts", dead_letter = "money.dead")]
    async fn payout(_amount: i64) -> Result<(), HandlerError> {
        Err(HandlerError::reject("payouts are closed"))
    }

    /// Two subscribers sharing a dead-letter subject: each message given
    /// up on is listed once, under the subject it came from.
    #[tokio::test]
    async fn a_shared_dead_letter_subject_lists_each_dead_letter_once() {
        let app = App::new()
            .broker(MemoryBroker::new())
            .subscriber(refund)
            .subscriber(payout);
        let test = TestApp::start(app).await.unwrap();
        test.publish("refunds", &5).await.unwrap();
        test.settle().await;
        let reasons: Vec<String> = test
            .dead_lettered("refunds")
            .into_iter()
            .map(|dead| dead.reason)
            .collect();
        assert_eq!(reasons, ["handler failed at attempt 1: refunds are closed"]);
        assert!(test.dead_lettered("payouts").is_empty());
        test.shutdown().await.unwrap();
    }

    /// Follow-up tasks have run when `settle` returns (RT-8).
    #[tokio::test]
    async fn follow_ups_have_run_when_settle_returns() {
        let before = FOLLOW_UPS.load(Ordering::SeqCst);
        let test = TestApp::start(service(MemoryBroker::new())).await.unwrap();
        for amount in [10, 20, 30] {
            test.publish("invoices", &amount).await.unwrap();
        }
        test.settle().await;
        assert_eq!(test.published_as::<i64>("invoices.booked"), [10, 20, 30]);
        assert_eq!(FOLLOW_UPS.load(Ordering::SeqCst) - before, 3);
        test.shutdown().await.unwrap();
    }

    /// A `retry_after` waits on the clock: paused, it runs when the test
    /// advances time, and `settle` then waits for it.
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_runs_when_the_paused_clock_reaches_it() {
        let test = TestApp::start(service(MemoryBroker::new())).await.unwrap();
        test.publish("invoices", &0).await.unwrap();
        test.settle().await;
        assert_eq!(test.calls("invoice").len(), 1);
        assert!(test.published("invoices.booked").is_empty());

        tokio::time::advance(Duration::from_secs(61)).await;
        test.settle().await;
        let calls = test.calls("invoice");
        assert_eq!(calls.len(), 2, "{test:?}");
        assert_eq!(calls[1].envelope.total_attempt(), 2);
        assert_eq!(test.published_as::<i64>("invoices.booked"), [0]);
        test.shutdown().await.unwrap();
    }

    /// An app built on a real NATS connection runs under `TestApp` on the
    /// in-process broker instead: the handler runs unchanged, and the app
    /// has no NATS broker any more.
    #[cfg(feature = "nats")]
    #[tokio::test]
    async fn an_app_built_on_nats_runs_unchanged_on_the_in_process_broker() {
        use ruststream::nats::NatsBroker;
        let url = std::env::var("RUSTSTREAM_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
        let nats = NatsBroker::connect(&url).await.unwrap_or_else(|err| {
            panic!(
                "NATS is not reachable at {url}: {err}\nstart it with scripts/test.sh (scripts/services.sh)"
            )
        });
        let test = TestApp::start(service(nats)).await.unwrap();
        assert!(test.running().publisher::<NatsBroker>().is_none());
        test.publish("invoices", &42).await.unwrap();
        test.settle().await;
        assert_eq!(test.published_as::<i64>("invoices.booked"), [42]);
        test.shutdown().await.unwrap();
    }
}
