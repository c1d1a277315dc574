//! JQ-24 item 16: an owner's structural reject and the shared-cap wait are
//! distinguishable by error and by metric. Alone in its test binary: metrics
//! are process-global, and no other app may move the gauges it reads.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{Gate, counter, install_metrics, observe, queue, until, within};
use ruststream::binding::reply_result;
use ruststream::ingress::JobQueueSettings;
use ruststream::prelude::*;
use ruststream::{Envelope, Error, metrics};

static P16_GATE: Gate = Gate::new();

#[subscriber("p16.in", workers(2, by_key), max_pending_per_key = 2)]
async fn p16_keyed(_b: Bytes) -> String {
    P16_GATE.pass().await;
    "done".to_owned()
}

fn p16_request(
    broker: &MemoryBroker,
    key: &str,
    timeout: Duration,
) -> impl Future<Output = ruststream::Result<Envelope>> + use<> {
    let broker = broker.clone();
    let message = Message::new(key.to_owned()).with_key(key.to_owned());
    async move {
        broker
            .request_message("p16.in", message, timeout)
            .await
            .and_then(reply_result)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_16_structural_reject_and_shared_cap_wait_are_distinguishable() {
    install_metrics();
    let broker = MemoryBroker::new();
    // A name of its own: the job gauges are per app, and other tests of
    // this process run apps too.
    let running = App::new()
        .name("p16")
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(3))
        .subscriber(p16_keyed)
        .start()
        .await
        .unwrap();
    let long = Duration::from_secs(10);
    // Key a: one running, one queued (with its permit; the idle loop holds
    // none): its owner FIFO is at its limit of 2.
    let a1 = tokio::spawn(p16_request(&broker, "a", long));
    let a2 = tokio::spawn(p16_request(&broker, "a", long));
    until(5, "a#2 queued behind a#1", || {
        queue(&broker, "p16.in").queued == 0 && running.pressure().in_use == 1
    })
    .await;

    // Structural: the third request for key a is refused at once.
    let refused = within(5, "the structural refusal", p16_request(&broker, "a", long)).await;
    assert!(
        matches!(&refused, Err(Error::StructuralLimit(_))),
        "{refused:?}"
    );
    assert_eq!(counter(metrics::STRUCTURAL_REJECTS, "subject", "p16.in"), 1);

    // Shared cap: b runs on the second worker, c and d queue with two more
    // permits. A request for e finds no permit: the loop waits for one and
    // e is simply not received — its caller times out, nothing is refused.
    let b1 = tokio::spawn(p16_request(&broker, "b", long));
    let c1 = tokio::spawn(p16_request(&broker, "c", long));
    let d1 = tokio::spawn(p16_request(&broker, "d", long));
    until(5, "b, c and d received", || {
        queue(&broker, "p16.in").queued == 0 && running.pressure().in_use == 3
    })
    .await;
    let e1 = tokio::spawn(p16_request(&broker, "e", Duration::from_secs(1)));
    until(5, "the loop waiting for a permit, e in the broker", || {
        let p = running.pressure();
        p.in_use == 3 && p.waiters == 1 && queue(&broker, "p16.in").queued == 1
    })
    .await;
    let seen = observe();
    assert_eq!(seen.gauge(metrics::JOB_WAITERS, "app", "p16"), 1.0);
    assert_eq!(seen.gauge(metrics::JOBS_IN_USE, "app", "p16"), 3.0);
    let waited = within(5, "e's caller to time out", e1).await.unwrap();
    assert!(matches!(&waited, Err(Error::Timeout(_))), "{waited:?}");
    assert_eq!(
        counter(metrics::STRUCTURAL_REJECTS, "subject", "p16.in"),
        1,
        "a shared-cap wait is not a structural reject"
    );

    P16_GATE.open();
    for task in [a1, a2, b1, c1, d1] {
        let reply = within(5, "a queued request's reply", task).await.unwrap();
        assert_eq!(reply.unwrap().payload(), "done");
    }
    let app = running.handle().clone();
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0, "no permit leaked");
}

static B16_GATE: Gate = Gate::new();
static B16_STARTED: AtomicU32 = AtomicU32::new(0);

#[subscriber("b16.in", workers(2, by_key), max_pending_bytes_per_key = 2048)]
async fn b16_keyed(_b: Bytes) -> String {
    B16_STARTED.fetch_add(1, Ordering::SeqCst);
    B16_GATE.pass().await;
    "done".to_owned()
}

fn b16_request(
    broker: &MemoryBroker,
    key: &str,
    bytes: usize,
) -> impl Future<Output = ruststream::Result<Envelope>> + use<> {
    let broker = broker.clone();
    let message = Message::new(vec![b'x'; bytes]).with_key(key.to_owned());
    async move {
        broker
            .request_message("b16.in", message, Duration::from_secs(10))
            .await
            .and_then(reply_result)
    }
}

/// JQ-21: an owner FIFO is bounded by bytes as well as by count. A request
/// that would take its key past `max_pending_bytes_per_key` is refused at
/// once; a smaller one for the same key, and other keys, still get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_its_byte_limit_refuses_a_request_and_takes_what_fits() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(b16_keyed)
        .start()
        .await
        .unwrap();
    let a1 = tokio::spawn(b16_request(&broker, "a", 1500));
    until(5, "a's first request in its handler", || {
        B16_STARTED.load(Ordering::SeqCst) == 1
    })
    .await;
    let refused = within(5, "the refusal", b16_request(&broker, "a", 1000)).await;
    assert!(
        matches!(&refused, Err(Error::StructuralLimit(why)) if why.contains("byte")),
        "{refused:?}"
    );
    let small = tokio::spawn(b16_request(&broker, "a", 10));
    let other = tokio::spawn(b16_request(&broker, "b", 1500));
    B16_GATE.open();
    for task in [a1, small, other] {
        let reply = within(5, "a reply", task).await.unwrap();
        assert_eq!(reply.unwrap().payload(), "done");
    }
    running.shutdown().await.unwrap();
}
