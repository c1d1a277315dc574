//! Middleware around handlers (issue 20): stock tower layers and one's own,
//! at app level and per subscriber, run after decode and around the
//! handler (RT-7); a layer's error is a handler error — retried up to the
//! budget, then dead-lettered, never acked.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{until, within};
use ruststream::extract::Header;
use ruststream::middleware::{self, Middleware, Next, Outcome, Request};
use ruststream::prelude::*;
use ruststream::subscriber::SubscriberConfig;
use ruststream::{SubscribeOptions, header};
use tower::limit::ConcurrencyLimitLayer;
use tower::timeout::TimeoutLayer;

ruststream::header_name!(Tenant = "tenant");

/// A layer that writes its name on the way in and the outcome on the way
/// out.
fn recording(name: &'static str, log: &'static Mutex<Vec<String>>) -> impl Middleware {
    middleware::from_fn(move |request: Request, next: Next| async move {
        log.lock().unwrap().push(format!("{name}>"));
        let outcome = next.run(request).await;
        let how = match &outcome {
            Outcome::Ack(_) => "ack",
            Outcome::Failed(_) => "failed",
        };
        log.lock().unwrap().push(format!("<{name}:{how}"));
        outcome
    })
}

static ORDER: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[subscriber("mw.order")]
async fn ordered(n: u64) -> u64 {
    ORDER.lock().unwrap().push(format!("handler {n}"));
    n + 1
}

/// App middleware runs outside subscriber middleware, the first added
/// outermost; the reply comes back through every layer to the caller.
#[tokio::test]
async fn layers_nest_app_outside_subscriber_first_added_outermost() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .middleware(recording("app1", &ORDER))
        .middleware(recording("app2", &ORDER))
        .subscriber(ordered.configure(|c| {
            c.middleware(recording("sub1", &ORDER))
                .middleware(recording("sub2", &ORDER))
        }))
        .start()
        .await
        .unwrap();
    let reply: u64 = within(
        5,
        "the reply",
        Publisher::new(broker).request("mw.order", &41u64, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(reply, 42);
    running.shutdown().await.unwrap();
    assert_eq!(
        *ORDER.lock().unwrap(),
        [
            "app1>",
            "app2>",
            "sub1>",
            "sub2>",
            "handler 41",
            "<sub2:ack",
            "<sub1:ack",
            "<app2:ack",
            "<app1:ack"
        ]
    );
}

static SLOW_RUNS: AtomicUsize = AtomicUsize::new(0);

#[subscriber("mw.slow", max_attempts = 2, dead_letter = "mw.slow.dead")]
async fn slow(_job: Bytes) {
    SLOW_RUNS.fetch_add(1, Ordering::SeqCst);
    // Never finishes on its own: only the timeout ends it.
    std::future::pending::<()>().await;
}

/// A handler past tower's `TimeoutLayer` fails: it is redelivered up to
/// `max_attempts`, then dead-lettered with the reason — never acked.
#[tokio::test]
async fn a_timed_out_handler_is_retried_then_dead_lettered_never_acked() {
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("mw.slow.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .middleware(TimeoutLayer::new(Duration::from_millis(50)))
        .subscriber(slow)
        .start()
        .await
        .unwrap();
    Publisher::new(broker.clone())
        .send("mw.slow", Message::new("job-1"))
        .await
        .unwrap();
    let rejected = within(10, "the dead letter", dead.next()).await.unwrap();
    assert_eq!(rejected.envelope().payload(), "job-1".as_bytes());
    assert_eq!(
        rejected.envelope().headers().get(header::ERROR),
        Some("handler failed at attempt 2: request timed out")
    );
    assert_eq!(SLOW_RUNS.load(Ordering::SeqCst), 2);
    running.shutdown().await.unwrap();
}

/// A request whose handler times out gets the failure, not a reply.
#[subscriber("mw.slow.request", max_attempts = 1)]
async fn slow_reply(_job: Bytes) -> u64 {
    std::future::pending::<()>().await;
    7
}

#[tokio::test]
async fn a_request_whose_handler_times_out_gets_the_handler_error() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(
            slow_reply.configure(|c| c.middleware(TimeoutLayer::new(Duration::from_millis(50)))),
        )
        .start()
        .await
        .unwrap();
    let reply: Result<u64, _> = within(
        10,
        "the error reply",
        Publisher::new(broker).request("mw.slow.request", &1u64, Duration::from_secs(5)),
    )
    .await;
    let err = reply.expect_err("a timed-out handler does not reply");
    assert!(
        err.to_string().contains("request timed out"),
        "unexpected error: {err}"
    );
    running.shutdown().await.unwrap();
}

static IN_HAND: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_HAND: AtomicUsize = AtomicUsize::new(0);
static LIMITED_DONE: AtomicUsize = AtomicUsize::new(0);

#[subscriber("mw.limited", workers(4))]
async fn limited(_job: Bytes) {
    let now = IN_HAND.fetch_add(1, Ordering::SeqCst) + 1;
    MOST_IN_HAND.fetch_max(now, Ordering::SeqCst);
    // Long enough for four workers to overlap without the limit.
    tokio::time::sleep(Duration::from_millis(5)).await;
    IN_HAND.fetch_sub(1, Ordering::SeqCst);
    LIMITED_DONE.fetch_add(1, Ordering::SeqCst);
}

/// tower's `ConcurrencyLimitLayer` on one subscriber: four workers, one
/// handler at a time.
#[tokio::test]
async fn a_concurrency_limit_holds_across_workers() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(limited.configure(|c| c.middleware(ConcurrencyLimitLayer::new(1))))
        .start()
        .await
        .unwrap();
    let out = Publisher::new(broker);
    for i in 0..16 {
        out.send("mw.limited", Message::new(format!("job-{i}")))
            .await
            .unwrap();
    }
    until(10, "16 jobs", || LIMITED_DONE.load(Ordering::SeqCst) == 16).await;
    running.shutdown().await.unwrap();
    assert_eq!(MOST_IN_HAND.load(Ordering::SeqCst), 1);
}

static TENANTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[subscriber("mw.tenant")]
async fn per_tenant(n: u64, tenant: Header<Tenant>) {
    TENANTS
        .lock()
        .unwrap()
        .push(format!("{}:{n}", tenant.value()));
}

/// A header a middleware adds is what the handler's extractors read.
#[tokio::test]
async fn a_header_added_by_middleware_reaches_the_extractors() {
    let broker = MemoryBroker::new();
    let enrich = middleware::from_fn(|mut request: Request, next: Next| async move {
        if request.envelope().headers().get("tenant").is_none() {
            request.headers_mut().insert("tenant", "default");
        }
        next.run(request).await
    });
    let running = App::new()
        .broker(broker.clone())
        .middleware(enrich)
        .subscriber(per_tenant)
        .start()
        .await
        .unwrap();
    let out = Publisher::new(broker);
    out.send(
        "mw.tenant",
        out.encode(&1u64).unwrap().with_header("tenant", "acme"),
    )
    .await
    .unwrap();
    out.publish("mw.tenant", &2u64).await.unwrap();
    until(5, "both messages", || TENANTS.lock().unwrap().len() == 2).await;
    running.shutdown().await.unwrap();
    assert_eq!(*TENANTS.lock().unwrap(), ["acme:1", "default:2"]);
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PANIC_RUNS: AtomicUsize = AtomicUsize::new(0);

#[subscriber("mw.panic", max_attempts = 2, dead_letter = "mw.panic.dead")]
async fn panicking(_job: Bytes) {
    PANIC_RUNS.fetch_add(1, Ordering::SeqCst);
    panic!("boom");
}

/// A handler's panic reaches the layers as a failure, and the delivery is
/// retried, then dead-lettered, as without middleware.
#[tokio::test]
async fn a_panic_reaches_the_layers_as_a_failure() {
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("mw.panic.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .middleware(recording("outer", &PANICS))
        .subscriber(panicking)
        .start()
        .await
        .unwrap();
    Publisher::new(broker.clone())
        .send("mw.panic", Message::new("job"))
        .await
        .unwrap();
    let rejected = within(10, "the dead letter", dead.next()).await.unwrap();
    let reason = rejected.envelope().headers().get(header::ERROR).unwrap();
    assert!(reason.contains("boom"), "unexpected reason: {reason}");
    running.shutdown().await.unwrap();
    assert_eq!(PANIC_RUNS.load(Ordering::SeqCst), 2);
    assert_eq!(
        *PANICS.lock().unwrap(),
        ["outer>", "<outer:failed", "outer>", "<outer:failed"]
    );
}

static GUARDED: AtomicUsize = AtomicUsize::new(0);

#[subscriber("mw.guarded", dead_letter = "mw.guarded.dead")]
async fn guarded(_job: Bytes) {
    GUARDED.fetch_add(1, Ordering::SeqCst);
}

/// A middleware that answers without calling `next` settles the delivery
/// with its own outcome: here a rejection, dead-lettered with its reason,
/// and the handler never runs.
#[tokio::test]
async fn a_middleware_can_refuse_before_the_handler() {
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("mw.guarded.dead"))
        .await
        .unwrap();
    let guard = middleware::from_fn(|request: Request, next: Next| async move {
        if request.envelope().headers().get("signed").is_none() {
            return Outcome::Failed(HandlerError::reject("unsigned message"));
        }
        next.run(request).await
    });
    let running = App::new()
        .broker(broker.clone())
        .subscriber(guarded.configure(|c| c.middleware(guard)))
        .start()
        .await
        .unwrap();
    let out = Publisher::new(broker.clone());
    out.send("mw.guarded", Message::new("a").with_header("signed", "yes"))
        .await
        .unwrap();
    out.send("mw.guarded", Message::new("b")).await.unwrap();
    let rejected = within(5, "the dead letter", dead.next()).await.unwrap();
    assert_eq!(rejected.envelope().payload(), "b".as_bytes());
    assert_eq!(
        rejected.envelope().headers().get(header::ERROR),
        Some("handler failed at attempt 1: unsigned message")
    );
    running.shutdown().await.unwrap();
    assert_eq!(GUARDED.load(Ordering::SeqCst), 1);
}

static RELAYED: AtomicUsize = AtomicUsize::new(0);

#[subscriber("mw.relay")]
async fn relay(n: u64, ctx: Ctx) -> Result<(), HandlerError> {
    ctx.publish("mw.relayed", &(n * 10)).await?;
    Ok(())
}

#[subscriber("mw.relayed")]
async fn relayed(n: u64) {
    RELAYED.store(n as usize, Ordering::SeqCst);
}

/// A handler behind middleware still publishes through its context.
#[tokio::test]
async fn a_handler_behind_middleware_publishes_through_its_context() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .middleware(TimeoutLayer::new(Duration::from_secs(5)))
        .subscriber(relay)
        .subscriber(relayed)
        .start()
        .await
        .unwrap();
    Publisher::new(broker)
        .publish("mw.relay", &4u64)
        .await
        .unwrap();
    until(5, "the relayed message", || {
        RELAYED.load(Ordering::SeqCst) == 40
    })
    .await;
    running.shutdown().await.unwrap();
}

#[subscriber("mw.local", threads(1))]
async fn local(_job: Bytes) {
    let here = std::rc::Rc::new(1);
    tokio::task::yield_now().await;
    drop(here);
}

/// A `threads(n)` handler may be `!Send`, so it cannot run inside a `Send`
/// middleware stack: adding middleware to it is a startup error that says
/// why.
#[tokio::test]
async fn middleware_on_a_non_send_handler_is_a_startup_error() {
    let err = App::new()
        .broker(MemoryBroker::new())
        .subscriber(local.configure(|c| c.middleware(TimeoutLayer::new(Duration::from_secs(1)))))
        .start()
        .await
        .expect_err("a !Send handler takes no middleware");
    assert!(
        err.to_string().contains("take no middleware"),
        "unexpected error: {err}"
    );
}

#[subscriber("mw.out.ask")]
async fn forward(n: u64, ctx: Ctx) -> Result<u64, HandlerError> {
    ctx.publish("mw.out.seen", &n).await?;
    Ok(n + 1)
}

/// Publish-side middleware: every message the app sends carries the hook's
/// header — a handler's publish, its reply, a send through the app's
/// publisher — and a publisher made outside the app is left alone.
#[tokio::test]
async fn publish_hooks_see_every_message_the_app_sends() {
    let broker = MemoryBroker::new();
    let mut seen = broker
        .subscribe(SubscribeOptions::new("mw.out.seen"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .on_publish(|subject: &str, message: &mut Message| {
            message.headers_mut().insert("sent-to", subject);
        })
        .on_publish(|_: &str, message: &mut Message| {
            message.headers_mut().insert("service", "billing");
        })
        .subscriber(forward)
        .start()
        .await
        .unwrap();
    let outside = Publisher::new(broker.clone());
    let reply = within(
        5,
        "the reply",
        outside.request_message(
            "mw.out.ask",
            outside.encode(&1u64).unwrap(),
            Duration::from_secs(5),
        ),
    )
    .await
    .unwrap();
    assert_eq!(reply.payload(), "2".as_bytes());
    assert_eq!(reply.headers().get("service"), Some("billing"));
    // The reply went to the caller's reply address, through the hooks.
    let reply_to = reply
        .headers()
        .get("sent-to")
        .expect("the hook saw the reply");
    assert_ne!(reply_to, "mw.out.ask");

    let published = within(5, "the handler's publish", seen.next())
        .await
        .unwrap();
    assert_eq!(
        published.envelope().headers().get("sent-to"),
        Some("mw.out.seen")
    );
    assert_eq!(
        published.envelope().headers().get("service"),
        Some("billing")
    );
    published.ack().await.unwrap();

    let app_out = running.publisher::<MemoryBroker>().unwrap();
    app_out.publish("mw.out.seen", &9u64).await.unwrap();
    let sent = within(5, "the app publisher's send", seen.next())
        .await
        .unwrap();
    assert_eq!(sent.envelope().headers().get("service"), Some("billing"));
    sent.ack().await.unwrap();

    outside.publish("mw.out.seen", &10u64).await.unwrap();
    let plain = within(5, "the outside send", seen.next()).await.unwrap();
    assert_eq!(plain.envelope().headers().get("service"), None);
    plain.ack().await.unwrap();
    running.shutdown().await.unwrap();
}

static THREADED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static THREADED_DONE: AtomicUsize = AtomicUsize::new(0);

#[subscriber("mw.threads", threads(2))]
async fn on_threads(_n: u64) {
    THREADED_DONE.fetch_add(1, Ordering::SeqCst);
}

/// The app's middleware leaves `threads(n)` subscribers out (logged at
/// start): they still run, unwrapped.
#[tokio::test]
async fn app_middleware_leaves_threads_subscribers_unwrapped() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .middleware(recording("app", &THREADED))
        .subscriber(on_threads)
        .start()
        .await
        .unwrap();
    Publisher::new(broker)
        .publish("mw.threads", &1u64)
        .await
        .unwrap();
    until(5, "the handler", || {
        THREADED_DONE.load(Ordering::SeqCst) == 1
    })
    .await;
    running.shutdown().await.unwrap();
    assert!(THREADED.lock().unwrap().is_empty());
}

static HELD_IN_LAYER: AtomicUsize = AtomicUsize::new(0);
static HELD_GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
static HELD_APP: Mutex<Option<ruststream::AppHandle>> = Mutex::new(None);
static IN_USE_AT_HANDLER: Mutex<Vec<usize>> = Mutex::new(Vec::new());

#[subscriber("mw.held")]
async fn held(_job: Bytes) {
    let in_use = HELD_APP.lock().unwrap().as_ref().unwrap().pressure().in_use;
    IN_USE_AT_HANDLER.lock().unwrap().push(in_use);
}

/// JQ-4 step 5 with middleware: a delivery's job permit returns right
/// before the handler, not before the layers, so deliveries a layer holds
/// up (here a gate, as a concurrency limit would) still count in the job
/// queue, in every mode that takes middleware.
#[tokio::test]
async fn jq4_a_delivery_a_layer_holds_up_keeps_its_job_permit() {
    let gate = || {
        middleware::from_fn(|request: Request, next: Next| async move {
            *HELD_APP.lock().unwrap() = Some(request.app().clone());
            HELD_IN_LAYER.fetch_add(1, Ordering::SeqCst);
            HELD_GATE.acquire().await.unwrap().forget();
            next.run(request).await
        })
    };
    type Mode = fn(SubscriberConfig) -> SubscriberConfig;
    let modes: [(&str, Mode); 3] = [
        ("workers(2)", |c| c.workers(2)),
        ("workers(2, by_key)", |c| c.workers_by_key(2)),
        ("threads(2)", |c| c.threads(2)),
    ];
    for (mode, configure) in modes {
        HELD_IN_LAYER.store(0, Ordering::SeqCst);
        IN_USE_AT_HANDLER.lock().unwrap().clear();
        let broker = MemoryBroker::new();
        let running = App::new()
            .broker(broker.clone())
            .job_queue(ruststream::ingress::JobQueueSettings::default().max_queued_jobs(8))
            .subscriber(held.configure(move |c| configure(c).middleware(gate())))
            .start()
            .await
            .unwrap();
        let out = Publisher::new(broker);
        for key in ["a", "b"] {
            out.send("mw.held", Message::new("job").with_key(key))
                .await
                .unwrap();
        }
        until(5, "both deliveries in the layer", || {
            HELD_IN_LAYER.load(Ordering::SeqCst) == 2
        })
        .await;
        assert_eq!(
            running.pressure().in_use,
            2,
            "{mode}: the deliveries a layer holds up keep their permits"
        );
        HELD_GATE.add_permits(1);
        until(5, "the first handler", || {
            IN_USE_AT_HANDLER.lock().unwrap().len() == 1
        })
        .await;
        HELD_GATE.add_permits(1);
        until(5, "the second handler", || {
            IN_USE_AT_HANDLER.lock().unwrap().len() == 2
        })
        .await;
        assert_eq!(
            *IN_USE_AT_HANDLER.lock().unwrap(),
            [1, 0],
            "{mode}: each handler starts with its own permit returned, the held one's still in use"
        );
        let app = HELD_APP.lock().unwrap().take().unwrap();
        running.shutdown().await.unwrap();
        assert_eq!(app.pressure().in_use, 0, "{mode}: every permit came back");
    }
}
