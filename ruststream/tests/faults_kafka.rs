//! Faults on Kafka (librdkafka's mock cluster, in this process; app
//! processes reach it by its loopback address): an app killed mid-stream
//! with `workers(8)` settling out of order, a rebalance while records are
//! in flight, the only broker going down and coming back, and a record
//! whose handler aborts its process every time (a crash loop).
//!
//! At-least-once, stated as the issue does: every record is handled at
//! least once, and no committed offset is ever past a record that was not
//! handled.

mod common;
#[path = "kafka_mock/mod.rs"]
mod kafka_mock;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use common::faults::{self, AppSpec, Job, job};
use common::within;
use kafka_mock::MockKafka;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use ruststream::bytes::Bytes;
use ruststream::codec::Decode;
use ruststream::kafka::KafkaBroker;
use ruststream::subscriber::{Outcome, Scope, SendSubscriber, Subscriber, SubscriberConfig};
use ruststream::{
    App, BoxError, Broker, Delivery, Json, Message, SubscribeOptions, Subscription, header,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

async fn broker(bootstrap: &str) -> KafkaBroker {
    KafkaBroker::builder()
        .commit_interval(Duration::from_millis(10))
        .property("session.timeout.ms", "2000")
        .property("heartbeat.interval.ms", "200")
        .connect(bootstrap)
        .await
        .unwrap_or_else(|err| panic!("the mock Kafka cluster at {bootstrap}: {err}"))
}

/// A handler that takes 0–15 ms, pseudo-random by job id, so
/// `workers(8)` settles out of order.
struct Jittery;

impl Subscriber for Jittery {
    type Body = Job;
    type Codec = Json;

    fn config(&self) -> SubscriberConfig {
        SubscriberConfig::new("jobs")
            .queue_group("workers")
            .workers(8)
    }

    fn decode(&self, payload: &Bytes) -> Result<Job, BoxError> {
        Json::decode(payload)
    }

    fn handle(&self, body: Job, scope: &Scope<'_>) -> impl Future<Output = Outcome> {
        self.handle_send(body, scope)
    }
}

impl SendSubscriber for Jittery {
    fn handle_send(&self, job: Job, _scope: &Scope<'_>) -> impl Future<Output = Outcome> + Send {
        let n: u64 = job.id.parse().unwrap_or(0);
        let delay = Duration::from_millis(n.wrapping_mul(7919) % 16);
        async move {
            tokio::time::sleep(delay).await;
            println!("handled {}", job.id);
            Outcome::Ack(None)
        }
    }
}

/// The app process: `Jittery` on the cluster at the spec's url, or the
/// common fault app (`faults::Recorder`) when the spec asks for it
/// (`extra["recorder"]`).
#[test]
#[ignore = "the app process of the fault tests, run by them"]
fn app_process() {
    let Some(spec) = AppSpec::from_env() else {
        return;
    };
    if spec.extra.contains_key("recorder") {
        spec.serve(|| broker(&spec.url));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let _running = App::new()
            .broker(broker(&spec.url).await)
            .subscriber(Jittery)
            .start()
            .await
            .unwrap();
        println!("ready");
        std::future::pending::<()>().await
    });
}

/// The app process and what it printed.
struct Child {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Child {
    async fn start(bootstrap: &str) -> Child {
        let spec = AppSpec::new(bootstrap, "jobs", "workers");
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["app_process", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1", "-q"])
            .env(
                "RUSTSTREAM_FAULT_APP",
                serde_json::to_string(&spec).unwrap(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (tx, lines) = unbounded_channel();
        let mut reader = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = reader.next_line().await {
                let _ = tx.send(line);
            }
        });
        let mut started = Child { child, lines };
        within(20, "the app process to start", async {
            while started.lines.recv().await.expect("the app process runs") != "ready" {}
        })
        .await;
        started
    }

    /// Adds handled job ids to `handled` until it holds `n`.
    async fn handled_until(&mut self, handled: &mut BTreeSet<u64>, n: usize) {
        within(60, &format!("{n} jobs handled"), async {
            while handled.len() < n {
                let line = self.lines.recv().await.expect("the app process runs");
                if let Some(id) = line.strip_prefix("handled ") {
                    handled.insert(id.parse().unwrap());
                }
            }
        })
        .await;
    }

    /// SIGKILL; then every job it printed as handled before it died.
    async fn kill(mut self, handled: &mut BTreeSet<u64>) {
        self.child.start_kill().unwrap();
        within(10, "the killed app to exit", self.child.wait())
            .await
            .unwrap();
        while let Some(line) = self.lines.recv().await {
            if let Some(id) = line.strip_prefix("handled ") {
                handled.insert(id.parse().unwrap());
            }
        }
    }
}

/// The group's committed offset of partition 0 of `jobs`.
fn committed(bootstrap: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "workers@jobs")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition("jobs", 0);
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(5))
        .unwrap();
    match got.find_partition("jobs", 0).unwrap().offset() {
        Offset::Offset(at) => at,
        _ => 0,
    }
}

/// Offsets follow acks under out-of-order settlement: an app with
/// `workers(8)` and jittery handlers is killed mid-stream. Every record
/// below the committed offset was handled by it (none committed
/// unhandled), and the next instance handles everything from there: each
/// record handled at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_killed_mid_stream_never_committed_an_unhandled_record() {
    const N: u64 = 300;
    let mock = MockKafka::start(1);
    let bootstrap = mock.bootstrap();
    let kafka = broker(&bootstrap).await;
    let mut first = Child::start(&bootstrap).await;
    // Keyless: all on partition 0, in publish order (offset = job id).
    for i in 0..N {
        let message = Message::new(job(&i.to_string()));
        kafka.publish_message("jobs", message, None).await.unwrap();
    }
    let mut by_first = BTreeSet::new();
    first.handled_until(&mut by_first, 120).await;
    first.kill(&mut by_first).await;
    let at = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || committed(&bootstrap)
    })
    .await
    .unwrap();
    assert!(at > 0, "the first instance committed something");
    let unhandled: Vec<u64> = (0..at as u64).filter(|i| !by_first.contains(i)).collect();
    assert!(
        unhandled.is_empty(),
        "committed offset {at} is past unhandled records {unhandled:?}"
    );
    eprintln!(
        "killed after {} handled; committed offset {at}",
        by_first.len()
    );

    let mut second = Child::start(&bootstrap).await;
    let mut all = by_first.clone();
    second.handled_until(&mut all, N as usize).await;
    assert_eq!(all, (0..N).collect(), "every record handled at least once");
    second.kill(&mut BTreeSet::new()).await;
}

/// Two instances of a group, the second joining and the first leaving
/// while records are in flight: every record is handled at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_in_flight_loses_no_record() {
    const N: usize = 400;
    let mock = MockKafka::start(1);
    let bootstrap = mock.bootstrap();
    let publisher = broker(&bootstrap).await;
    let config = || {
        SubscriberConfig::new("moving")
            .queue_group("workers")
            .workers(4)
    };
    let (seen_tx, mut seen) = unbounded_channel();
    let first = faults::start_app(broker(&bootstrap).await, config(), seen_tx.clone()).await;
    let publish = tokio::spawn(async move {
        for i in 0..N {
            // Keys spread the records over the four partitions.
            let message = Message::new(job(&i.to_string())).with_key(format!("k{}", i % 16));
            publisher
                .publish_message("moving", message, None)
                .await
                .unwrap();
        }
    });
    let mut handled = BTreeSet::new();
    let mut take = async |handled: &mut BTreeSet<String>, n: usize| {
        within(60, &format!("{n} records handled"), async {
            while handled.len() < n {
                handled.insert(seen.recv().await.unwrap().0);
            }
        })
        .await;
    };
    take(&mut handled, 80).await;
    let second = faults::start_app(broker(&bootstrap).await, config(), seen_tx).await;
    take(&mut handled, 200).await;
    first.shutdown().await.unwrap();
    take(&mut handled, N).await;
    within(30, "every publish", publish).await.unwrap();
    second.shutdown().await.unwrap();
}

/// The only broker goes down mid-stream and comes back: publishes are
/// retried until stored, and every job is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_down_and_back_mid_stream_loses_no_job() {
    let mock = MockKafka::start(1);
    let kafka = broker(&mock.bootstrap()).await;
    let outage = async {
        mock.down(1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        mock.up(1);
    };
    let run = faults::restart_mid_stream(kafka, "outage", 200, outage).await;
    eprintln!(
        "kafka broker down 2 s mid-stream: 200 jobs handled, {} twice or more, all {:?} after it was back",
        run.duplicates, run.recovered
    );
}

/// A job whose handler aborts its process every time (`crash-1`, between
/// `good-a` and `good-b`, all on partition 0): each app instance of the
/// group dies on it. Commits count each hand-out before the handler
/// starts, so the instance that gets it past `max_attempts` (3) — after
/// three crashes — dead-letters it before the handler, with the reason;
/// the jobs around it are handled, and nothing else is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_ends_in_the_dead_letter_after_max_attempts() {
    let mock = MockKafka::start(1);
    let bootstrap = mock.bootstrap();
    let kafka = broker(&bootstrap).await;
    let mut spec = AppSpec::new(&bootstrap, "crashes", "workers");
    spec.dead_letter = Some("crashes.dead".to_owned());
    spec.extra.insert("recorder".to_owned(), String::new());
    let mut dead = dead_letters(&kafka, "crashes.dead").await;
    let publish = || async {
        for id in ["good-a", "crash-1", "good-b"] {
            let message = Message::new(job(id));
            kafka
                .publish_message("crashes", message, None)
                .await
                .unwrap();
        }
    };
    let reason = faults::crash_loop(&spec, publish, &mut dead).await;
    assert!(reason.contains("attempts exhausted"), "{reason}");
    assert!(reason.contains("max_attempts 3"), "{reason}");
}

/// The payload and reason of every record on `topic` from now on (a
/// fan-out subscription of the test's own).
async fn dead_letters(kafka: &KafkaBroker, topic: &str) -> UnboundedReceiver<(Vec<u8>, String)> {
    let mut letters = kafka.subscribe(SubscribeOptions::new(topic)).await.unwrap();
    let (tx, rx) = unbounded_channel();
    tokio::spawn(async move {
        while let Some(letter) = letters.next().await {
            let env = letter.envelope();
            let reason = env.headers().get(header::ERROR).unwrap_or("").to_owned();
            if tx.send((env.payload().to_vec(), reason)).is_err() {
                break;
            }
            let _ = letter.ack().await;
        }
    });
    rx
}
