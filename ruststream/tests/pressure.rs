//! Job-queue pressure and limits seen from the public surface (JQ-24 items 1,
//! 5, 13, 21; item 16 is in `structural_limit.rs`): profiles, the shared-cap wait that replies bypass, the
//! receive-flow switch of request/reply sources, structural rejects, and no
//! read-ahead or hidden resend anywhere.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{Gate, queue, until, within};
use ruststream::binding::memory::{CoreHwm, CoreHwmProfile};
use ruststream::binding::reply_result;
use ruststream::ingress::{JobQueue, JobQueueProfile, JobQueueSettings, PressureState};
use ruststream::prelude::*;
use ruststream::{Error, SubscribeOptions};
use tokio::sync::Notify;
use tokio::time::Instant;

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_millis(50))
}

// ---------------------------------------------------------------- item 1

#[subscriber("p1.noop")]
async fn p1_noop(_b: Bytes) {}

#[tokio::test]
async fn jq24_1_core_and_job_queue_profiles_are_separate_and_default_to_balanced() {
    assert_eq!(CoreHwm::default().get_profile(), CoreHwmProfile::Balanced);
    assert_eq!(
        JobQueueSettings::default().get_profile(),
        JobQueueProfile::Balanced
    );
    let defaults = App::new()
        .broker(MemoryBroker::new())
        .subscriber(p1_noop)
        .start()
        .await
        .unwrap();
    assert_eq!(defaults.pressure().max, 1024, "Balanced job queue");
    defaults.shutdown().await.unwrap();

    // A Small Core (1 MiB per lane) under a Large job queue (8,192 permits):
    // each limit is the one it was set to.
    let broker = MemoryBroker::builder()
        .hwm(CoreHwm::profile(CoreHwmProfile::Small))
        .build();
    let _parked = broker
        .subscribe(SubscribeOptions::new("p1.parked"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::profile(JobQueueProfile::Large))
        .subscriber(p1_noop)
        .start()
        .await
        .unwrap();
    assert_eq!(running.pressure().max, 8192);
    let big = || Message::new(vec![0u8; 600 * 1024]);
    broker
        .publish_message("p1.parked", big(), soon())
        .await
        .unwrap();
    let second = broker.publish_message("p1.parked", big(), soon()).await;
    assert!(
        matches!(second, Err(Error::DeadlineExceeded(_))),
        "the Small Core HWM refuses a second 600 KiB frame: {second:?}"
    );
    running.shutdown().await.unwrap();
}

// ---------------------------------------------------------------- item 5

static P5_SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
static P5_ANSWERED: Notify = Notify::const_new();
static P5_FIRST: AtomicU32 = AtomicU32::new(0);

#[subscriber("p5.in", workers(1, by_key))]
async fn p5_asks(_b: Bytes, broker: State<MemoryBroker>) {
    if P5_FIRST.fetch_add(1, Ordering::SeqCst) > 0 {
        return;
    }
    let ok = broker
        .request_message("p5.svc", Message::new("ping"), Duration::from_secs(10))
        .await
        .and_then(reply_result);
    let failed = broker
        .request_message("p5.svc", Message::new("fail"), Duration::from_secs(10))
        .await
        .and_then(reply_result);
    // What the ordinary ingress looked like when the completions arrived.
    let waiting = queue(&broker, "p5.in").queued;
    let mut seen = P5_SEEN.lock().unwrap();
    seen.push(format!("{:?}", ok.map(|r| r.payload().clone())));
    seen.push(format!("{}", matches!(failed, Err(Error::Handler(_)))));
    seen.push(format!("queued={waiting}"));
    P5_ANSWERED.notify_one();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_5_saturated_ingress_waits_while_replies_and_error_completions_progress() {
    let broker = MemoryBroker::new();
    let mut service = broker
        .subscribe(SubscribeOptions::new("p5.svc"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .state(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(2))
        .subscriber(p5_asks)
        .start()
        .await
        .unwrap();
    for i in 0..4 {
        broker
            .publish_message("p5.in", Message::new(format!("{i}")), None)
            .await
            .unwrap();
    }
    // The first handler waits for the service; two records hold both
    // permits; the loop waits for a third, with record 4 still in the broker.
    until(5, "all permits reserved and the loop waiting", || {
        let p = running.pressure();
        p.in_use == 2 && p.waiters == 1
    })
    .await;
    assert_eq!(queue(&broker, "p5.in").queued, 1);

    // The replies (one success, one error completion) reach the handler
    // through the saturated app: completion supply takes no permit (JQ-6).
    for _ in 0..2 {
        let request = within(5, "the handler's request", service.next())
            .await
            .unwrap();
        let env = request.envelope();
        let reply = if env.payload() == "ping" {
            Message::new("pong")
        } else {
            Message::new("")
                .with_header(ruststream::header::STATUS, "handler-error")
                .with_header(ruststream::header::ERROR, "service refused")
        };
        broker
            .publish_message(env.reply_to().unwrap(), reply, None)
            .await
            .unwrap();
        request.ack().await.unwrap();
    }
    within(
        5,
        "the handler got both completions",
        P5_ANSWERED.notified(),
    )
    .await;
    assert_eq!(
        *P5_SEEN.lock().unwrap(),
        vec![
            format!("{:?}", Ok::<Bytes, Error>(Bytes::from("pong"))),
            "true".to_owned(),
            "queued=1".to_owned(),
        ],
        "both completions arrived while ordinary ingress still waited"
    );
    // The wait for a permit is cancellable: shutdown ends it at once.
    within(5, "shutdown", running.shutdown()).await.unwrap();
}

// ---------------------------------------------------------------- item 13

static P13_GATE: Gate = Gate::new();
static P13_DONE: AtomicU32 = AtomicU32::new(0);
static P13_ALL: Notify = Notify::const_new();
const P13_N: u32 = 7;

#[subscriber("p13.rr", queue_group = "svc", workers(1, by_key))]
async fn p13_service(_b: Bytes) {
    P13_GATE.pass().await;
    if P13_DONE.fetch_add(1, Ordering::SeqCst) + 1 == P13_N {
        P13_ALL.notify_one();
    }
}

#[subscriber("p13.fan")]
async fn p13_fanout(_b: Bytes) {}

#[subscriber("p13.work", queue_group = "w", receive_flow = false)]
async fn p13_worker(_b: Bytes) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_13_receive_flow_is_applied_to_request_reply_sources_only() {
    let broker = MemoryBroker::new();
    // pause at ceil(6 × 0.8) = 5 permits, resume at floor(6 × 0.6) = 3.
    let running = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(6))
        .subscriber(p13_service)
        .subscriber(p13_fanout)
        .subscriber(p13_worker)
        .start()
        .await
        .unwrap();
    assert!(!queue(&broker, "p13.rr").receive_paused);
    // From a task of its own: once the loop holds 5 permits the queue is
    // paused, and a publish still to come waits for the resume below (the
    // loop may take records as fast as they come in).
    let publisher = {
        let broker = broker.clone();
        tokio::spawn(async move {
            for i in 0..P13_N {
                broker
                    .publish_message("p13.rr", Message::new(format!("{i}")), None)
                    .await
                    .unwrap();
            }
        })
    };
    until(5, "pressure PAUSED", || {
        running.pressure().state == PressureState::Paused
    })
    .await;

    // The queue-group service is paused: a publish waits although its lane
    // has room, and fails at its deadline. Fan-out and opted-out sources are
    // not paused.
    assert!(queue(&broker, "p13.rr").receive_paused);
    assert!(!queue(&broker, "p13.fan").receive_paused);
    assert!(!queue(&broker, "p13.work").receive_paused);
    let held = broker
        .publish_message("p13.rr", Message::new("late"), soon())
        .await;
    assert!(matches!(held, Err(Error::DeadlineExceeded(_))), "{held:?}");
    broker
        .publish_message("p13.fan", Message::new("x"), soon())
        .await
        .expect("pub/sub is never paused");
    broker
        .publish_message("p13.work", Message::new("x"), soon())
        .await
        .expect("an opted-out worker queue is never paused");

    // Resume lifts only the pause.
    P13_GATE.open();
    within(10, "every service record published", publisher)
        .await
        .unwrap();
    within(10, "every service record handled", P13_ALL.notified()).await;
    until(5, "pressure RUNNING", || {
        running.pressure().state == PressureState::Running
    })
    .await;
    assert!(!queue(&broker, "p13.rr").receive_paused);
    broker
        .publish_message("p13.rr", Message::new("after"), soon())
        .await
        .expect("resumed");
    let app = running.handle().clone();
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0, "no permit leaked");
}

// ---------------------------------------------------------------- item 21

static P21_GATE: Gate = Gate::new();
static P21_SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[subscriber("p21.in", workers(1, by_key))]
async fn p21_slow(b: Bytes) {
    P21_GATE.pass().await;
    P21_SEEN
        .lock()
        .unwrap()
        .push(String::from_utf8(b.to_vec()).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_21_no_retained_receive_and_no_hidden_resend() {
    // Room for exactly 12 frames of "nn" in the Core.
    let budget = 12 * common::frame(2);
    let broker = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(budget))
        .build();
    let running = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(3))
        .subscriber(p21_slow)
        .start()
        .await
        .unwrap();
    for i in 10..20 {
        broker
            .publish_message("p21.in", Message::new(format!("{i}")), None)
            .await
            .unwrap();
    }
    // No retained receive: the app holds one running record plus one per
    // permit; everything else stays in the broker, where HWM applies.
    until(5, "the loop waits for a permit", || {
        running.pressure().waiters == 1
    })
    .await;
    assert_eq!(queue(&broker, "p21.in").queued, 10 - 1 - 3);
    // Fill the Core to its HWM; one more publish fails at its deadline …
    let mut admitted = 10;
    while broker
        .publish_message("p21.in", Message::new(format!("{}", 10 + admitted)), soon())
        .await
        .is_ok()
    {
        admitted += 1;
    }
    let refused = format!("{}", 10 + admitted);
    // … and is never sent again by anyone: no separate send retry.
    P21_GATE.open();
    until(10, "every admitted record handled", || {
        P21_SEEN.lock().unwrap().len() == admitted
    })
    .await;
    assert_eq!(queue(&broker, "p21.in").queued, 0, "nothing left to resend");
    let app = running.handle().clone();
    running.shutdown().await.unwrap();
    let seen = P21_SEEN.lock().unwrap().clone();
    let expected: Vec<String> = (10..10 + admitted).map(|i| i.to_string()).collect();
    assert_eq!(seen, expected, "each admitted record once, in order");
    assert!(!seen.contains(&refused));
    assert_eq!(app.pressure().in_use, 0);
}

/// JQ-17: a request/reply source that subscribes while the job queue is
/// PAUSED joins paused — no publish gets in before the job queue registers
/// its switch — and resumes with everyone else. (The app subscribes its
/// sources this way: `start_paused` from the current state, then register.)
#[tokio::test]
async fn jq17_a_source_joining_a_paused_job_queue_is_never_live_before_it_gets_the_state() {
    let broker = MemoryBroker::new();
    // Pause at ceil(2 × 0.8) = 2 permits in use, resume at floor(2 × 0.6) = 1.
    let jobs = JobQueue::new(&JobQueueSettings::default().max_queued_jobs(2)).unwrap();
    let held = [jobs.try_acquire().unwrap(), jobs.try_acquire().unwrap()];
    assert_eq!(jobs.pressure().state, PressureState::Paused);

    let paused = jobs.pressure().state == PressureState::Paused;
    let options = SubscribeOptions::new("p17")
        .queue_group("svc")
        .receive_flow(true)
        .start_paused(paused);
    let source = broker.subscribe(options).await.unwrap();
    assert!(queue(&broker, "p17").receive_paused, "paused as it joins");
    let early = broker
        .publish_message("p17", Message::new("early"), soon())
        .await;
    assert!(
        matches!(early, Err(Error::DeadlineExceeded(_))),
        "{early:?}"
    );
    assert_eq!(queue(&broker, "p17").queued, 0);

    let _registration = jobs.register(source.receive_flow().expect("a switch"));
    assert!(queue(&broker, "p17").receive_paused, "still paused");
    drop(held);
    assert_eq!(jobs.pressure().state, PressureState::Running);
    assert!(
        !queue(&broker, "p17").receive_paused,
        "resumed with the job queue"
    );
    broker
        .publish_message("p17", Message::new("after"), soon())
        .await
        .expect("resumed");
}
