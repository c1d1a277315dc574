//! The send side (JQ-18 … JQ-20, JQ-24 items 4 and 14): a refused send
//! changes nothing, a waiting send holds no execution slot and no permit,
//! a request does not wait for queue space, and oversized messages are
//! refused before decode.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{Gate, counter, frame, install_metrics, queue, until, within};
use ruststream::binding::memory::CoreHwm;
use ruststream::prelude::*;
use ruststream::{Error, SubscribeOptions, header, metrics};
use tokio::sync::Notify;
use tokio::time::Instant;

fn soon() -> Instant {
    Instant::now() + Duration::from_millis(30)
}

// ---------------------------------------------------------------- item 4

#[tokio::test]
async fn jq24_4_a_refused_send_or_request_leaves_count_bytes_and_sequence_unchanged() {
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(3 * frame(1)))
        .build();
    let mut sub = server
        .subscribe(SubscribeOptions::new("seq4"))
        .await
        .unwrap();
    let out = Publisher::new(server.clone());
    for seq in 0..3 {
        out.send("seq4", Message::new(format!("{seq}")))
            .await
            .unwrap();
    }
    let before = queue(&server, "seq4");

    let refused = out.send_until("seq4", Message::new("3"), soon()).await;
    assert!(
        matches!(refused, Err(Error::DeadlineExceeded(_))),
        "{refused:?}"
    );
    let request = server
        .request_message("seq4", Message::new("4"), Duration::from_millis(30))
        .await;
    assert!(
        matches!(request, Err(Error::DeadlineExceeded(_))),
        "a request refused admission fails: {request:?}"
    );
    assert_eq!(queue(&server, "seq4"), before, "count and bytes unchanged");

    // The sequence goes on from where it was: no phantom entry, no gap.
    let mut seen = Vec::new();
    let mut take = async || {
        let d = within(5, "a queued frame", sub.next()).await.unwrap();
        let text = String::from_utf8(d.envelope().payload().to_vec()).unwrap();
        d.ack().await.unwrap();
        text
    };
    seen.push(take().await);
    out.send("seq4", Message::new("5")).await.unwrap();
    for _ in 0..3 {
        seen.push(take().await);
    }
    assert_eq!(seen, ["0", "1", "2", "5"]);
    assert_eq!(queue(&server, "seq4").queued, 0);
}

// ---------------------------------------------------------------- JQ-19

#[tokio::test]
async fn jq19_a_request_does_not_wait_for_queue_space() {
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(frame(1)))
        .build();
    let long = Duration::from_secs(60);
    let request = |subject: &'static str| {
        let server = server.clone();
        async move {
            server
                .request_message(subject, Message::new("?"), long)
                .await
        }
    };

    // A full queue: the request fails at once, long before its timeout.
    let mut full = server
        .subscribe(SubscribeOptions::new("q19.full"))
        .await
        .unwrap();
    server
        .publish_message("q19.full", Message::new("x"), None)
        .await
        .unwrap();
    let refused = within(5, "a request to a full queue", request("q19.full")).await;
    assert!(
        matches!(refused, Err(Error::DeadlineExceeded(_))),
        "{refused:?}"
    );
    assert_eq!(queue(&server, "q19.full").queued, 1, "nothing was added");

    // A paused queue (a request/reply source under pressure): the same.
    let paused = server
        .subscribe(
            SubscribeOptions::new("q19.paused")
                .queue_group("g")
                .receive_flow(true),
        )
        .await
        .unwrap();
    let flow = paused.receive_flow().expect("a request/reply source");
    flow.set_paused(true);
    let refused = within(5, "a request to a paused queue", request("q19.paused")).await;
    assert!(
        matches!(refused, Err(Error::DeadlineExceeded(_))),
        "{refused:?}"
    );
    assert_eq!(queue(&server, "q19.paused").queued, 0);

    // A publish to the same full queue still waits for space (three
    // stages): it goes through once the queue drains.
    let waiting = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .publish_message("q19.full", Message::new("y"), None)
                .await
        }
    });
    let first = within(5, "the queued frame", full.next()).await.unwrap();
    first.ack().await.unwrap();
    within(5, "the waiting publish", waiting)
        .await
        .unwrap()
        .unwrap();

    // Fan-out: one subscription full, the other with room. The request
    // stands where it was taken, and its reply comes back from there.
    let mut open = server
        .subscribe(SubscribeOptions::new("q19.full"))
        .await
        .unwrap();
    let caller = tokio::spawn(request("q19.full"));
    let taken = within(5, "the request at the queue with room", open.next())
        .await
        .unwrap();
    let reply_to = taken.envelope().reply_to().expect("a request").clone();
    server
        .publish_message(&reply_to, Message::new("!"), None)
        .await
        .unwrap();
    taken.ack().await.unwrap();
    let reply = within(5, "the reply", caller).await.unwrap().unwrap();
    assert_eq!(reply.payload(), "!".as_bytes());
    let mut queued: Vec<_> = server
        .queues()
        .into_iter()
        .filter(|q| q.subject.as_str() == "q19.full")
        .map(|q| q.queued)
        .collect();
    queued.sort();
    assert_eq!(queued, [0, 1], "the full queue took nothing more");
}

#[tokio::test]
async fn jq19_a_full_subscription_neither_holds_up_nor_fails_a_fan_out_publish() {
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(frame(1)))
        .build();
    let mut slow = server
        .subscribe(SubscribeOptions::new("f19"))
        .await
        .unwrap();
    server
        .publish_message("f19", Message::new("0"), None)
        .await
        .unwrap();
    // Subscribed after the first message: only `slow` is full.
    let mut quick = server
        .subscribe(SubscribeOptions::new("f19"))
        .await
        .unwrap();
    let publish = |text: &'static str, deadline: Instant| {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .publish_message("f19", Message::new(text), Some(deadline))
                .await
        })
    };

    // `quick` gets the message while the publish still waits for `slow`.
    let waiting = publish("1", Instant::now() + Duration::from_secs(60));
    let first = within(5, "the copy for the queue with room", quick.next())
        .await
        .unwrap();
    assert_eq!(first.envelope().payload(), "1".as_bytes());
    first.ack().await.unwrap();
    assert!(!waiting.is_finished(), "it still waits for the full queue");
    // `slow` makes room: its copy goes in, once, and the publish succeeds.
    let head = within(5, "slow's first message", slow.next())
        .await
        .unwrap();
    head.ack().await.unwrap();
    within(5, "the waiting publish", waiting)
        .await
        .unwrap()
        .unwrap();
    let late = within(5, "slow's copy", slow.next()).await.unwrap();
    assert_eq!(late.envelope().payload(), "1".as_bytes());

    // `slow` stays full past the deadline: `quick` has the message, so the
    // publish succeeded; `slow` misses it (observed, not the result).
    server
        .publish_message("f19", Message::new("2"), None)
        .await
        .unwrap();
    late.ack().await.unwrap();
    let copy = within(5, "quick's copy of 2", quick.next()).await.unwrap();
    copy.ack().await.unwrap();
    let result = within(5, "the publish", publish("3", soon()))
        .await
        .unwrap();
    assert!(result.is_ok(), "quick took it: {result:?}");
    let got = within(5, "quick's copy of 3", quick.next()).await.unwrap();
    assert_eq!(got.envelope().payload(), "3".as_bytes());
    got.ack().await.unwrap();
    let head = within(5, "slow's head", slow.next()).await.unwrap();
    assert_eq!(head.envelope().payload(), "2".as_bytes());
    head.ack().await.unwrap();
    assert!(slow.try_next().is_none(), "slow missed 3");

    // No queue takes it: the publish fails.
    drop(quick);
    server
        .publish_message("f19", Message::new("4"), None)
        .await
        .unwrap();
    let result = within(5, "the publish", publish("5", soon()))
        .await
        .unwrap();
    assert!(
        matches!(result, Err(Error::DeadlineExceeded(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn jq18_a_waiting_publish_ends_when_its_connection_closes() {
    // One waiter slot: a probe that finds it taken shows the publish waits.
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(frame(1)))
        .max_publish_waiters(1)
        .build();
    let mut sub = server
        .subscribe(SubscribeOptions::new("c18"))
        .await
        .unwrap();
    // The budget is per publishing connection: the client fills its own.
    let client = server.connect();
    client
        .publish_message("c18", Message::new("0"), None)
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            client
                .publish_message("c18", Message::new("1"), Some(deadline))
                .await
        }
    });
    // The current-thread runtime runs the publish until it waits.
    tokio::task::yield_now().await;
    let probe = client
        .publish_message("c18", Message::new("probe"), Some(Instant::now()))
        .await;
    assert!(
        matches!(probe, Err(Error::DeadlineExceeded(why)) if why.contains("waiter slot")),
        "the publish waits, holding the only waiter slot: {probe:?}"
    );
    assert!(!waiting.is_finished());
    client.close().await.unwrap();
    let result = within(5, "the waiting publish ends", waiting)
        .await
        .unwrap();
    assert!(matches!(result, Err(Error::Closed(_))), "{result:?}");
    // Room now: nothing of the closed connection comes in after its close.
    let first = within(5, "the queued frame", sub.next()).await.unwrap();
    assert_eq!(first.envelope().payload(), "0".as_bytes());
    first.ack().await.unwrap();
    server
        .publish_message("c18", Message::new("2"), None)
        .await
        .unwrap();
    let next = within(5, "the next frame", sub.next()).await.unwrap();
    assert_eq!(next.envelope().payload(), "2".as_bytes());
}

// ---------------------------------------------------------------- item 14

static S14_GATE: Gate = Gate::new();
static S14_FREE_DONE: Notify = Notify::const_new();
static S14_SENT: AtomicU32 = AtomicU32::new(0);

#[subscriber("s14.in", workers(2))]
async fn s14_handler(kind: String, ctx: Ctx) -> Result<(), HandlerError> {
    if kind == "block" {
        // The sink is full: this send waits for space …
        let out = ctx.publisher::<MemoryBroker>().expect("registered");
        out.send("s14.sink", Message::new("x")).await?;
        S14_SENT.fetch_add(1, Ordering::SeqCst);
    } else {
        // … while other deliveries keep running.
        S14_GATE.pass().await;
        S14_FREE_DONE.notify_one();
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_14_a_task_waiting_for_send_space_holds_no_execution_permission() {
    let broker = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(frame(1)))
        .build();
    let mut sink = broker
        .subscribe(SubscribeOptions::new("s14.sink"))
        .await
        .unwrap();
    broker
        .publish_message("s14.sink", Message::new("f"), None)
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(s14_handler)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("s14.in", Message::new("block"), None)
        .await
        .unwrap();
    until(5, "the blocked send waits for space", || {
        queue(&broker, "s14.in").queued == 0 && running.pressure().in_use == 0
    })
    .await;
    // The waiting send holds no job permit (none is in use: the idle loop
    // holds none either) and no worker: another delivery runs to completion.
    broker
        .publish_message("s14.in", Message::new("free"), None)
        .await
        .unwrap();
    S14_GATE.open();
    within(5, "the other delivery completes", S14_FREE_DONE.notified()).await;
    assert_eq!(
        S14_SENT.load(Ordering::SeqCst),
        0,
        "still waiting for space"
    );

    // Space frees: the waiting send lands, once.
    let first = within(5, "the sink's first frame", sink.next())
        .await
        .unwrap();
    first.ack().await.unwrap();
    let landed = within(5, "the waiting send", sink.next()).await.unwrap();
    assert_eq!(landed.envelope().payload(), "x".as_bytes());
    landed.ack().await.unwrap();
    until(5, "the blocked handler finishes", || {
        S14_SENT.load(Ordering::SeqCst) == 1
    })
    .await;
    running.shutdown().await.unwrap();
}

// ---------------------------------------------------------------- JQ-20

static BIG_CALLS: AtomicU32 = AtomicU32::new(0);

#[subscriber("big.in", max_message_size = 1024, dead_letter = "big.dlq")]
async fn small_only(body: Bytes) -> String {
    BIG_CALLS.fetch_add(1, Ordering::SeqCst);
    format!("{} bytes", body.len())
}

#[tokio::test]
async fn jq20_oversized_messages_are_refused_before_decode() {
    install_metrics();
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("big.dlq"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(small_only)
        .start()
        .await
        .unwrap();
    let client = Publisher::new(broker.clone());

    // Headers count: 1,000 bytes of payload plus a 30-byte header is over.
    let request = Message::new(vec![b'x'; 1000]).with_header("h", "v".repeat(29));
    let err = client
        .request_message("big.in", request, Duration::from_secs(5))
        .await
        .unwrap_err();
    match &err {
        Error::Protocol(reason) => assert!(reason.contains("max_message_size 1024"), "{reason}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    broker
        .publish_message("big.in", Message::new(vec![b'x'; 2000]), None)
        .await
        .unwrap();
    let dead = within(5, "the dead-lettered oversized message", dlq.next())
        .await
        .unwrap();
    let reason = dead.envelope().headers().get(header::ERROR).unwrap();
    assert!(reason.contains("exceeds max_message_size"), "{reason}");
    dead.ack().await.unwrap();

    // At the limit it passes.
    let ok = client
        .request_message(
            "big.in",
            Message::new(vec![b'x'; 1024]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(ok.payload(), "1024 bytes".as_bytes());
    running.shutdown().await.unwrap();
    assert_eq!(
        BIG_CALLS.load(Ordering::SeqCst),
        1,
        "only the one that fits"
    );
    assert_eq!(counter(metrics::OVERSIZED, "subject", "big.in"), 2);
}
