//! The memory Core binding on its own: fan-out, queue groups, byte HWM with
//! bounded waiting publishes (JQ-1, JQ-3, JQ-19), redelivery, dead-lettering
//! and request/reply.

mod common;

use std::future::Future;
use std::time::Duration;

use common::{frame, within};
use ruststream::binding::memory::CoreHwm;
use ruststream::{
    Broker, Delivery, Error, MemoryBroker, Message, Requester, SubscribeOptions, Subscription,
    header,
};
use tokio::time::Instant;

fn payload(n: usize) -> Message {
    Message::new(vec![b'x'; n])
}

/// Gives every other task on this current-thread runtime a chance to run
/// until it blocks. Deterministic: no timing is involved.
async fn settle_tasks() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn fan_out_gives_every_subscription_every_message_queue_group_shares_them() {
    let broker = MemoryBroker::new();
    let mut fan = Vec::new();
    for _ in 0..3 {
        fan.push(
            broker
                .subscribe(SubscribeOptions::new("events"))
                .await
                .unwrap(),
        );
    }
    let mut group_a = broker
        .subscribe(SubscribeOptions::new("events").queue_group("workers"))
        .await
        .unwrap();
    let mut group_b = broker
        .subscribe(SubscribeOptions::new("events").queue_group("workers"))
        .await
        .unwrap();

    for i in 0..10u8 {
        broker
            .publish_message("events", Message::new(vec![i]), None)
            .await
            .unwrap();
    }

    for sub in &mut fan {
        for i in 0..10u8 {
            let d = within(5, "fan-out delivery", sub.next()).await.unwrap();
            assert_eq!(d.envelope().payload()[0], i, "fan-out keeps publish order");
            d.ack().await.unwrap();
        }
    }
    // The group holds one copy of each message, whichever member takes it.
    let mut seen = Vec::new();
    for i in 0..10 {
        let sub = if i % 2 == 0 {
            &mut group_a
        } else {
            &mut group_b
        };
        let d = within(5, "group delivery", sub.next()).await.unwrap();
        seen.push(d.envelope().payload()[0]);
        d.ack().await.unwrap();
    }
    assert_eq!(seen, (0..10).collect::<Vec<u8>>());
    assert_eq!(
        broker.queued_bytes(),
        0,
        "nothing left anywhere: exactly 10 per group"
    );
}

#[tokio::test]
async fn publishes_follow_subscriptions_as_they_come_and_go() {
    // One thread publishing to one subject: the route it resolved is reused
    // until the subscriptions change, and never after.
    let broker = MemoryBroker::new();
    let publish = || broker.publish_message("routes", Message::new("m"), None);
    publish().await.unwrap();
    let mut first = broker
        .subscribe(SubscribeOptions::new("routes"))
        .await
        .unwrap();
    publish().await.unwrap();
    let mut second = broker
        .subscribe(SubscribeOptions::new("routes"))
        .await
        .unwrap();
    publish().await.unwrap();
    for _ in 0..2 {
        first.next().await.unwrap().ack().await.unwrap();
    }
    second.next().await.unwrap().ack().await.unwrap();
    assert_eq!(broker.queued_bytes(), 0, "first got 2, second 1");
    drop(first);
    // The route that held `first` is gone: no error, `second` still gets it.
    publish().await.unwrap();
    assert_eq!(broker.queued_bytes(), frame(1));
    second.next().await.unwrap().ack().await.unwrap();
    drop(second);
    publish().await.unwrap();
    assert_eq!(broker.queued_bytes(), 0, "no queue left to hold it");
}

#[tokio::test]
async fn a_waiter_woken_for_a_frame_it_never_takes_hands_the_wake_up_on() {
    let broker = MemoryBroker::new();
    let options = || SubscribeOptions::new("handoff").queue_group("g");
    let mut a = broker.subscribe(options()).await.unwrap();
    let mut b = broker.subscribe(options()).await.unwrap();
    // `a` waits first, so the frame's wake-up goes to it...
    let mut a_waits = Box::pin(a.next());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(a_waits.as_mut().poll(&mut cx).is_pending());
    let b_waits = tokio::spawn(async move { b.next().await.map(|d| d.envelope().clone()) });
    settle_tasks().await;
    broker
        .publish_message("handoff", Message::new("one"), None)
        .await
        .unwrap();
    // ...but its wait is dropped before it looks: `b` must get the frame.
    drop(a_waits);
    let got = within(5, "b to get the frame", b_waits).await.unwrap();
    assert_eq!(got.unwrap().payload(), "one".as_bytes());
}

#[tokio::test(start_paused = true)]
async fn jq24_18_full_hwm_pushes_backpressure_to_the_sender_and_drops_nothing() {
    // Two frames fit the budget, the third does not.
    let broker = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(frame(40) * 5 / 2))
        .build();
    let mut sub = broker.subscribe(SubscribeOptions::new("q")).await.unwrap();
    broker
        .publish_message("q", payload(40), None)
        .await
        .unwrap();
    broker
        .publish_message("q", payload(40), None)
        .await
        .unwrap();
    assert_eq!(broker.queued_bytes(), 2 * frame(40));

    let start = Instant::now();
    let deadline = start + Duration::from_millis(250);
    let err = broker
        .publish_message("q", payload(40), Some(deadline))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded(_)), "{err:?}");
    assert_eq!(
        Instant::now(),
        deadline,
        "it waited exactly until the deadline"
    );
    assert_eq!(
        broker.queued_bytes(),
        2 * frame(40),
        "the refused frame was not admitted"
    );

    // Nothing was dropped to make room: both frames are still there, in order.
    for _ in 0..2 {
        let d = sub.next().await.unwrap();
        assert_eq!(d.envelope().payload().len(), 40);
        d.ack().await.unwrap();
    }
    assert_eq!(broker.queued_bytes(), 0);
}

/// A full lane and one publish waiting for it, with `deadline`.
async fn full_lane_and_a_waiter(
    frames: usize,
    deadline: Duration,
) -> (
    MemoryBroker,
    ruststream::binding::memory::MemorySubscription,
    tokio::task::JoinHandle<ruststream::Result<()>>,
) {
    let broker = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(frames * frame(50)))
        .build();
    let sub = broker.subscribe(SubscribeOptions::new("q")).await.unwrap();
    for n in 0..frames {
        broker
            .publish_message("q", Message::new(vec![n as u8; 50]), None)
            .await
            .unwrap();
    }
    let waiting = tokio::spawn({
        let broker = broker.clone();
        async move {
            broker
                .publish_message(
                    "q",
                    Message::new(vec![frames as u8; 50]),
                    Some(Instant::now() + deadline),
                )
                .await
        }
    });
    settle_tasks().await;
    assert!(!waiting.is_finished(), "the publish waits for space");
    (broker, sub, waiting)
}

#[tokio::test(start_paused = true)]
async fn waiting_publish_lands_once_space_frees() {
    // Frames 0 and 1 fill the lane; frame 2 waits.
    let (broker, mut sub, waiting) = full_lane_and_a_waiter(2, Duration::from_secs(3600)).await;
    assert_eq!(broker.queued_bytes(), 2 * frame(50));

    let first = sub.next().await.unwrap(); // frees 50 bytes
    within(5, "the waiting publish", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.envelope().payload()[0], 0);
    first.ack().await.unwrap();
    for expected in [1u8, 2] {
        let d = sub.next().await.unwrap();
        assert_eq!(d.envelope().payload()[0], expected);
        d.ack().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_publish_is_woken_at_the_low_water_mark_not_per_freed_frame() {
    let (broker, mut sub, waiting) = full_lane_and_a_waiter(4, Duration::from_secs(3600)).await;
    // 3 of 4 frames left: room for one, but above half the budget.
    sub.next().await.unwrap().ack().await.unwrap();
    settle_tasks().await;
    assert!(
        !waiting.is_finished(),
        "one freed frame does not wake the waiter"
    );
    // 2 of 4: half the budget, the low-water mark.
    sub.next().await.unwrap().ack().await.unwrap();
    within(5, "the waiting publish", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(broker.queued_bytes(), 3 * frame(50));
    for expected in [2u8, 3, 4] {
        let d = sub.next().await.unwrap();
        assert_eq!(
            d.envelope().payload()[0],
            expected,
            "nothing lost, in order"
        );
        d.ack().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_publish_takes_room_above_the_low_water_mark_at_its_deadline() {
    let (broker, mut sub, waiting) = full_lane_and_a_waiter(4, Duration::from_secs(2)).await;
    let start = Instant::now();
    sub.next().await.unwrap().ack().await.unwrap();
    // No wake-up above the low-water mark; the last look at the deadline
    // finds the room and admits the frame instead of failing.
    within(5, "the waiting publish", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        Instant::now(),
        start + Duration::from_secs(2),
        "at its deadline"
    );
    assert_eq!(broker.queued_bytes(), 4 * frame(50));
}

#[tokio::test(start_paused = true)]
async fn jq24_15_full_waiter_slots_fail_at_once() {
    let broker = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(frame(10)))
        .max_publish_waiters(1)
        .build();
    let _sub = broker.subscribe(SubscribeOptions::new("q")).await.unwrap();
    broker
        .publish_message("q", payload(10), None)
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let broker = broker.clone();
        async move { broker.publish_message("q", payload(10), None).await }
    });
    settle_tasks().await;
    assert!(!waiter.is_finished());

    let start = Instant::now();
    let err = broker
        .publish_message("q", payload(10), Some(start + Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded(_)), "{err:?}");
    assert_eq!(
        Instant::now(),
        start,
        "no waiting when every waiter slot is taken"
    );
    waiter.abort();
}

#[tokio::test]
async fn a_frame_larger_than_the_budget_is_admitted_into_an_empty_queue() {
    let broker = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(8))
        .build();
    let mut sub = broker
        .subscribe(SubscribeOptions::new("big"))
        .await
        .unwrap();
    broker
        .publish_message("big", payload(64), None)
        .await
        .unwrap();
    let d = sub.next().await.unwrap();
    assert_eq!(d.envelope().payload().len(), 64);
    d.ack().await.unwrap();
}

#[tokio::test]
async fn nack_redelivers_with_attempt_plus_one_and_ack_never_redelivers() {
    let broker = MemoryBroker::new();
    let mut sub = broker.subscribe(SubscribeOptions::new("n")).await.unwrap();
    broker
        .publish_message("n", Message::new("a"), None)
        .await
        .unwrap();
    let d = sub.next().await.unwrap();
    assert_eq!(d.envelope().attempt(), 1);
    d.nack().await.unwrap();
    let d = within(5, "redelivery", sub.next()).await.unwrap();
    assert_eq!(d.envelope().attempt(), 2);
    assert_eq!(d.envelope().payload(), "a".as_bytes());
    d.ack().await.unwrap();

    broker
        .publish_message("n", Message::new("b"), None)
        .await
        .unwrap();
    let d = sub.next().await.unwrap();
    assert_eq!(
        d.envelope().payload(),
        "b".as_bytes(),
        "the acked message never came back"
    );
    d.ack().await.unwrap();
}

#[tokio::test]
async fn reject_dead_letters_with_reason_or_drops_without_a_dead_letter_subject() {
    let broker = MemoryBroker::new();
    let mut dlq = broker
        .subscribe(SubscribeOptions::new("orders.dlq"))
        .await
        .unwrap();
    let mut sub = broker
        .subscribe(SubscribeOptions::new("orders").dead_letter("orders.dlq"))
        .await
        .unwrap();
    broker
        .publish_message(
            "orders",
            Message::new("bad").with_header("trace", "t1"),
            None,
        )
        .await
        .unwrap();
    sub.next()
        .await
        .unwrap()
        .reject("no such sku")
        .await
        .unwrap();

    let dead = within(5, "dead letter", dlq.next()).await.unwrap();
    let env = dead.envelope();
    assert_eq!(env.payload(), "bad".as_bytes());
    assert_eq!(env.headers().get(header::ERROR), Some("no such sku"));
    assert_eq!(env.headers().get(header::ORIGINAL_SUBJECT), Some("orders"));
    assert_eq!(env.headers().get(header::ATTEMPT), Some("1"));
    assert_eq!(
        env.headers().get("trace"),
        Some("t1"),
        "original headers are kept"
    );
    dead.ack().await.unwrap();

    let mut plain = broker
        .subscribe(SubscribeOptions::new("plain"))
        .await
        .unwrap();
    broker
        .publish_message("plain", Message::new("x"), None)
        .await
        .unwrap();
    plain.next().await.unwrap().reject("dropped").await.unwrap();
    broker
        .publish_message("plain", Message::new("y"), None)
        .await
        .unwrap();
    assert_eq!(
        plain.next().await.unwrap().envelope().payload(),
        "y".as_bytes()
    );
}

#[tokio::test]
async fn unsettled_delivery_of_a_dropped_consumer_goes_to_the_next_one() {
    let broker = MemoryBroker::new();
    let mut a = broker
        .subscribe(SubscribeOptions::new("jobs").queue_group("g"))
        .await
        .unwrap();
    let mut b = broker
        .subscribe(SubscribeOptions::new("jobs").queue_group("g"))
        .await
        .unwrap();
    broker
        .publish_message("jobs", Message::new("job-1"), None)
        .await
        .unwrap();
    let taken = a.next().await.unwrap();
    drop(taken); // e.g. a handler aborted at shutdown: never settled
    drop(a);
    let again = within(5, "redelivery to the other member", b.next())
        .await
        .unwrap();
    assert_eq!(again.envelope().payload(), "job-1".as_bytes());
    assert_eq!(again.envelope().attempt(), 2);
    again.ack().await.unwrap();
}

#[tokio::test]
async fn metadata_round_trips() {
    let broker = MemoryBroker::new();
    let mut sub = broker
        .subscribe(SubscribeOptions::new("meta.*"))
        .await
        .unwrap();
    let message = Message::new("p")
        .with_header("h1", "v1")
        .with_key("k")
        .with_correlation_id("c-1")
        .with_reply_to("replies");
    broker
        .publish_message("meta.one", message, None)
        .await
        .unwrap();
    let d = sub.next().await.unwrap();
    let env = d.envelope();
    assert_eq!(env.subject(), "meta.one");
    assert_eq!(env.headers().get("h1"), Some("v1"));
    assert_eq!(env.key().map(|k| k.as_str()), Some("k"));
    assert_eq!(env.correlation_id().map(|c| c.as_str()), Some("c-1"));
    assert_eq!(env.reply_to().map(|r| r.as_str()), Some("replies"));
}

#[tokio::test(start_paused = true)]
async fn request_reply_round_trip_and_timeout() {
    let broker = MemoryBroker::new();
    let mut sub = broker
        .subscribe(SubscribeOptions::new("echo"))
        .await
        .unwrap();
    let server = tokio::spawn({
        let broker = broker.clone();
        async move {
            // Answers the first request, ignores the second.
            let d = sub.next().await.unwrap();
            let reply_to = d.envelope().reply_to().unwrap().clone();
            let body = d.envelope().payload().clone();
            broker
                .publish_message(&reply_to, Message::new(body), None)
                .await
                .unwrap();
            d.ack().await.unwrap();
            let ignored = sub.next().await.unwrap();
            (sub, ignored)
        }
    });
    let reply = broker
        .request_message("echo", Message::new("ping"), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(reply.payload(), "ping".as_bytes());

    let start = Instant::now();
    let err = broker
        .request_message("echo", Message::new("ping"), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    assert_eq!(Instant::now() - start, Duration::from_millis(300));

    // A reply after the timeout is dropped: first terminal wins.
    let (_sub, ignored) = server.await.unwrap();
    let reply_to = ignored.envelope().reply_to().unwrap().clone();
    broker
        .publish_message(&reply_to, Message::new("late"), None)
        .await
        .unwrap();

    let err = broker
        .request_message("nobody.listens", Message::new("?"), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoResponders(_)), "{err:?}");
}

#[tokio::test]
async fn close_ends_subscriptions_and_later_calls_fail_clearly() {
    let broker = MemoryBroker::new();
    let mut sub = broker.subscribe(SubscribeOptions::new("c")).await.unwrap();
    broker.close().await.unwrap();
    broker.close().await.unwrap(); // closing twice is fine
    assert!(within(5, "end of stream", sub.next()).await.is_none());
    let err = broker
        .publish_message("c", Message::new("x"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Closed(_)), "{err:?}");
    assert!(broker.subscribe(SubscribeOptions::new("c")).await.is_err());
}

#[tokio::test(flavor = "current_thread")]
async fn a_task_that_only_publishes_lets_the_other_tasks_of_its_runtime_run() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const N: usize = 20_000;
    let broker = MemoryBroker::new();
    let _sub = broker.subscribe(SubscribeOptions::new("q")).await.unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicUsize::new(0));
    let ticker = tokio::spawn({
        let (done, turns) = (Arc::clone(&done), Arc::clone(&turns));
        async move {
            while !done.load(Ordering::SeqCst) {
                turns.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        }
    });
    // Let the ticker start, then publish without any other await.
    tokio::task::yield_now().await;
    let before = turns.load(Ordering::SeqCst);
    for _ in 0..N {
        broker.publish_message("q", payload(8), None).await.unwrap();
    }
    let during = turns.load(Ordering::SeqCst) - before;
    done.store(true, Ordering::SeqCst);
    ticker.await.unwrap();
    // One unit of tokio's budget (128 per poll) per 16 publishes.
    let floor = N / 2048 / 2;
    assert!(
        during >= floor,
        "{during} turns while publishing, want >= {floor}"
    );
}
