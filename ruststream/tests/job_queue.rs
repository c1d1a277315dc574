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

static IDLE_HANDLED: Notify = Notify::const_new();
static WAITING_HANDLED: Notify = Notify::const_new();

#[subscriber("jq.idle")]
async fn idle_source(_b: Bytes) {
    IDLE_HANDLED.notify_one();
}

#[subscriber("jq.waiting")]
async fn waiting_source(_b: Bytes) {
    WAITING_HANDLED.notify_one();
}

/// JQ-24 item 3: with no permit, the next ordinary record is not received.
/// One permit: the first source's loop reserves it while it waits for a
/// record, so the second source's record stays in the broker until the first
/// source's record arrives and its permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_3_without_a_permit_the_next_record_is_not_received() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(1))
        .subscriber(idle_source)
        .subscriber(waiting_source)
        .start()
        .await
        .unwrap();
    let app = running.handle().clone();
    // One source reserves the only permit; the other waits for it (until
    // it does, the holder could take the permit again after its record and
    // the other would wait behind it).
    until(5, "one source reserves the only permit, one waits", || {
        let pressure = app.pressure();
        pressure.in_use == 1 && pressure.waiters == 1
    })
    .await;
    broker
        .publish_message("jq.waiting", Message::new(vec![0u8; 3]), None)
        .await
        .unwrap();
    broker
        .publish_message("jq.idle", Message::new(vec![0u8; 5]), None)
        .await
        .unwrap();
    // Whichever source holds the permit takes its record; the other record
    // is received only after that permit came back (before its handler).
    within(5, "the permit holder's record", async {
        tokio::select! {
            () = IDLE_HANDLED.notified() => {}
            () = WAITING_HANDLED.notified() => {}
        }
    })
    .await;
    until(5, "both records received", || broker.queued_bytes() == 0).await;
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0, "every permit returned");
}

static HELD_GATE: Gate = Gate::new();
static HELD_DONE: AtomicU32 = AtomicU32::new(0);
static HELD_ALL: Notify = Notify::const_new();
const FLOOD: u32 = 500;

#[subscriber("jq.flood", workers(2, by_key), max_pending = 400)]
async fn flooded(_b: Bytes) {
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
    // 2 handlers run (their permits returned), 8 permits hold queued jobs
    // (7) plus the loop's reservation (1): 10 records left the broker.
    until(5, "the job queue to fill", || app.pressure().in_use == 8).await;
    until(5, "the broker to keep the rest", || {
        broker.queued_bytes() == (FLOOD as usize - 10) * frame(4)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(30)).await;
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
