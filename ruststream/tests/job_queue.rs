//! The application job queue wired into the subscriber loops (JQ-2, JQ-4,
//! JQ-7, JQ-11, JQ-24 item 3): a permit before every receive, returned right
//! before the handler; never leaked.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{Gate, frame, until, within};
use ruststream::Error;
use ruststream::ingress::JobQueueSettings;
use ruststream::prelude::*;
use tokio::sync::Notify;

static RING_GATE: Gate = Gate::new();
static RING_STARTED: Notify = Notify::const_new();
static WAITING_HANDLED: Notify = Notify::const_new();

/// One thread, by key: while its handler is held, the feeder has already
/// put the next record in the thread's ring, with the job permit it was
/// received under (without `by_key` a busy thread is not read ahead for).
#[subscriber("jq.ring", threads(1, by_key))]
async fn ring_source(_b: Bytes) {
    RING_STARTED.notify_one();
    RING_GATE.pass().await;
}

#[subscriber("jq.waiting")]
async fn waiting_source(_b: Bytes) {
    WAITING_HANDLED.notify_one();
}

/// JQ-24 item 3: with no permit, the next ordinary record is not received.
/// One permit, held by a record queued in a dedicated thread's ring: the
/// other source has a record waiting and waits for the permit; its record
/// stays in the broker until the ring's record starts and its permit comes
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_3_without_a_permit_the_next_record_is_not_received() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(1))
        .subscriber(ring_source)
        .subscriber(waiting_source)
        .start()
        .await
        .unwrap();
    let app = running.handle().clone();
    for _ in 0..2 {
        broker
            .publish_message("jq.ring", Message::new(vec![0u8; 5]), None)
            .await
            .unwrap();
    }
    within(
        5,
        "the first ring record's handler",
        RING_STARTED.notified(),
    )
    .await;
    until(5, "the second ring record to hold the only permit", || {
        app.pressure().in_use == 1 && broker.queued_bytes() == 0
    })
    .await;
    broker
        .publish_message("jq.waiting", Message::new(vec![0u8; 3]), None)
        .await
        .unwrap();
    // The other source has work, so it waits for the permit (an idle one
    // would not be in the queue at all) — and receives nothing meanwhile.
    until(5, "the other source to wait for the permit", || {
        app.pressure().waiters == 1
    })
    .await;
    assert_eq!(app.pressure().in_use, 1);
    assert_eq!(
        broker.queued_bytes(),
        frame(3),
        "not received without a permit"
    );
    // The ring's record starts: its permit returns right before its
    // handler, and the waiting source receives.
    RING_GATE.open();
    within(5, "the waiting source's record", WAITING_HANDLED.notified()).await;
    assert_eq!(broker.queued_bytes(), 0);
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0, "every permit returned");
}

static HELD_GATE: Gate = Gate::new();
static HELD_STARTED: AtomicU32 = AtomicU32::new(0);
static HELD_DONE: AtomicU32 = AtomicU32::new(0);
static HELD_ALL: Notify = Notify::const_new();
const FLOOD: u32 = 500;

#[subscriber("jq.flood", workers(2, by_key), max_pending = 400)]
async fn flooded(_b: Bytes) {
    HELD_STARTED.fetch_add(1, Ordering::SeqCst);
    HELD_GATE.pass().await;
    if HELD_DONE.fetch_add(1, Ordering::SeqCst) + 1 == FLOOD {
        HELD_ALL.notify_one();
    }
}

/// A flood of N >> max: permits in use never exceed max, and the records
/// beyond them stay in the broker's queue (not in the framework).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_keeps_permits_in_use_at_most_max() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(8))
        .subscriber(flooded)
        .start()
        .await
        .unwrap();
    let app = running.handle().clone();
    for i in 0..FLOOD {
        let message = Message::new(vec![0u8; 4]).with_key(format!("k{}", i % 10));
        broker
            .publish_message("jq.flood", message, None)
            .await
            .unwrap();
    }
    // 2 handlers run (their permits returned) and 8 permits hold queued
    // jobs: 10 records left the broker. The receive loop, with records
    // waiting and no permit, waits for one: it can take nothing more.
    // (Both handlers started: with one not yet, the loop also waits with
    // 8 in use, after 9 records, until that handler returns its permit.)
    until(5, "the job queue to fill and the loop to wait", || {
        let pressure = app.pressure();
        HELD_STARTED.load(Ordering::SeqCst) == 2 && pressure.in_use == 8 && pressure.waiters == 1
    })
    .await;
    assert_eq!(app.pressure().in_use, 8, "never more than max");
    assert_eq!(
        broker.queued_bytes(),
        (FLOOD as usize - 10) * frame(4),
        "nothing more left the broker"
    );
    HELD_GATE.open();
    within(10, "the flood drains", HELD_ALL.notified()).await;
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0, "every permit returned");
}

static STUCK_STARTED: Notify = Notify::const_new();

#[subscriber("jq.stuck", threads(2))]
async fn stuck(_b: Bytes) {
    STUCK_STARTED.notify_one();
    std::future::pending::<()>().await;
}

/// JQ-11: permits are returned exactly once also when a shutdown aborts
/// handlers mid-flight and drops records still queued in rings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_return_after_an_aborting_shutdown() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.connect())
        .job_queue(JobQueueSettings::default().max_queued_jobs(16))
        .shutdown_timeout(Duration::from_millis(100))
        .subscriber(stuck)
        .start()
        .await
        .unwrap();
    let app = running.handle().clone();
    for _ in 0..40 {
        broker
            .publish_message("jq.stuck", Message::new("x"), None)
            .await
            .unwrap();
    }
    within(5, "a stuck handler", STUCK_STARTED.notified()).await;
    until(5, "queued jobs", || app.pressure().in_use > 0).await;
    within(10, "the shutdown", running.shutdown())
        .await
        .unwrap();
    assert_eq!(app.pressure().in_use, 0, "no permit leaked");
}

#[tokio::test]
async fn invalid_job_queue_settings_are_a_startup_error() {
    #[subscriber("jq.none")]
    async fn none(_b: Bytes) {}
    let err = App::new()
        .broker(MemoryBroker::new())
        .job_queue(JobQueueSettings::default().pause_resume(50, 70))
        .subscriber(none)
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}
