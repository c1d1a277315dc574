//! Lifecycle (RT-8 … RT-10): follow-up tasks, hooks, the ordered shutdown and
//! its timeout.

mod common;

use std::future::pending;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Gate, within};
use ruststream::binding::memory::MemorySubscription;
use ruststream::prelude::*;
use ruststream::{Envelope, Error, SubscribeOptions, header};
use tokio::sync::{Notify, Semaphore};

/// A broker that records when it closes: the real memory broker underneath.
#[derive(Clone)]
struct Logged {
    name: &'static str,
    inner: MemoryBroker,
    log: &'static Mutex<Vec<String>>,
}

impl Broker for Logged {
    type Subscription = MemorySubscription;

    fn name(&self) -> &'static str {
        self.name
    }

    async fn subscribe(&self, options: SubscribeOptions) -> ruststream::Result<MemorySubscription> {
        self.inner.subscribe(options).await
    }

    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<tokio::time::Instant>,
    ) -> ruststream::Result<()> {
        self.inner.publish_message(subject, message, deadline).await
    }

    async fn close(&self) -> ruststream::Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("close {}", self.name));
        self.inner.close().await
    }
}

// ---------------------------------------------------------------------------
// RT-9: the exact phase order.

static ORDER_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ORDER_GATE: Gate = Gate::new();
static ORDER_IN_HAND: Semaphore = Semaphore::const_new(0);
static ORDER_HANDLED: AtomicU32 = AtomicU32::new(0);

fn order_log(event: impl Into<String>) {
    ORDER_LOG.lock().unwrap().push(event.into());
}

#[subscriber("order.pool", workers(2))]
async fn pooled(job: String, ctx: Ctx) {
    ORDER_HANDLED.fetch_add(1, Ordering::SeqCst);
    ORDER_IN_HAND.add_permits(1);
    ORDER_GATE.pass().await;
    order_log(format!("handled {job}"));
    ctx.and_after(async move { order_log(format!("and_after {job}")) });
}

#[subscriber("order.threads", threads(2))]
async fn threaded(job: String, ctx: Ctx<MainRuntime>) {
    ORDER_HANDLED.fetch_add(1, Ordering::SeqCst);
    ORDER_IN_HAND.add_permits(1);
    ORDER_GATE.pass().await;
    order_log(format!("handled {job}"));
    ctx.spawn(async move { order_log(format!("spawned {job}")) });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt9_shutdown_runs_every_phase_in_order() {
    let first = Logged {
        name: "first",
        inner: MemoryBroker::new(),
        log: &ORDER_LOG,
    };
    let second = Logged {
        name: "second",
        inner: MemoryBroker::new(),
        log: &ORDER_LOG,
    };
    let mut goodbyes = first
        .subscribe(SubscribeOptions::new("order.goodbye"))
        .await
        .unwrap();
    let hook_broker = first.clone();
    let running = App::new()
        .broker(first.clone())
        .subscriber(pooled)
        .broker(second.clone())
        .subscriber(threaded)
        .on_shutdown(move |_| async move {
            order_log("on_shutdown");
            // Brokers are still connected here.
            hook_broker
                .publish_message("order.goodbye", Message::new("bye"), None)
                .await?;
            Ok(())
        })
        .after_shutdown(|_| async {
            order_log("after_shutdown");
            Ok(())
        })
        .start()
        .await
        .unwrap();

    for job in ["p1", "p2"] {
        first
            .publish_message("order.pool", Message::new(job), None)
            .await
            .unwrap();
    }
    for job in ["t1", "t2"] {
        second
            .publish_message("order.threads", Message::new(job), None)
            .await
            .unwrap();
    }
    // All four deliveries are in hand, blocked.
    within(10, "4 deliveries in hand", ORDER_IN_HAND.acquire_many(4))
        .await
        .unwrap()
        .forget();
    let shutdown = tokio::spawn(running.shutdown());
    let bye = within(10, "the on_shutdown hook's publish", goodbyes.next())
        .await
        .unwrap();
    assert_eq!(bye.envelope().payload(), "bye".as_bytes());
    ORDER_GATE.open();
    within(10, "shutdown", shutdown).await.unwrap().unwrap();

    let log = ORDER_LOG.lock().unwrap().clone();
    let at = |event: &str| {
        log.iter()
            .position(|e| e == event)
            .unwrap_or_else(|| panic!("`{event}` missing from {log:?}"))
    };
    let handled = ["handled p1", "handled p2", "handled t1", "handled t2"].map(at);
    let follow_ups = ["and_after p1", "and_after p2", "spawned t1", "spawned t2"].map(at);
    assert_eq!(at("on_shutdown"), 0, "{log:?}");
    assert!(handled.iter().all(|&h| h > at("on_shutdown")), "{log:?}");
    assert!(
        follow_ups.iter().all(|&f| f < at("close second")),
        "tracked tasks finish before brokers close: {log:?}"
    );
    assert!(
        at("close second") < at("close first"),
        "reverse order: {log:?}"
    );
    assert_eq!(at("after_shutdown"), log.len() - 1, "{log:?}");
    assert_eq!(log.len(), 12, "each event exactly once: {log:?}");
    assert_eq!(ORDER_HANDLED.load(Ordering::SeqCst), 4);
}

// ---------------------------------------------------------------------------
// RT-8: follow-ups run after the ack, exactly once; shutdown waits for them.

static FOLLOW_RUNS: AtomicU32 = AtomicU32::new(0);
static FOLLOW_HOOK_RUNS: AtomicU32 = AtomicU32::new(0);
static FOLLOW_RELEASE: Notify = Notify::const_new();
static FOLLOW_FAILED_RUNS: AtomicU32 = AtomicU32::new(0);
static FOLLOW_ACKED: Notify = Notify::const_new();

#[subscriber("follow.jobs")]
async fn follow(job: String, ctx: Ctx) -> Result<(), HandlerError> {
    if job == "fail" {
        ctx.and_after(async {
            FOLLOW_FAILED_RUNS.fetch_add(1, Ordering::SeqCst);
        });
        return Err(HandlerError::reject("no"));
    }
    ctx.and_after(async {
        FOLLOW_RELEASE.notified().await;
        FOLLOW_RUNS.fetch_add(1, Ordering::SeqCst);
    });
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt8_and_after_and_after_ack_run_once_after_the_ack_and_shutdown_waits() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .after_ack(|env: Envelope| async move {
            assert_eq!(env.payload(), "ok".as_bytes());
            FOLLOW_HOOK_RUNS.fetch_add(1, Ordering::SeqCst);
            FOLLOW_ACKED.notify_one();
        })
        .subscriber(follow)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("follow.jobs", Message::new("fail"), None)
        .await
        .unwrap();
    broker
        .publish_message("follow.jobs", Message::new("ok"), None)
        .await
        .unwrap();
    within(5, "the after-ack hook", FOLLOW_ACKED.notified()).await;
    let shutdown = tokio::spawn(running.shutdown());
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    assert!(
        !shutdown.is_finished(),
        "shutdown waits for the continuation"
    );
    FOLLOW_RELEASE.notify_one();
    within(10, "shutdown", shutdown).await.unwrap().unwrap();
    assert_eq!(FOLLOW_RUNS.load(Ordering::SeqCst), 1);
    assert_eq!(
        FOLLOW_HOOK_RUNS.load(Ordering::SeqCst),
        1,
        "acked deliveries only"
    );
    assert_eq!(
        FOLLOW_FAILED_RUNS.load(Ordering::SeqCst),
        0,
        "never after a failure"
    );
}

static NEVER_STARTED: Notify = Notify::const_new();

#[subscriber("never.jobs")]
async fn never_ending_follow_up(_job: String, ctx: Ctx) {
    ctx.and_after(pending::<()>());
    NEVER_STARTED.notify_one();
}

#[tokio::test(start_paused = true)]
async fn rt10_timeout_bounds_the_wait_for_a_task_that_never_ends() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .shutdown_timeout(Duration::from_secs(3))
        .subscriber(never_ending_follow_up)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("never.jobs", Message::new("x"), None)
        .await
        .unwrap();
    NEVER_STARTED.notified().await;
    let start = tokio::time::Instant::now();
    running.shutdown().await.unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(3),
        "returned at the timeout"
    );
}

// RT-8: the after-ack hook sees every acked delivery, also one its handler
// never ran for (an accept layer's skip).

static SKIP_HANDLED: AtomicU32 = AtomicU32::new(0);

#[subscriber("skip.jobs")]
async fn skip_jobs(_job: String) {
    SKIP_HANDLED.fetch_add(1, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt8_the_after_ack_hook_sees_a_delivery_a_layer_skipped() {
    let broker = MemoryBroker::new();
    let (tx, mut acked) = tokio::sync::mpsc::unbounded_channel();
    let running = App::new()
        .broker(broker.clone())
        .layer(|env: &Envelope| match env.payload().as_ref() {
            b"duplicate" => ruststream::Verdict::Skip,
            _ => ruststream::Verdict::Accept,
        })
        .after_ack(move |env: Envelope| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(String::from_utf8(env.payload().to_vec()).unwrap());
            }
        })
        .subscriber(skip_jobs)
        .start()
        .await
        .unwrap();
    for job in ["duplicate", "new"] {
        broker
            .publish_message("skip.jobs", Message::new(job), None)
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(
            within(5, "an after-ack hook run", acked.recv())
                .await
                .unwrap(),
        );
    }
    // Each hook run is a task of its own: they may finish in any order.
    seen.sort();
    assert_eq!(seen, ["duplicate", "new"]);
    assert_eq!(
        SKIP_HANDLED.load(Ordering::SeqCst),
        1,
        "the handler saw only the new one"
    );
    running.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// RT-10: an aborted handler's delivery is never acked and is redelivered.

static STUCK_STARTED: Notify = Notify::const_new();

#[subscriber("stuck.jobs", queue_group = "g")]
async fn stuck(_job: String) {
    STUCK_STARTED.notify_one();
    pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt10_aborted_handler_leaves_its_delivery_unsettled_for_the_next_consumer() {
    let server = MemoryBroker::new();
    // The app has its own connection: closing it leaves the other consumer.
    let running = App::new()
        .broker(server.connect())
        .shutdown_timeout(Duration::from_millis(200))
        .subscriber(stuck)
        .start()
        .await
        .unwrap();
    server
        .publish_message("stuck.jobs", Message::new("job-1"), None)
        .await
        .unwrap();
    within(5, "the stuck handler", STUCK_STARTED.notified()).await;
    let mut next_consumer = server
        .subscribe(SubscribeOptions::new("stuck.jobs").queue_group("g"))
        .await
        .unwrap();
    within(10, "shutdown at the timeout", running.shutdown())
        .await
        .unwrap();
    let again = within(5, "the redelivery", next_consumer.next())
        .await
        .unwrap();
    assert_eq!(again.envelope().payload(), "job-1".as_bytes());
    assert_eq!(
        again.envelope().attempt(),
        2,
        "never acked: delivered again"
    );
    again.ack().await.unwrap();
}

// RT-10: past the timeout nothing queued starts, and a handler stuck in
// blocking code does not hold the shutdown.

static QUEUED_STARTED: AtomicU32 = AtomicU32::new(0);
static QUEUED_FIRST: Notify = Notify::const_new();

#[subscriber("queued.jobs", queue_group = "g", workers(1, by_key))]
async fn queued_jobs(job: String) {
    QUEUED_STARTED.fetch_add(1, Ordering::SeqCst);
    if job == "0" {
        QUEUED_FIRST.notify_one();
        pending::<()>().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt10_nothing_queued_starts_after_the_timeout_and_all_of_it_comes_back() {
    let server = MemoryBroker::new();
    let running = App::new()
        .broker(server.connect())
        .shutdown_timeout(Duration::from_millis(200))
        .subscriber(queued_jobs)
        .start()
        .await
        .unwrap();
    // One worker: "0" blocks it, the other seven wait in their keys' FIFOs.
    for i in 0..8 {
        let job = format!("{i}");
        server
            .publish_message("queued.jobs", Message::new(job.clone()).with_key(job), None)
            .await
            .unwrap();
    }
    within(5, "the first handler", QUEUED_FIRST.notified()).await;
    let mut next_consumer = server
        .subscribe(SubscribeOptions::new("queued.jobs").queue_group("g"))
        .await
        .unwrap();
    within(5, "shutdown at the timeout", running.shutdown())
        .await
        .unwrap();
    assert_eq!(
        QUEUED_STARTED.load(Ordering::SeqCst),
        1,
        "nothing queued started after the timeout"
    );
    let mut again = Vec::new();
    for _ in 0..8 {
        let d = within(5, "a redelivery", next_consumer.next())
            .await
            .unwrap();
        again.push(String::from_utf8(d.envelope().payload().to_vec()).unwrap());
        d.ack().await.unwrap();
    }
    again.sort();
    assert_eq!(
        again,
        ["0", "1", "2", "3", "4", "5", "6", "7"],
        "none acked"
    );
}

static BLOCKING_STARTED: Notify = Notify::const_new();

#[subscriber("blocking.jobs", threads(1))]
async fn blocking_job(_job: String) {
    BLOCKING_STARTED.notify_one();
    // A blocking call nothing can interrupt.
    std::thread::sleep(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt10_a_handler_stuck_in_blocking_code_does_not_hold_the_shutdown() {
    let server = MemoryBroker::new();
    let running = App::new()
        .broker(server.clone())
        .shutdown_timeout(Duration::from_millis(200))
        .subscriber(blocking_job)
        .start()
        .await
        .unwrap();
    server
        .publish_message("blocking.jobs", Message::new("job"), None)
        .await
        .unwrap();
    within(5, "the blocking handler", BLOCKING_STARTED.notified()).await;
    // Bounded by the timeout and a short grace, not by the 30 s sleep.
    within(5, "shutdown at the timeout", running.shutdown())
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------
// RT-8 / RT-10: retry_after republishes, and is not lost at shutdown.

static RETRY_SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static RETRY_ARMED: Notify = Notify::const_new();

#[subscriber("retry.jobs", max_attempts = 5)]
async fn retry_later(_job: String, ctx: Ctx) {
    RETRY_SEEN.lock().unwrap().push(ctx.attempt());
    ctx.retry_after(Duration::from_secs(3600));
    RETRY_ARMED.notify_one();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt10_a_pending_retry_after_is_published_at_shutdown_not_lost() {
    let server = MemoryBroker::new();
    let running = App::new()
        .broker(server.connect())
        .subscriber(retry_later)
        .start()
        .await
        .unwrap();
    server
        .publish_message("retry.jobs", Message::new("job"), None)
        .await
        .unwrap();
    within(5, "the handler to ask for a retry", RETRY_ARMED.notified()).await;
    let mut after = server
        .subscribe(SubscribeOptions::new("retry.jobs"))
        .await
        .unwrap();
    // An hour-long timer does not hold the shutdown, and is not dropped.
    within(10, "shutdown", running.shutdown()).await.unwrap();
    let retried = within(5, "the republished retry", after.next())
        .await
        .unwrap();
    let env = retried.envelope();
    assert_eq!(env.payload(), "job".as_bytes());
    assert_eq!(env.headers().get(header::RETRIES), Some("1"));
    let remaining: u64 = env
        .headers()
        .get(header::RETRY_DELAY_MS)
        .expect("remaining delay carried")
        .parse()
        .unwrap();
    assert!(
        remaining > 3_000_000,
        "most of the hour is left: {remaining}"
    );
    assert_eq!(*RETRY_SEEN.lock().unwrap(), [1]);
}

static QUICK_SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

#[subscriber("quick.jobs", max_attempts = 3, dead_letter = "quick.dlq")]
async fn retry_quickly(_job: String, ctx: Ctx) {
    QUICK_SEEN.lock().unwrap().push(ctx.attempt());
    ctx.retry_after(Duration::from_millis(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt8_retry_after_republishes_until_max_attempts_then_dead_letters() {
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("quick.dlq"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(retry_quickly)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("quick.jobs", Message::new("job"), None)
        .await
        .unwrap();
    let dead = within(10, "dead letter after the retry budget", dlq.next())
        .await
        .unwrap();
    assert_eq!(dead.envelope().payload(), "job".as_bytes());
    assert_eq!(
        dead.envelope().headers().get(header::ATTEMPT),
        Some("3"),
        "the dead-letter copy names the attempt it was given up at, retries counted"
    );
    running.shutdown().await.unwrap();
    assert_eq!(*QUICK_SEEN.lock().unwrap(), [1, 2, 3]);
}

static MIXED_SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Odd attempts fail (a nack: redelivered), even ones ask for a retry.
#[subscriber("mixed.jobs", max_attempts = 4, dead_letter = "mixed.dlq")]
async fn fail_then_retry(_job: String, ctx: Ctx) -> Result<(), HandlerError> {
    MIXED_SEEN.lock().unwrap().push(ctx.attempt());
    if ctx.attempt() % 2 == 1 {
        return Err(HandlerError::retry(std::io::Error::other("flaky")));
    }
    ctx.retry_after(Duration::from_millis(1));
    Ok(())
}

/// RT-8: a retry counts every attempt made before it, redeliveries
/// included, so attempts never go down and `max_attempts` bounds the total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt8_attempts_never_go_down_across_nacks_and_retries() {
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("mixed.dlq"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(fail_then_retry)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("mixed.jobs", Message::new("job"), None)
        .await
        .unwrap();
    within(10, "dead letter after max_attempts", dlq.next())
        .await
        .unwrap();
    running.shutdown().await.unwrap();
    assert_eq!(*MIXED_SEEN.lock().unwrap(), [1, 2, 3, 4]);
}

// ---------------------------------------------------------------------------
// Hooks and triggers.

#[tokio::test]
async fn a_failing_on_startup_hook_makes_run_return_the_error() {
    static OPENED: AtomicU32 = AtomicU32::new(0);
    #[subscriber("startup.jobs")]
    async fn job(_b: Bytes) {
        OPENED.fetch_add(1, Ordering::SeqCst);
    }
    let err = App::new()
        .broker(MemoryBroker::new())
        .on_startup(|_| async { Err("database unreachable".into()) })
        .subscriber(job)
        .run()
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::App(_)), "{err:?}");
    assert!(err.to_string().contains("database unreachable"), "{err}");
}

static POISON_SEEN: AtomicU32 = AtomicU32::new(0);

#[subscriber("failfast.jobs", fail_fast, max_attempts = 1)]
async fn poison(_job: String) -> Result<(), HandlerError> {
    POISON_SEEN.fetch_add(1, Ordering::SeqCst);
    Err(HandlerError::retry(std::io::Error::other("cannot go on")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_fast_subscriber_shuts_the_app_down() {
    let broker = MemoryBroker::new();
    let started = Arc::new(Notify::new());
    let app = App::new()
        .broker(broker.clone())
        .subscriber(poison)
        .after_startup({
            let started = Arc::clone(&started);
            move |_| async move {
                started.notify_one();
                Ok(())
            }
        });
    let run = tokio::spawn(app.run());
    // `run` has subscribed once its after-startup hook runs.
    within(10, "the app to start", started.notified()).await;
    broker
        .publish_message("failfast.jobs", Message::new("poison"), None)
        .await
        .unwrap();
    within(10, "run to return after fail-fast", run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn shared_state_reaches_handlers_and_hooks() {
    struct Prefix {
        text: &'static str,
    }
    #[subscriber("state.jobs")]
    async fn prefixed(job: String, prefix: State<Prefix>) -> String {
        format!("{}{job}", prefix.text)
    }
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .state(Prefix { text: "job:" })
        .after_startup(|app| async move {
            assert_eq!(app.state::<Prefix>().unwrap().text, "job:");
            Ok(())
        })
        .subscriber(prefixed)
        .start()
        .await
        .unwrap();
    let reply = broker
        .request_message("state.jobs", Message::new("42"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply.payload(), "job:42".as_bytes());
    running.shutdown().await.unwrap();
}
