//! The Kafka binding against librdkafka's mock cluster (a Kafka-protocol
//! server inside the test process, see `kafka_mock`): the conformance
//! suite, offsets that follow out-of-order acks, commits the group
//! refuses, the dead-letter topic's content, receive flow, publish
//! deadlines and size limits, and a request served by an app.
//!
//! The mock cluster starts with each test; nothing needs to be running.

mod common;
#[path = "kafka_mock/mod.rs"]
mod kafka_mock;

use std::time::Duration;

use common::{unique, within};
use kafka_mock::MockKafka;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use ruststream::conformance::{self, Capabilities, Harness};
use ruststream::kafka::{KafkaBroker, KafkaBrokerBuilder, ORIGINAL_OFFSET, ORIGINAL_PARTITION};
use ruststream::{
    Broker, Delivery, Error, Message, Result, SubscribeOptions, Subscription, header,
};

/// Quick settings for tests: commits every 10 ms, and a short session,
/// which the mock cluster also takes as how long a rebalance waits for
/// members to rejoin (a real broker moves on once all have).
fn quick() -> KafkaBrokerBuilder {
    KafkaBroker::builder()
        .commit_interval(Duration::from_millis(10))
        .property("session.timeout.ms", "2000")
        .property("heartbeat.interval.ms", "200")
        .metadata_timeout(Duration::from_secs(5))
}

async fn kafka_at(bootstrap: &str) -> KafkaBroker {
    match quick().connect(bootstrap).await {
        Ok(kafka) => kafka,
        Err(err) => panic!("the mock Kafka cluster is not reachable at {bootstrap}: {err}"),
    }
}

struct Mock {
    bootstrap: String,
}

impl Harness for Mock {
    type Broker = KafkaBroker;

    /// The mock cluster refuses offset commits while a group is joining
    /// (a real broker takes them from the current generation), so a member
    /// that leaves in the middle of a join cannot record that it handed a
    /// record out: the next owner gets it again (nothing is lost) but as
    /// attempt 1, where the suite's check wants 2.
    /// `an_unsettled_record_of_a_departed_member_comes_back_counted` checks
    /// the same in a group that has formed.
    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
            .without_wildcards()
            .without_unsettled_redelivery()
    }

    async fn connect(&self, _prefix: &str) -> Result<KafkaBroker> {
        Ok(kafka_at(&self.bootstrap).await)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_conforms_on_the_mock_cluster() {
    let mock = MockKafka::start(1);
    let report = conformance::run(&Mock {
        bootstrap: mock.bootstrap(),
    })
    .await;
    report.assert_passed();
    assert_eq!(
        report.skipped,
        [
            "unsettled_delivery_of_a_dropped_consumer_is_redelivered",
            "acks_of_a_consumer_that_leaves_are_kept",
            "wildcards_match_one_and_many_tokens"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_conforms_on_a_cluster_of_three() {
    let mock = MockKafka::start(3);
    conformance::run(&Mock {
        bootstrap: mock.bootstrap(),
    })
    .await
    .assert_passed();
}

fn text(d: &impl Delivery) -> String {
    String::from_utf8_lossy(d.envelope().payload()).into_owned()
}

/// The group's committed offset of partition 0 of `topic`.
fn committed(bootstrap: &str, group: &str, topic: &str) -> Option<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(5))
        .unwrap();
    match got.find_partition(topic, 0).unwrap().offset() {
        Offset::Offset(at) => Some(at),
        _ => None,
    }
}

/// Waits until the group's committed offset is `want`.
async fn committed_reaches(bootstrap: &str, group: &str, topic: &str, want: i64) {
    let what = format!("committed offset {want}");
    within(10, &what, async {
        loop {
            let (b, g, t) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
            let at = tokio::task::spawn_blocking(move || committed(&b, &g, &t))
                .await
                .unwrap();
            if at == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Offsets follow acks: with records settled out of order, the committed
/// offset stops at the first record still unsettled, and moves past all
/// of them once it is settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_offset_stops_at_the_first_unsettled_record() {
    let mock = MockKafka::start(1);
    let bootstrap = mock.bootstrap();
    let kafka = kafka_at(&bootstrap).await;
    let topic = unique("acks.");
    let mut sub = kafka
        .subscribe(SubscribeOptions::new(topic.as_str()).queue_group("w"))
        .await
        .unwrap();
    for i in 0..5 {
        kafka
            .publish_message(&topic, Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(within(10, "a record", sub.next()).await.unwrap());
    }
    let group = format!("w@{topic}");
    let first = held.remove(0);
    let second = held.remove(0);
    // 2, 3, 4 settled while 0 and 1 are in handlers: nothing to commit.
    for d in held.drain(..).rev() {
        d.ack().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // (0 itself is committed before it is handed out, with the bound of
    // what may be handed out.)
    let at = committed(&bootstrap, &group, &topic).unwrap_or(0);
    assert_eq!(at, 0, "committed past the unsettled 0");
    // 0 settled: commit 1, never past the unsettled 1.
    first.ack().await.unwrap();
    committed_reaches(&bootstrap, &group, &topic, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        committed(&bootstrap, &group, &topic),
        Some(1),
        "the commit ran past the unsettled record"
    );
    second.ack().await.unwrap();
    committed_reaches(&bootstrap, &group, &topic, 5).await;
}

/// The dead letter carries the reason, the original topic, partition,
/// offset and attempt, and the message's own headers and key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_copies_the_record_to_the_dead_letter_topic_with_where_it_came_from() {
    let mock = MockKafka::start(1);
    let kafka = kafka_at(&mock.bootstrap()).await;
    let topic = unique("dlq.");
    let dead = format!("{topic}.dead");
    let mut letters = kafka
        .subscribe(SubscribeOptions::new(dead.as_str()))
        .await
        .unwrap();
    let mut sub = kafka
        .subscribe(
            SubscribeOptions::new(topic.as_str())
                .queue_group("w")
                .dead_letter(dead.as_str()),
        )
        .await
        .unwrap();
    let first = Message::new("first").with_key("k1");
    kafka.publish_message(&topic, first, None).await.unwrap();
    let poison = Message::new("poison")
        .with_header("x-tenant", "acme")
        .with_key("k1");
    kafka.publish_message(&topic, poison, None).await.unwrap();
    within(10, "the first", sub.next())
        .await
        .unwrap()
        .ack()
        .await
        .unwrap();
    let d = within(10, "the poison", sub.next()).await.unwrap();
    d.reject("cannot parse").await.unwrap();
    let letter = within(10, "the dead letter", letters.next()).await.unwrap();
    let env = letter.envelope();
    let get = |name: &str| env.headers().get(name).map(str::to_owned);
    assert_eq!(text(&letter), "poison");
    assert_eq!(env.key().map(|k| k.as_str()), Some("k1"));
    assert_eq!(get("x-tenant").as_deref(), Some("acme"));
    assert_eq!(get(header::ERROR).as_deref(), Some("cannot parse"));
    assert_eq!(
        get(header::ORIGINAL_SUBJECT).as_deref(),
        Some(topic.as_str())
    );
    assert_eq!(get(header::ATTEMPT).as_deref(), Some("1"));
    let partition: i32 = get(ORIGINAL_PARTITION).unwrap().parse().unwrap();
    assert!(
        (0..4).contains(&partition),
        "the key's partition: {partition}"
    );
    assert_eq!(get(ORIGINAL_OFFSET).as_deref(), Some("1"));
}

/// PAUSED pauses the assigned partitions: nothing is handed out; RUNNING
/// hands every record out exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_receive_flow_takes_nothing_and_resumes_exactly_once() {
    let mock = MockKafka::start(1);
    let kafka = kafka_at(&mock.bootstrap()).await;
    let topic = unique("flow.");
    let mut sub = kafka
        .subscribe(
            SubscribeOptions::new(topic.as_str())
                .queue_group("w")
                .receive_flow(true),
        )
        .await
        .unwrap();
    let flow = sub
        .receive_flow()
        .expect("a request/reply source has a switch");
    kafka
        .publish_message(&topic, Message::new("before"), None)
        .await
        .unwrap();
    within(10, "the first record", sub.next())
        .await
        .unwrap()
        .ack()
        .await
        .unwrap();
    flow.set_paused(true);
    for i in 0..20 {
        kafka
            .publish_message(&topic, Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    let idle = tokio::time::timeout(Duration::from_millis(700), sub.next()).await;
    assert!(idle.is_err(), "a paused flow handed a record out");
    flow.set_paused(false);
    for i in 0..20 {
        let d = within(10, "a record after RUNNING", sub.next())
            .await
            .unwrap();
        assert_eq!(text(&d), i.to_string());
        d.ack().await.unwrap();
    }
    let extra = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(extra.is_err(), "a record came twice");
}

/// A publish that cannot be stored fails by its deadline with
/// `DeadlineExceeded` (the only broker is down); one larger than the
/// cluster takes is a `StructuralLimit`, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_fail_clearly_by_their_deadline_or_size() {
    let mock = MockKafka::start(1);
    let kafka = kafka_at(&mock.bootstrap()).await;
    let topic = unique("limits.");
    kafka
        .publish_message(&topic, Message::new("warm"), None)
        .await
        .unwrap();
    let huge = Message::new(vec![b'x'; 2 * 1024 * 1024]);
    let refused = kafka.publish_message(&topic, huge, None).await;
    assert!(
        matches!(refused, Err(Error::StructuralLimit(_))),
        "{refused:?}"
    );

    mock.down(1);
    let started = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    let late = kafka
        .publish_message(&topic, Message::new("late"), Some(deadline))
        .await;
    assert!(matches!(late, Err(Error::DeadlineExceeded(_))), "{late:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    mock.up(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_a_clear_error() {
    let refused = KafkaBroker::builder()
        .metadata_timeout(Duration::from_millis(500))
        .connect("127.0.0.1:1")
        .await;
    match refused {
        Err(Error::Transport(err)) => assert!(err.to_string().contains("127.0.0.1:1"), "{err}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_name_kafka_refuses_is_a_config_error() {
    let mock = MockKafka::start(1);
    let kafka = kafka_at(&mock.bootstrap()).await;
    let wild = kafka.subscribe(SubscribeOptions::new("orders.*")).await;
    assert!(matches!(wild, Err(Error::Config(_))), "{:?}", wild.err());
}

/// A member that goes away holding a record unsettled: the other member
/// of its group gets it again, counted as the second attempt (the commit
/// made when the partition was revoked says it was handed out once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsettled_record_of_a_departed_member_comes_back_counted() {
    let mock = MockKafka::start(1);
    let bootstrap = mock.bootstrap();
    let kafka = kafka_at(&bootstrap).await;
    let topic = unique("departed.");
    let options = || SubscribeOptions::new(topic.as_str()).queue_group("w");
    let mut a = kafka.subscribe(options()).await.unwrap();
    let mut b = kafka.subscribe(options()).await.unwrap();
    // A settled record whose commit the group took: it has formed.
    kafka
        .publish_message(&topic, Message::new("warm"), None)
        .await
        .unwrap();
    let warm = within(10, "the warm-up record", async {
        tokio::select! {
            d = a.next() => d.unwrap(),
            d = b.next() => d.unwrap(),
        }
    })
    .await;
    warm.ack().await.unwrap();
    // Both members are polled until then (they serve the rebalance), and
    // a warm-up handed out again (its commit came too early) is settled.
    let group = format!("w@{topic}");
    let formed = committed_reaches(&bootstrap, &group, &topic, 1);
    tokio::pin!(formed);
    loop {
        tokio::select! {
            () = &mut formed => break,
            Some(d) = a.next() => d.ack().await.unwrap(),
            Some(d) = b.next() => d.ack().await.unwrap(),
        }
    }
    kafka
        .publish_message(&topic, Message::new("orphan"), None)
        .await
        .unwrap();
    // A warm-up handed out again after the group formed (its commit came
    // too early) is settled on the way; the orphan is the first other one.
    let (took_a, orphan) = within(10, "the orphan", async {
        loop {
            let (took_a, d) = tokio::select! {
                d = a.next() => (true, d.unwrap()),
                d = b.next() => (false, d.unwrap()),
            };
            if text(&d) == "warm" {
                d.ack().await.unwrap();
                continue;
            }
            break (took_a, d);
        }
    })
    .await;
    assert_eq!(text(&orphan), "orphan");
    assert_eq!(orphan.envelope().attempt(), 1);
    drop(orphan);
    let mut other = if took_a {
        drop(a);
        b
    } else {
        drop(b);
        a
    };
    let again = within(15, "the orphan again", other.next()).await.unwrap();
    assert_eq!(text(&again), "orphan");
    assert_eq!(again.envelope().attempt(), 2, "the handout was counted");
    again.ack().await.unwrap();
}

/// A commit the group refuses (as it does while a rebalance is in
/// progress) never lets a record out: the commit that must record the
/// hand-out bound before the first record goes out is refused, the
/// record is read again, and it goes out once a commit is taken. Every
/// record is handed out once, as attempt 1, and the committed offset
/// follows the acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_reads_the_record_again_and_hands_it_out_once() {
    common::install_metrics();
    let mock = MockKafka::start(1);
    let bootstrap = mock.bootstrap();
    let kafka = kafka_at(&bootstrap).await;
    let topic = unique("refused.");
    let mut sub = kafka
        .subscribe(SubscribeOptions::new(topic.as_str()).queue_group("w"))
        .await
        .unwrap();
    mock.refuse_commits(2);
    for i in 0..3 {
        kafka
            .publish_message(&topic, Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    for i in 0..3 {
        let d = within(15, "the next record", sub.next()).await.unwrap();
        assert_eq!(text(&d), i.to_string());
        assert_eq!(d.envelope().attempt(), 1, "handed out once");
        d.ack().await.unwrap();
    }
    let refused = common::counter(
        ruststream::metrics::CONNECTION_EVENTS,
        "event",
        "commit_failed",
    );
    // (librdkafka may retry a refused commit once before it fails it.)
    assert!(refused >= 1, "no commit was refused");
    let group = format!("w@{topic}");
    committed_reaches(&bootstrap, &group, &topic, 3).await;
    let extra = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(extra.is_err(), "a record came twice");
}

/// A graceful stop with records still unread or read ahead (RT-9): the
/// next app in the group starts after what the first one handled (its
/// commits went out before it left) and gets exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_stream_commits_everything_it_handled() {
    let mock = MockKafka::start(1);
    let bootstrap = mock.bootstrap();
    let topic = unique("stopmid.");
    let config =
        ruststream::subscriber::SubscriberConfig::new(topic.as_str()).queue_group("stoppers");
    let publisher = kafka_at(&bootstrap).await;
    common::faults::stopped_mid_stream(|| kafka_at(&bootstrap), &publisher, config, 60).await;
    publisher.close().await.unwrap();
}
