//! One delivery through the pipeline (RT-7) on the default loop (RT-2):
//! decode failures (JQ-13), handler errors and panics, retry budget and
//! dead-lettering, accept layers, replies and the graceful stop.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use common::{counter, install_metrics, within};
use ruststream::prelude::*;
#[cfg(feature = "testing")]
use ruststream::testing::TestApp;
use ruststream::{Error, SubscribeOptions, Verdict, header, metrics};
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
}

// ---------------------------------------------------------------------------
// RT-2: the default loop never has two handler calls in flight.

static SEQ_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static SEQ_MAX: AtomicUsize = AtomicUsize::new(0);
static SEQ_DONE: AtomicU32 = AtomicU32::new(0);
static SEQ_ALL: Notify = Notify::const_new();
static SEQ_ORDER: Mutex<Vec<u64>> = Mutex::new(Vec::new());
const SEQ_N: u32 = 200;

#[subscriber("seq.orders")]
async fn sequential(order: Order) {
    let now = SEQ_IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    SEQ_MAX.fetch_max(now, Ordering::SeqCst);
    // Yield so that a concurrent dispatcher would get a second call in.
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    SEQ_ORDER.lock().unwrap().push(order.id);
    SEQ_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    if SEQ_DONE.fetch_add(1, Ordering::SeqCst) + 1 == SEQ_N {
        SEQ_ALL.notify_one();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt2_default_loop_never_has_two_handler_calls_in_flight() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(sequential)
        .start()
        .await
        .unwrap();
    let publisher = tokio::spawn({
        let broker = broker.clone();
        async move {
            for id in 0..SEQ_N as u64 {
                Publisher::new(broker.clone())
                    .publish("seq.orders", &Order { id })
                    .await
                    .unwrap();
            }
        }
    });
    within(10, "all orders handled", SEQ_ALL.notified()).await;
    publisher.await.unwrap();
    running.shutdown().await.unwrap();
    assert_eq!(SEQ_MAX.load(Ordering::SeqCst), 1);
    let order = SEQ_ORDER.lock().unwrap().clone();
    assert_eq!(
        order,
        (0..SEQ_N as u64).collect::<Vec<_>>(),
        "publish order kept"
    );
}

// ---------------------------------------------------------------------------
// JQ-13: malformed input never reaches the handler.

static MALFORMED_CALLS: AtomicU32 = AtomicU32::new(0);

#[subscriber("malformed.orders", dead_letter = "malformed.dlq")]
async fn strict(order: Order) -> Order {
    MALFORMED_CALLS.fetch_add(1, Ordering::SeqCst);
    order
}

#[tokio::test]
async fn jq24_10_malformed_payload_never_reaches_the_handler() {
    install_metrics();
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("malformed.dlq"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(strict)
        .start()
        .await
        .unwrap();

    // A request with a malformed payload gets ProtocolError, not a timeout.
    let err = Publisher::new(broker.clone())
        .request::<_, Order>("malformed.orders", &"not an order", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Protocol(_)), "{err:?}");

    // A one-way malformed message is rejected to the dead-letter subject.
    broker
        .publish_message("malformed.orders", Message::new("{not json"), None)
        .await
        .unwrap();
    for _ in 0..2 {
        let dead = within(5, "dead-lettered malformed message", dlq.next())
            .await
            .unwrap();
        let reason = dead.envelope().headers().get(header::ERROR).unwrap();
        assert!(reason.starts_with("malformed payload"), "{reason}");
        dead.ack().await.unwrap();
    }

    // A valid message still flows, proving the loop is alive.
    let ok: Order = Publisher::new(broker.clone())
        .request("malformed.orders", &Order { id: 5 }, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ok.id, 5);
    running.shutdown().await.unwrap();

    assert_eq!(
        MALFORMED_CALLS.load(Ordering::SeqCst),
        1,
        "only the valid one"
    );
    assert_eq!(
        counter(metrics::MALFORMED, "subject", "malformed.orders"),
        2
    );
}

// ---------------------------------------------------------------------------
// Failures: retry budget, dead-lettering, panics.

static FLAKY_ATTEMPTS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

#[subscriber("flaky.jobs", dead_letter = "flaky.dlq", max_attempts = 3)]
async fn always_fails(_job: String, ctx: Ctx) -> Result<(), HandlerError> {
    FLAKY_ATTEMPTS.lock().unwrap().push(ctx.attempt());
    Err(std::io::Error::other("downstream unavailable").into())
}

#[tokio::test]
async fn failing_handler_is_redelivered_until_max_attempts_then_dead_lettered() {
    install_metrics();
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("flaky.dlq"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(always_fails)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("flaky.jobs", Message::new("job-1"), None)
        .await
        .unwrap();
    let dead = within(5, "dead letter after the retry budget", dlq.next())
        .await
        .unwrap();
    assert_eq!(dead.envelope().payload(), "job-1".as_bytes());
    assert_eq!(dead.envelope().headers().get(header::ATTEMPT), Some("3"));
    assert!(
        dead.envelope()
            .headers()
            .get(header::ERROR)
            .unwrap()
            .contains("downstream unavailable")
    );
    running.shutdown().await.unwrap();
    assert_eq!(
        *FLAKY_ATTEMPTS.lock().unwrap(),
        [1, 2, 3],
        "never an endless loop"
    );
    assert_eq!(counter(metrics::HANDLER_ERRORS, "subject", "flaky.jobs"), 3);
}

#[cfg(feature = "testing")]
static REJECT_CALLS: AtomicU32 = AtomicU32::new(0);

#[cfg(feature = "testing")]
#[subscriber("reject.jobs", dead_letter = "reject.dlq", max_attempts = 5)]
async fn rejects(_job: String) -> Result<(), HandlerError> {
    REJECT_CALLS.fetch_add(1, Ordering::SeqCst);
    Err(HandlerError::reject("invalid forever"))
}

/// On `TestApp`: what was dead-lettered and how often the handler ran.
#[cfg(feature = "testing")]
#[tokio::test]
async fn explicit_reject_dead_letters_at_once() {
    let app = App::new().broker(MemoryBroker::new()).subscriber(rejects);
    let test = TestApp::start(app).await.unwrap();
    test.send("reject.jobs", Message::new("j")).await.unwrap();
    test.settle().await;
    let dead = test.dead_lettered("reject.jobs");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].envelope.headers().get(header::ATTEMPT), Some("1"));
    assert_eq!(test.calls("rejects").len(), 1, "never retried");
    test.shutdown().await.unwrap();
    assert_eq!(REJECT_CALLS.load(Ordering::SeqCst), 1);
}

#[cfg(feature = "testing")]
static PANIC_SEEN: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

#[cfg(feature = "testing")]
#[subscriber("panicky.jobs", dead_letter = "panicky.dlq", max_attempts = 2)]
async fn panics_on_boom(job: String, ctx: Ctx) -> String {
    PANIC_SEEN
        .lock()
        .unwrap()
        .push((job.clone(), ctx.attempt()));
    if job == "boom" {
        panic!("handler bug");
    }
    format!("done {job}")
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn a_panicking_handler_does_not_stop_the_loop() {
    let app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(panics_on_boom);
    let test = TestApp::start(app).await.unwrap();
    test.send("panicky.jobs", Message::new("boom"))
        .await
        .unwrap();
    test.settle().await;
    let dead = test.dead_lettered("panicky.jobs");
    assert_eq!(dead.len(), 1);
    assert!(dead[0].reason.contains("handler bug"), "{}", dead[0].reason);
    let reply = test
        .publisher()
        .request_message("panicky.jobs", Message::new("fine"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply.payload(), "done fine".as_bytes());
    test.shutdown().await.unwrap();
    let seen = PANIC_SEEN.lock().unwrap().clone();
    assert_eq!(
        seen,
        [("boom".into(), 1), ("boom".into(), 2), ("fine".into(), 1)]
    );
}

static HANDLER_ERROR_CALLS: AtomicU32 = AtomicU32::new(0);

#[subscriber("failing.requests", max_attempts = 1)]
async fn failing_request(_q: String) -> Result<String, HandlerError> {
    HANDLER_ERROR_CALLS.fetch_add(1, Ordering::SeqCst);
    Err(HandlerError::retry(std::io::Error::other("db down")))
}

#[tokio::test]
async fn a_request_whose_handler_gives_up_gets_a_handler_error() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(failing_request)
        .start()
        .await
        .unwrap();
    let err = Publisher::new(broker.clone())
        .request::<_, String>("failing.requests", &"q", Duration::from_secs(5))
        .await
        .unwrap_err();
    match err {
        Error::Handler(msg) => assert!(msg.contains("db down"), "{msg}"),
        other => panic!("expected a handler error, got {other:?}"),
    }
    running.shutdown().await.unwrap();
    assert_eq!(HANDLER_ERROR_CALLS.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// A handler that never settles (the process dies in it; here the shutdown
// timeout aborts it, RT-10) still ends in the dead letter after
// `max_attempts`, and the handler never runs past it (JQ-13: refused before
// the handler, with a reason).

static HANG_ATTEMPTS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static HANG_ENTERED: Notify = Notify::const_new();

#[subscriber(
    "hang.jobs",
    queue_group = "hang",
    dead_letter = "hang.dlq",
    max_attempts = 2
)]
async fn hangs(_job: String, ctx: Ctx) {
    HANG_ATTEMPTS.lock().unwrap().push(ctx.attempt());
    HANG_ENTERED.notify_one();
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn a_delivery_past_max_attempts_is_dead_lettered_before_the_handler() {
    install_metrics();
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("hang.dlq"))
        .await
        .unwrap();
    // One connection per app: shutting an app down closes its own.
    let app = || {
        App::new()
            .broker(broker.connect())
            .shutdown_timeout(Duration::from_millis(50))
            .subscriber(hangs)
            .start()
    };
    // A member that never takes anything keeps the queue between apps.
    let _queue = broker
        .subscribe(
            SubscribeOptions::new("hang.jobs")
                .queue_group("hang")
                .dead_letter("hang.dlq"),
        )
        .await
        .unwrap();
    broker
        .publish_message("hang.jobs", Message::new("\"stuck\""), None)
        .await
        .unwrap();
    // Each app dies inside the handler: the delivery is never settled and
    // comes back to the next one with attempt + 1.
    for _ in 0..2 {
        let running = app().await.unwrap();
        within(5, "the handler runs", HANG_ENTERED.notified()).await;
        running.shutdown().await.unwrap();
    }
    let running = app().await.unwrap();
    let dead = within(5, "the dead letter", dlq.next()).await.unwrap();
    let reason = dead.envelope().headers().get(header::ERROR).unwrap();
    assert!(reason.starts_with("attempts exhausted"), "{reason}");
    assert_eq!(dead.envelope().headers().get(header::ATTEMPT), Some("3"));
    running.shutdown().await.unwrap();
    assert_eq!(*HANG_ATTEMPTS.lock().unwrap(), [1, 2], "no third run");
    assert_eq!(
        counter(metrics::ATTEMPTS_EXHAUSTED, "subject", "hang.jobs"),
        1
    );
}

// ---------------------------------------------------------------------------
// Accept layers run before decode.

static LAYERED_CALLS: AtomicU32 = AtomicU32::new(0);
static LAYERED_HANDLED: Notify = Notify::const_new();

#[subscriber("layered", dead_letter = "layered.dlq")]
async fn layered(_body: Bytes) {
    LAYERED_CALLS.fetch_add(1, Ordering::SeqCst);
    LAYERED_HANDLED.notify_one();
}

#[tokio::test]
async fn accept_layers_can_reject_before_the_handler() {
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("layered.dlq"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .layer(
            |env: &ruststream::Envelope| match env.headers().get("tenant") {
                Some(_) => Verdict::Accept,
                None => Verdict::Reject("missing tenant".into()),
            },
        )
        .subscriber(layered)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("layered", Message::new("no tenant"), None)
        .await
        .unwrap();
    let dead = within(5, "rejected by the layer", dlq.next())
        .await
        .unwrap();
    assert_eq!(
        dead.envelope().headers().get(header::ERROR),
        Some("missing tenant")
    );
    broker
        .publish_message(
            "layered",
            Message::new("ok").with_header("tenant", "t1"),
            None,
        )
        .await
        .unwrap();
    within(5, "accepted message handled", LAYERED_HANDLED.notified()).await;
    // A request the layer rejects hears why at once, as `Error::Handler`.
    let asked = within(
        5,
        "the rejection's reply",
        broker.request_message(
            "layered",
            Message::new("no tenant"),
            Duration::from_secs(30),
        ),
    )
    .await;
    match asked {
        Err(Error::Handler(why)) => assert_eq!(why, "missing tenant"),
        other => panic!("expected the layer's reason, got {other:?}"),
    }
    running.shutdown().await.unwrap();
    assert_eq!(LAYERED_CALLS.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Graceful stop: the delivery in hand is finished and settled; nothing new
// is taken.

static STOP_STARTED: Notify = Notify::const_new();
static STOP_RELEASE: Notify = Notify::const_new();
static STOP_CALLS: AtomicU32 = AtomicU32::new(0);

#[subscriber("stop.jobs")]
async fn slow(job: String) -> String {
    STOP_CALLS.fetch_add(1, Ordering::SeqCst);
    STOP_STARTED.notify_one();
    STOP_RELEASE.notified().await;
    format!("finished {job}")
}

#[tokio::test]
async fn shutdown_finishes_the_delivery_in_hand_and_takes_no_new_one() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(slow)
        .start()
        .await
        .unwrap();
    let request = tokio::spawn({
        let broker = broker.clone();
        async move {
            broker
                .request_message("stop.jobs", Message::new("first"), Duration::from_secs(30))
                .await
        }
    });
    within(5, "handler started", STOP_STARTED.notified()).await;
    broker
        .publish_message("stop.jobs", Message::new("second"), None)
        .await
        .unwrap();
    let shutdown = tokio::spawn(running.shutdown());
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    assert!(
        !shutdown.is_finished(),
        "shutdown waits for the delivery in hand"
    );
    STOP_RELEASE.notify_one();
    within(5, "shutdown", shutdown).await.unwrap().unwrap();
    let reply = request.await.unwrap().unwrap();
    assert_eq!(reply.payload(), "finished first".as_bytes());
    assert_eq!(
        STOP_CALLS.load(Ordering::SeqCst),
        1,
        "the second was never taken"
    );
}

#[subscriber("double")]
async fn double(order: Order) -> Order {
    Order { id: order.id * 2 }
}

// The annotated function stays a plain awaitable function.
#[tokio::test]
async fn annotated_functions_stay_callable() {
    let out = double(Order { id: 9 }).await;
    assert_eq!(out.id, 18);
}

// ---------------------------------------------------------------------------
// A request an accept layer skips: its caller hears so at once.

static SKIPPED_CALLS: AtomicUsize = AtomicUsize::new(0);

#[subscriber("skipping")]
async fn skipping(body: Bytes) -> Bytes {
    SKIPPED_CALLS.fetch_add(1, Ordering::SeqCst);
    body
}

#[tokio::test]
async fn a_request_an_accept_layer_skips_fails_at_once_instead_of_timing_out() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .layer(|env: &ruststream::Envelope| match env.payload().as_ref() {
            b"duplicate" => Verdict::Skip,
            _ => Verdict::Accept,
        })
        .subscriber(skipping)
        .start()
        .await
        .unwrap();
    // The caller's own timeout is far beyond the test's bound: only the
    // skip's reply can end the call in time.
    let asked = within(
        5,
        "the skip's reply",
        broker.request_message(
            "skipping",
            Message::new("duplicate"),
            Duration::from_secs(60),
        ),
    )
    .await;
    match asked {
        Err(Error::Handler(why)) => assert!(
            why.contains("accept layer skipped"),
            "the reason names the skip: {why}"
        ),
        other => panic!("expected the skip's error, got {other:?}"),
    }
    let answered = within(
        5,
        "a request the layer accepts",
        broker.request_message("skipping", Message::new("new"), Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(answered.payload(), "new".as_bytes());
    running.shutdown().await.unwrap();
    assert_eq!(
        SKIPPED_CALLS.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
}
