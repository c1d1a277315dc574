//! Request/reply lanes on the memory Core (JQ-6, JQ-24 items 6, 19, 20):
//! two-lane replies complete their callers on a dedicated lane whatever the
//! ordinary ingress does; single-lane replies share the requester's receive
//! FIFO, wait behind earlier data, HWM and pause, and complete without a
//! permit once they reach the head.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{frame, queue, until, within};
use ruststream::binding::memory::CoreHwm;
use ruststream::extract::ReplyTo;
use ruststream::ingress::JobQueueSettings;
use ruststream::prelude::*;
use ruststream::{Error, SubscribeOptions};
use tokio::sync::Notify;

/// The text of a delivery's payload.
fn text(delivery: &impl Delivery) -> String {
    String::from_utf8(delivery.envelope().payload().to_vec()).unwrap()
}

// ---------------------------------------------------------------- item 6

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_6_single_lane_reply_waits_behind_earlier_data_then_bypasses_the_permit() {
    let server = MemoryBroker::new();
    let mut service = server
        .subscribe(SubscribeOptions::new("svc6"))
        .await
        .unwrap();
    let client = server.connect();
    let mut inbox = client
        .subscribe(SubscribeOptions::new("client6.data"))
        .await
        .unwrap();
    let requester = inbox.requester();
    // One peer sends the client one-way data, then the reply: one FIFO.
    let peer = server.connect();
    peer.publish_message("client6.data", Message::new("d1"), None)
        .await
        .unwrap();
    let call = tokio::spawn(async move {
        requester
            .request_message("svc6", Message::new("ping"), Duration::from_secs(10))
            .await
    });
    let request = within(5, "the request", service.next()).await.unwrap();
    let reply_to = request.envelope().reply_to().unwrap().clone();
    peer.publish_message(&reply_to, Message::new("pong"), None)
        .await
        .expect("the reply is admitted behind d1");
    request.ack().await.unwrap();

    // The reply sits in the Core FIFO behind d1: it skips neither.
    assert_eq!(queue(&server, "client6.data").queued, 2);
    assert!(!call.is_finished(), "the reply has not reached the head");

    // d1 leaves through the ordinary receive path (where an app takes a
    // permit first) …
    let d1 = within(5, "d1", inbox.next()).await.unwrap();
    assert_eq!(text(&d1), "d1");
    // … and the reply, now at the head, completes its caller by itself: no
    // further receive, no permit, never a delivery.
    let reply = within(5, "the reply", call).await.unwrap().unwrap();
    assert_eq!(reply.payload(), "pong".as_bytes());
    assert_eq!(queue(&server, "client6.data").queued, 0);
    d1.ack().await.unwrap();
}

// ---------------------------------------------------------------- item 20

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_20_single_lane_reply_delayed_by_hwm_never_makes_a_second_result() {
    // The client's lane for one peer holds two data frames.
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(2 * frame(2)))
        .build();
    let mut service = server
        .subscribe(SubscribeOptions::new("svc20"))
        .await
        .unwrap();
    let mut inbox = server
        .connect()
        .subscribe(SubscribeOptions::new("client20.data"))
        .await
        .unwrap();
    let requester = inbox.requester();
    let peer = server.connect();
    for data in ["d1", "d2"] {
        peer.publish_message("client20.data", Message::new(data), None)
            .await
            .unwrap();
    }
    let call = tokio::spawn(async move {
        requester
            .request_message("svc20", Message::new("ping"), Duration::from_millis(200))
            .await
    });
    let request = within(5, "the request", service.next()).await.unwrap();
    let reply_to = request.envelope().reply_to().unwrap().clone();
    // The reply waits for HWM space in the client's FIFO …
    let replier = tokio::spawn({
        let peer = peer.clone();
        async move {
            peer.publish_message(&reply_to, Message::new("late"), None)
                .await
        }
    });
    // … longer than the request's timeout: that is the caller's one result.
    let result = within(5, "the request's terminal result", call)
        .await
        .unwrap();
    assert!(matches!(result, Err(Error::Timeout(_))), "{result:?}");

    // Space frees: the reply is admitted behind d2, reaches the head after
    // it, finds no caller and is dropped — no second result, no delivery.
    for expected in ["d1", "d2"] {
        let data = within(5, "data", inbox.next()).await.unwrap();
        assert_eq!(text(&data), expected);
        data.ack().await.unwrap();
    }
    within(5, "the replier's publish", replier)
        .await
        .unwrap()
        .expect("admitted once space freed");
    until(5, "the late reply leaves the FIFO", || {
        queue(&server, "client20.data").queued == 0
    })
    .await;
    request.ack().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_20_single_lane_reply_delayed_by_pause_never_makes_a_second_result() {
    let server = MemoryBroker::new();
    let mut service = server
        .subscribe(SubscribeOptions::new("svc20p"))
        .await
        .unwrap();
    let inbox = server
        .connect()
        .subscribe(SubscribeOptions::new("client20p.data").receive_flow(true))
        .await
        .unwrap();
    let requester = inbox.requester();
    let flow = inbox.receive_flow().expect("a request/reply source");
    flow.set_paused(true);
    assert!(queue(&server, "client20p.data").receive_paused);

    let call = tokio::spawn(async move {
        requester
            .request_message("svc20p", Message::new("ping"), Duration::from_millis(200))
            .await
    });
    let request = within(5, "the request", service.next()).await.unwrap();
    let reply_to = request.envelope().reply_to().unwrap().clone();
    let replier = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .publish_message(&reply_to, Message::new("late"), None)
                .await
        }
    });
    let result = within(5, "the request's terminal result", call)
        .await
        .unwrap();
    assert!(matches!(result, Err(Error::Timeout(_))), "{result:?}");
    assert!(
        !replier.is_finished(),
        "the paused FIFO holds the reply back"
    );

    // RUNNING lifts the pause: the reply lands at the head and is dropped.
    flow.set_paused(false);
    within(5, "the replier's publish", replier)
        .await
        .unwrap()
        .expect("admitted once resumed");
    assert_eq!(queue(&server, "client20p.data").queued, 0);
    request.ack().await.unwrap();
    drop(inbox);
}

// ---------------------------------------------------------------- item 19

static RR_FIRST: AtomicU32 = AtomicU32::new(0);
static RR_RESULT: Mutex<Option<(usize, usize)>> = Mutex::new(None);
static RR_DONE: Notify = Notify::const_new();
const RR_TRIPS: usize = 1_000;

#[subscriber("rr19.svc", queue_group = "echo")]
async fn rr_echo(n: u64) -> u64 {
    n
}

#[subscriber("rr19.in", workers(1, by_key))]
async fn rr_caller(_b: Bytes, ctx: Ctx) {
    if RR_FIRST.fetch_add(1, Ordering::SeqCst) > 0 {
        return;
    }
    let out = ctx.publisher::<MemoryBroker>().expect("registered");
    let mut ok = 0;
    for n in 0..RR_TRIPS as u64 {
        let echoed: u64 = out
            .request("rr19.svc", &n, Duration::from_secs(10))
            .await
            .expect("round trip");
        if echoed == n {
            ok += 1;
        }
    }
    let broker = out.broker().clone();
    let still_waiting = queue(&broker, "rr19.in").queued;
    *RR_RESULT.lock().unwrap() = Some((ok, still_waiting));
    RR_DONE.notify_one();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_19_two_lane_completions_progress_while_ordinary_permits_are_saturated() {
    let broker = MemoryBroker::new();
    let service = App::new()
        .broker(broker.clone())
        .subscriber(rr_echo)
        .start()
        .await
        .unwrap();
    let caller = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(2))
        .subscriber(rr_caller)
        .start()
        .await
        .unwrap();
    for i in 0..4 {
        broker
            .publish_message("rr19.in", Message::new(format!("{i}")), None)
            .await
            .unwrap();
    }
    within(60, "1,000 round trips", RR_DONE.notified()).await;
    let (ok, still_waiting) = RR_RESULT.lock().unwrap().unwrap();
    assert_eq!(ok, RR_TRIPS);
    assert_eq!(
        still_waiting, 1,
        "ordinary ingress stayed saturated the whole time"
    );
    caller.shutdown().await.unwrap();
    service.shutdown().await.unwrap();
}

// ------------------------------------------- replies handed straight over

/// Answers through its request's reply subject itself, then returns
/// another answer.
#[subscriber("direct.manual")]
async fn answers_itself(n: u64, reply_to: ReplyTo, ctx: Ctx) -> Result<u64, HandlerError> {
    ctx.publish(reply_to.0.as_str(), &(n * 10)).await?;
    Ok(n)
}

#[subscriber("direct.plain")]
async fn doubles(n: u64) -> u64 {
    n * 2
}

/// A two-lane request's reply goes straight to its caller, and its reply
/// subject still works for whoever reads it: a handler that answers there
/// itself is heard first, and what it returns after is a late reply,
/// dropped (first terminal wins). The caller of the next request, which
/// takes over the same inbox slot, gets its own answer, not the stale one.
#[tokio::test]
async fn a_reply_subject_read_by_the_handler_answers_first_and_the_return_value_is_late() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(answers_itself)
        .subscriber(doubles)
        .start()
        .await
        .unwrap();
    let manual: u64 = within(
        5,
        "the handler's own answer",
        Publisher::new(broker.clone()).request("direct.manual", &4u64, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(
        manual, 40,
        "the answer sent to the reply subject came first"
    );
    for n in 1..=3u64 {
        let reply = within(
            5,
            "a plain reply",
            broker.request_message(
                "direct.plain",
                Message::new(n.to_string()),
                Duration::from_secs(5),
            ),
        )
        .await
        .unwrap();
        assert_eq!(reply.payload(), (n * 2).to_string().as_bytes());
        assert_eq!(
            reply.headers().get("content-type"),
            Some("application/json")
        );
        assert!(
            reply.subject().starts_with("_INBOX."),
            "a reply names its inbox: {}",
            reply.subject()
        );
    }
    running.shutdown().await.unwrap();
}
