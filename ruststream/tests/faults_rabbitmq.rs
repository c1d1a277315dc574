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

use common::faults::{self, AppSpec, job};
use common::server::OwnServer;
use common::{counter, install_metrics, within};
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use ruststream::rabbitmq::RabbitBroker;
use ruststream::subscriber::SubscriberConfig;
use ruststream::{Broker, Delivery, Message, SubscribeOptions, Subscription, header, metrics};
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
///
/// RabbitMQ 3.10.8 itself breaks this in about one run in 75: a publish sent
/// again at the instant the node is back is confirmed and not kept (the
/// guide's RabbitMQ page, "What a restarted node does"). Such a failure
/// names the job the outage caught (once also the one published right
/// after it: jobs 50 and 51 on 2026-12-07); the node's directory is kept
/// for its logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_node_killed_and_restarted_mid_stream_loses_no_job() {
    let mut server = OwnServer::rabbitmq().await;
    let rabbit = broker(&url(&server), false).await;
    let run = faults::restart_mid_stream(rabbit, "jobs.restart", 200, server.restart()).await;
    eprintln!(
        "rabbitmq kill -9 mid-stream: 200 jobs handled, {} handled twice or more, all of them \
         {:?} after the node was back",
        run.duplicates, run.recovered
    );
}

/// The app process is killed with jobs in its handlers and more
/// prefetched; the broker requeues them and the next instance gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_killed_with_jobs_in_flight_leaves_them_to_the_next_instance() {
    let server = OwnServer::rabbitmq().await;
    let url = url(&server);
    let rabbit = broker(&url, false).await;
    let spec = AppSpec::new(&url, "jobs.inflight", "workers");
    faults::killed_in_flight(spec, 20, false, |i| {
        let rabbit = rabbit.clone();
        async move {
            let message = Message::new(job(&i.to_string()));
            rabbit
                .publish_message("jobs.inflight", message, None)
                .await
                .unwrap();
        }
    })
    .await;
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
    let mut expected = Vec::new();
    publish(job("good-1"), none()).await;
    for (payload, poison) in faults::poison_payloads() {
        publish(payload, none()).await;
        expected.push(poison);
    }
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
    expected.push(faults::many_headers());
    publish(job("good-2"), none()).await;

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
    let mut dead_letters = rabbit
        .subscribe(SubscribeOptions::new("dead.crashes"))
        .await
        .unwrap();
    let mut spec = AppSpec::new(&url, "jobs.crashes", "workers");
    spec.dead_letter = Some("dead.crashes".to_owned());
    spec.extra.insert("quorum".to_owned(), "1".to_owned());
    spec.extra.insert("prefetch".to_owned(), "1".to_owned());
    let (letters, mut dead) = unbounded_channel();
    tokio::spawn(async move {
        while let Some(letter) = dead_letters.next().await {
            let env = letter.envelope();
            let reason = env
                .headers()
                .get(header::ERROR)
                .unwrap_or_default()
                .to_owned();
            let _ = letters.send((env.payload().to_vec(), reason));
            letter.ack().await.unwrap();
        }
    });
    let publish = || async {
        for id in ["good-a", "crash-1", "good-b"] {
            let message = Message::new(job(id));
            rabbit
                .publish_message("jobs.crashes", message, None)
                .await
                .unwrap();
        }
    };
    let reason = faults::crash_loop(&spec, publish, &mut dead).await;
    assert!(reason.contains("delivery_limit"), "{reason}");
}
