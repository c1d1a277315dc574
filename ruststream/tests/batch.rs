//! Batch handlers (`batch(max, wait)`): batches fill up to `max`, wait for
//! more up to `wait`, never hold more records than job permits (JQ-7),
//! dead-letter a malformed record on its own, and retry or reject the
//! records of a failed batch on each record's own attempt count (RT-7).

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use common::{Gate, until, within};
use ruststream::ingress::JobQueueSettings;
use ruststream::middleware::{Next, Request};
use ruststream::prelude::*;
use ruststream::{HandlerError, IntoSubscriber, RunningApp, State, SubscribeOptions};
use tokio::sync::Notify;

/// What a batch handler saw: every batch, in order (shared with the test).
#[derive(Clone, Default)]
struct Seen(Arc<Record>);

impl std::ops::Deref for Seen {
    type Target = Record;
    fn deref(&self) -> &Record {
        &self.0
    }
}

struct Record {
    batches: Mutex<Vec<Vec<u32>>>,
    calls: AtomicU32,
    changed: Notify,
    gate: Gate,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            batches: Mutex::default(),
            calls: AtomicU32::new(0),
            changed: Notify::new(),
            gate: Gate::new(),
        }
    }
}

impl Record {
    fn record(&self, batch: &[u32]) {
        self.batches.lock().unwrap().push(batch.to_vec());
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn all(&self) -> Vec<u32> {
        self.batches.lock().unwrap().concat()
    }

    fn sizes(&self) -> Vec<usize> {
        self.batches.lock().unwrap().iter().map(Vec::len).collect()
    }

    async fn until_total(&self, n: usize) {
        until(10, &format!("{n} records handled"), || {
            self.all().len() >= n
        })
        .await;
    }
}

async fn publish(broker: &MemoryBroker, subject: &str, payloads: impl IntoIterator<Item = String>) {
    for payload in payloads {
        broker
            .publish_message(subject, Message::new(payload), None)
            .await
            .unwrap();
    }
}

async fn start<M>(broker: &MemoryBroker, seen: &Seen, sub: impl IntoSubscriber<M>) -> RunningApp {
    App::new()
        .broker(broker.clone())
        .state(seen.clone())
        .subscriber(sub)
        .start()
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------

#[subscriber("batch.fill", batch(max = 100))]
async fn fill(numbers: Vec<u32>, seen: State<Seen>) {
    // The first batch waits until everything is published, so the next
    // ones find a backlog.
    if seen.calls.load(Ordering::SeqCst) == 0 {
        seen.gate.pass().await;
    }
    seen.record(&numbers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_fill_up_to_max_in_arrival_order() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let running = start(&broker, &seen, fill).await;
    publish(&broker, "batch.fill", (0..300).map(|n| n.to_string())).await;
    seen.gate.open();
    seen.until_total(300).await;
    running.shutdown().await.unwrap();

    assert_eq!(
        seen.all(),
        (0..300).collect::<Vec<_>>(),
        "every record once, in order"
    );
    let sizes = seen.sizes();
    assert!(sizes.iter().all(|&n| (1..=100).contains(&n)), "{sizes:?}");
    assert!(
        sizes.iter().filter(|&&n| n == 100).count() >= 2,
        "a backlog is taken 100 at a time: {sizes:?}"
    );
}

// ---------------------------------------------------------------------------

#[subscriber("batch.wait", batch(max = 3, wait = "10s"))]
async fn wait_for_three(numbers: Vec<u32>, seen: State<Seen>) {
    seen.record(&numbers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waits_for_more_records_and_goes_when_full() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let running = start(&broker, &seen, wait_for_three).await;
    for n in 0..3u32 {
        publish(&broker, "batch.wait", [n.to_string()]).await;
        // Each one reaches the loop before the next is published.
        until(10, "the record taken", || broker.queued_bytes() == 0).await;
    }
    // Full at three: handed over long before the 10 s wait ends.
    seen.until_total(3).await;
    assert_eq!(seen.sizes(), vec![3]);
    running.shutdown().await.unwrap();
}

#[subscriber("batch.expire", batch(max = 100, wait = "20ms"))]
async fn expire(numbers: Vec<u32>, seen: State<Seen>) {
    seen.record(&numbers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_never_fills_goes_when_its_wait_ends() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let running = start(&broker, &seen, expire).await;
    publish(&broker, "batch.expire", ["1".to_owned(), "2".to_owned()]).await;
    seen.until_total(2).await;
    assert_eq!(seen.all(), vec![1, 2]);
    running.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// JQ-7: one permit per record.

#[subscriber("batch.permits", batch(max = 100))]
async fn permits(numbers: Vec<u32>, seen: State<Seen>) {
    if seen.calls.load(Ordering::SeqCst) == 0 {
        seen.gate.pass().await;
    }
    seen.record(&numbers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq7_a_batch_never_holds_more_records_than_job_permits() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let running = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(8))
        .state(seen.clone())
        .subscriber(permits)
        .start()
        .await
        .unwrap();
    publish(&broker, "batch.permits", (0..40).map(|n| n.to_string())).await;
    seen.gate.open();
    seen.until_total(40).await;
    running.shutdown().await.unwrap();
    let sizes = seen.sizes();
    assert!(
        sizes.iter().all(|&n| n <= 8),
        "8 permits, at most 8 records: {sizes:?}"
    );
    assert_eq!(seen.all(), (0..40).collect::<Vec<_>>());
}

// ---------------------------------------------------------------------------
// A malformed record is dead-lettered alone.

#[subscriber(
    "batch.malformed",
    batch(max = 10, wait = "50ms"),
    dead_letter = "batch.malformed.dlq"
)]
async fn malformed(numbers: Vec<u32>, seen: State<Seen>) {
    seen.record(&numbers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_is_dead_lettered_and_the_rest_handled() {
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("batch.malformed.dlq"))
        .await
        .unwrap();
    let seen = Seen::default();
    let running = start(&broker, &seen, malformed).await;
    publish(
        &broker,
        "batch.malformed",
        ["1".to_owned(), "not a number".to_owned(), "3".to_owned()],
    )
    .await;
    seen.until_total(2).await;
    let dead = within(10, "the dead letter", dlq.next()).await.unwrap();
    assert_eq!(dead.envelope().payload().as_ref(), b"not a number");
    assert_eq!(seen.all(), vec![1, 3]);
    running.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// A failed batch: its records are retried, then dead-lettered.

#[subscriber("batch.retry", batch(max = 3, wait = "10s"))]
async fn fails_once(numbers: Vec<u32>, seen: State<Seen>) -> Result<(), HandlerError> {
    seen.record(&numbers);
    if seen.calls.load(Ordering::SeqCst) == 1 {
        return Err(HandlerError::retry("database busy"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_retries_its_records() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let running = start(&broker, &seen, fails_once).await;
    publish(&broker, "batch.retry", (1..=3).map(|n| n.to_string())).await;
    until(10, "the retry", || {
        let all = seen.all();
        [1, 2, 3]
            .iter()
            .all(|n| all.iter().filter(|&x| x == n).count() == 2)
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(
        seen.all().len(),
        6,
        "each record twice: failed, then handled"
    );
    assert_eq!(
        seen.batches.lock().unwrap().concat(),
        [1, 2, 3, 1, 2, 3],
        "redelivered in their first order"
    );
}

#[subscriber(
    "batch.poison",
    batch(max = 2, wait = "10s"),
    max_attempts = 2,
    dead_letter = "batch.poison.dlq"
)]
async fn always_fails(numbers: Vec<u32>, seen: State<Seen>) -> Result<(), HandlerError> {
    seen.record(&numbers);
    if numbers.contains(&7) {
        panic!("seven is poison");
    }
    Err(HandlerError::retry("never works"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_batch_that_keeps_failing_are_dead_lettered_with_the_reason() {
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("batch.poison.dlq"))
        .await
        .unwrap();
    let seen = Seen::default();
    let running = start(&broker, &seen, always_fails).await;
    publish(&broker, "batch.poison", ["6".to_owned(), "7".to_owned()]).await;
    let mut dead = Vec::new();
    for _ in 0..2 {
        let delivery = within(10, "a dead letter", dlq.next()).await.unwrap();
        let env = delivery.envelope();
        let reason = env
            .headers()
            .get("ruststream-error")
            .unwrap_or("")
            .to_owned();
        dead.push((String::from_utf8(env.payload().to_vec()).unwrap(), reason));
        delivery.ack().await.unwrap();
    }
    dead.sort();
    assert_eq!(
        dead.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
        ["6", "7"]
    );
    for (_, reason) in &dead {
        assert!(
            reason.contains("handler failed at attempt 2") && reason.contains("batch of"),
            "the reason names the attempt and the batch: {reason}"
        );
    }
    running.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// A backlog taken in batches never hogs a one-thread runtime.

#[subscriber("batch.hog", batch(max = 100))]
async fn hog(numbers: Vec<u32>, seen: State<Seen>) {
    if seen.calls.load(Ordering::SeqCst) == 0 {
        seen.gate.pass().await;
    }
    seen.record(&numbers);
}

#[tokio::test(flavor = "current_thread")]
async fn a_backlog_taken_in_batches_lets_other_tasks_run() {
    const N: u32 = 5_000;
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let running = start(&broker, &seen, hog).await;
    publish(&broker, "batch.hog", (0..N).map(|n| n.to_string())).await;
    // Another task of the same runtime notes how far the backlog was
    // each time it runs.
    let ticks = Arc::new(Mutex::new(Vec::new()));
    let ticker = tokio::spawn({
        let (ticks, seen) = (Arc::clone(&ticks), seen.clone());
        async move {
            while seen.all().len() < N as usize {
                ticks.lock().unwrap().push(seen.all().len());
                tokio::task::yield_now().await;
            }
        }
    });
    seen.gate.open();
    seen.until_total(N as usize).await;
    within(10, "the ticker", ticker).await.unwrap();
    running.shutdown().await.unwrap();
    let ticks = ticks.lock().unwrap();
    let mid_backlog = ticks.iter().filter(|&&n| n > 0 && n < N as usize).count();
    assert!(
        mid_backlog >= 10,
        "the other task ran only {mid_backlog} times while {N} records drained"
    );
}

// ---------------------------------------------------------------------------
// RT-9: a shutdown hands over the batch being gathered.

#[subscriber("batch.stop", batch(max = 100, wait = "60s"))]
async fn long_wait(numbers: Vec<u32>, seen: State<Seen>) {
    seen.record(&numbers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt9_shutdown_handles_the_batch_being_gathered_at_once() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let running = start(&broker, &seen, long_wait).await;
    publish(&broker, "batch.stop", ["5".to_owned()]).await;
    until(10, "the record taken", || broker.queued_bytes() == 0).await;
    assert!(seen.all().is_empty(), "still gathering");
    within(10, "the shutdown", running.shutdown())
        .await
        .unwrap();
    assert_eq!(seen.all(), vec![5], "handled before the loop ended");
}

// ---------------------------------------------------------------------------
// Configuration the runtime refuses.

#[tokio::test]
async fn batch_with_workers_or_zero_max_is_a_startup_error() {
    let err = App::new()
        .broker(MemoryBroker::new())
        .state(Seen::default())
        .subscriber(expire.configure(|c| c.workers(4)))
        .start()
        .await
        .expect_err("batch with workers(4) is refused");
    assert!(
        err.to_string().contains("does not combine with workers(n)"),
        "{err}"
    );

    let err = App::new()
        .broker(MemoryBroker::new())
        .state(Seen::default())
        .subscriber(expire.configure(|c| c.batch(0, std::time::Duration::ZERO)))
        .start()
        .await
        .expect_err("batch(max = 0) is refused");
    assert!(err.to_string().contains("max >= 1"), "{err}");
}

#[tokio::test]
async fn middleware_on_a_batch_subscriber_is_a_startup_error() {
    let layer = ruststream::middleware::from_fn(|request: Request, next: Next| async move {
        next.run(request).await
    });
    let err = App::new()
        .broker(MemoryBroker::new())
        .state(Seen::default())
        .subscriber(expire.configure(|c| c.middleware(layer)))
        .start()
        .await
        .expect_err("middleware on a batch subscriber is refused");
    assert!(err.to_string().contains("take no middleware"), "{err}");
}
