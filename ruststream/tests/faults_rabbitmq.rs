//! Faults on RabbitMQ, each on a node of the test's own (its own node
//! name, AMQP and distribution ports on loopback, its own data directory;
//! killed by its pid, never the shared service): the node killed and
//! restarted mid-stream (a durable queue, persistent messages), the app
//! process killed with deliveries in flight, poison published with a raw
//! client, and a handler that aborts its process every time on a quorum
//! queue, whose delivery limit dead-letters it.
//!
//! A node boots in 5–20 s, so these tests take longer than the others.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::faults::{self, AppProcess, AppSpec, job};
use common::server::OwnServer;
use common::{counter, install_metrics, within};
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use ruststream::rabbitmq::RabbitBroker;
use ruststream::{
    Broker, Delivery, Message, SubscribeOptions, SubscriberConfig, Subscription, metrics,
};
use tokio::sync::mpsc::unbounded_channel;

fn url(server: &OwnServer) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", server.port)
}

async fn broker(url: &str, quorum: bool) -> RabbitBroker {
    broker_with(url, quorum, 64).await
}

async fn broker_with(url: &str, quorum: bool, prefetch: u16) -> RabbitBroker {
    RabbitBroker::builder()
        .quorum_queues(quorum)
        .prefetch(prefetch)
        .connect(url)
        .await
        .unwrap()
}

/// The app the tests run as a process of their own (see `common::faults`).
#[test]
#[ignore = "the app process of the fault tests, run by them"]
fn app_process() {
    if let Some(app) = AppSpec::from_env() {
        let quorum = app.extra.contains_key("quorum");
        let prefetch = app.extra.get("prefetch").map_or(64, |p| p.parse().unwrap());
        app.serve(|| broker_with(&app.url, quorum, prefetch));
    }
}

/// A `kill -9` of the node mid-stream, publishes going on: every job whose
/// publish was confirmed is handled at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_node_killed_and_restarted_mid_stream_loses_no_job() {
    const N: usize = 200;
    let mut server = OwnServer::rabbitmq().await;
    let rabbit = broker(&url(&server), false).await;
    let (seen_tx, mut seen) = unbounded_channel();
    let running = faults::start_app(
        rabbit.clone(),
        SubscriberConfig::new("jobs.restart").queue_group("workers"),
        seen_tx,
    )
    .await;
    let publisher = tokio::spawn({
        let rabbit = rabbit.clone();
        async move {
            for i in 0..N {
                // Not confirmed: sent again (it may be stored twice).
                while rabbit
                    .publish_message("jobs.restart", Message::new(job(&i.to_string())), None)
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    while runs.len() < N / 4 {
        let (id, _) = within(10, "jobs before the kill", seen.recv())
            .await
            .unwrap();
        *runs.entry(id).or_default() += 1;
    }
    server.restart().await;
    let restarted = std::time::Instant::now();
    within(120, "every publish", publisher).await.unwrap();
    while runs.len() < N {
        let (id, _) = within(60, "every job after the restart", seen.recv())
            .await
            .unwrap();
        *runs.entry(id).or_default() += 1;
    }
    let duplicates: usize = runs.values().map(|n| n - 1).sum();
    eprintln!(
        "rabbitmq kill -9 mid-stream: {N} jobs handled, {duplicates} handled twice or more, \
         all of them {:?} after the node was back",
        restarted.elapsed()
    );
    running.shutdown().await.unwrap();
}

/// The app process is killed with a job in its handler and more
/// prefetched; the broker requeues them and the next instance gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_killed_with_jobs_in_flight_leaves_them_to_the_next_instance() {
    const N: usize = 20;
    let server = OwnServer::rabbitmq().await;
    let url = url(&server);
    let rabbit = broker(&url, false).await;
    let mut spec = AppSpec::new(&url, "jobs.inflight", "workers");
    spec.hold = true;
    let mut first = AppProcess::start(&spec).await;
    for i in 0..N {
        rabbit
            .publish_message("jobs.inflight", Message::new(job(&i.to_string())), None)
            .await
            .unwrap();
    }
    first.expect("handling 0 1", 10).await;
    first.kill().await;

    spec.hold = false;
    let mut second = AppProcess::start(&spec).await;
    let mut handled = BTreeSet::new();
    while handled.len() < N {
        let line = second.expect("handled ", 30).await;
        handled.insert(line["handled ".len()..].to_owned());
    }
    second.kill().await;
}

/// Poison published with a raw client between good messages: no garbage
/// reaches the handler, each poison message is dead-lettered with its
/// reason, and the good ones are handled. A header value that is not
/// UTF-8 is left out of the message (logged once, counted); the message is
/// handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_and_their_neighbours_handled() {
    install_metrics();
    let server = OwnServer::rabbitmq().await;
    let url = url(&server);
    let rabbit = broker(&url, false).await;
    let mut dead = rabbit
        .subscribe(SubscribeOptions::new("dead.jobs"))
        .await
        .unwrap();
    let (seen_tx, mut seen) = unbounded_channel();
    let config = SubscriberConfig::new("jobs.poison")
        .queue_group("workers")
        .dead_letter("dead.jobs")
        .max_attempts(2)
        .max_message_size(32 * 1024);
    let running = faults::start_app(rabbit.clone(), config, seen_tx).await;

    // A raw client: headers as AMQP tables, bytes as they are.
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let publish = |payload: Vec<u8>, headers: FieldTable| {
        let channel = channel.clone();
        async move {
            channel
                .basic_publish(
                    "ruststream".into(),
                    "jobs.poison".into(),
                    BasicPublishOptions::default(),
                    &payload,
                    BasicProperties::default().with_headers(headers),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    let none = FieldTable::default;
    publish(job("good-1"), none()).await;
    publish(b"{not json".to_vec(), none()).await;
    publish(br#"{"name":"wrong shape"}"#.to_vec(), none()).await;
    publish(Vec::new(), none()).await;
    publish(vec![b'x'; 70_000], none()).await;
    let mut bad_value = FieldTable::default();
    bad_value.insert(
        "x-bad".into(),
        AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
    );
    publish(job("bad-value"), bad_value).await;
    let mut many = FieldTable::default();
    for i in 0..3000 {
        many.insert(
            format!("x-{i}").into(),
            AMQPValue::LongString("0123456789".into()),
        );
    }
    publish(job("many-headers"), many).await;
    publish(job("good-2"), none()).await;

    let mut expected = vec![
        faults::Poison {
            name: "invalid JSON",
            reason: "key must be a string",
        },
        faults::Poison {
            name: "wrong shape",
            reason: "unknown field `name`",
        },
        faults::Poison {
            name: "empty body",
            reason: "EOF while parsing",
        },
        faults::Poison {
            name: "oversize body",
            reason: "exceeds max_message_size",
        },
        faults::Poison {
            name: "3,000 headers",
            reason: "exceeds max_message_size",
        },
    ];
    while !expected.is_empty() {
        let letter = within(20, "the dead letters", dead.next()).await.unwrap();
        faults::dead_lettered(&mut expected, letter.envelope());
        letter.ack().await.unwrap();
    }
    let runs = faults::handled(&mut seen, 3, 10).await;
    let handled: Vec<&str> = runs.keys().map(String::as_str).collect();
    assert_eq!(handled, ["bad-value", "good-1", "good-2"]);
    assert!(
        counter(metrics::UNREADABLE_HEADERS, "binding", "rabbitmq") >= 1,
        "the unreadable header value is counted"
    );
    running.shutdown().await.unwrap();
}

/// A job whose handler aborts the process every time, on a quorum queue:
/// the broker counts the deliveries and dead-letters it after
/// `max_attempts` of them (its delivery limit). The jobs around it are
/// handled — with a prefetch of 1. A crash returns everything the consumer
/// had prefetched, and a quorum queue counts each return: with the default
/// prefetch (64) the jobs prefetched behind the crashing one reach the
/// delivery limit with it (seen: `good-b` is never handled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_on_a_quorum_queue_ends_in_the_dead_letter() {
    let server = OwnServer::rabbitmq().await;
    let url = url(&server);
    let rabbit = broker(&url, true).await;
    let mut dead = rabbit
        .subscribe(SubscribeOptions::new("dead.crashes"))
        .await
        .unwrap();
    let mut spec = AppSpec::new(&url, "jobs.crashes", "workers");
    spec.dead_letter = Some("dead.crashes".to_owned());
    spec.max_attempts = 3;
    spec.extra.insert("quorum".to_owned(), "1".to_owned());
    spec.extra.insert("prefetch".to_owned(), "1".to_owned());
    let mut app = AppProcess::start(&spec).await;
    for id in ["good-a", "crash-1", "good-b"] {
        rabbit
            .publish_message("jobs.crashes", Message::new(job(id)), None)
            .await
            .unwrap();
    }
    let mut crashes = 0;
    let mut handled = BTreeSet::new();
    let letter = loop {
        let line = tokio::select! {
            line = app.expect("handl", 30) => line,
            letter = dead.next() => break letter.unwrap(),
        };
        match line.strip_prefix("handled ") {
            Some(id) => {
                handled.insert(id.to_owned());
            }
            None if line.starts_with("handling crash-1") => {
                crashes += 1;
                assert!(
                    app.aborted(10).await,
                    "{line}: the handler aborted the process"
                );
                assert!(crashes <= 3, "the crash loop went on past max_attempts");
                app = AppProcess::start(&spec).await;
            }
            None => {}
        }
    };
    assert_eq!(crashes, 3, "three runs, then the dead letter");
    assert_eq!(
        letter.envelope().payload(),
        &job("crash-1"),
        "the crash job is the dead letter"
    );
    letter.ack().await.unwrap();
    while handled.len() < 2 {
        let line = app.expect("handled ", 30).await;
        handled.insert(line["handled ".len()..].to_owned());
    }
    assert_eq!(
        handled,
        BTreeSet::from(["good-a".to_owned(), "good-b".to_owned()])
    );
    eprintln!("crash loop: {crashes} crashed instances, then the dead letter");
    tokio::time::sleep(faults::QUIET).await;
    assert!(
        futures_util::FutureExt::now_or_never(dead.next()).is_none(),
        "no other dead letter: the jobs around it are not exhausted with it"
    );
    app.kill().await;
}
