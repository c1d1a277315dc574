//! The NATS binding against a real nats-server (JetStream enabled): the
//! conformance suite on core NATS and on JetStream, the no-over-fetch bound,
//! and a server restart mid-stream on a server of the test's own.
//!
//! Needs NATS on `RUSTSTREAM_NATS_URL` (default `nats://127.0.0.1:4222`);
//! `scripts/test.sh` starts it when it is down. The tests fail — never skip —
//! when it is unreachable.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{Gate, until, within};
use ruststream::bytes::Bytes;
use ruststream::conformance::{self, Capabilities, Harness};
use ruststream::ingress::JobQueueSettings;
use ruststream::nats::{JetStream, NatsBroker, StreamSpec};
use ruststream::{
    App, Broker, Codec, Delivery, Envelope, Json, Message, Outcome, Result, Scope, SendSubscriber,
    SubscribeOptions, Subscriber, SubscriberConfig, Subscription,
};

const START: &str = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server \
     -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log \
     (or run scripts/test.sh, which starts it)";

fn url() -> String {
    std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A connection to the shared server, or a failure that says how to start it.
async fn nats() -> NatsBroker {
    let url = url();
    match NatsBroker::connect(&url).await {
        Ok(nats) => nats,
        Err(err) => panic!("NATS is not reachable at {url}: {err}\nstart it with: {START}"),
    }
}

/// A name no other run uses.
fn unique(prefix: &str) -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}{}x{nanos}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn stream_name(prefix: &str) -> String {
    prefix.replace('.', "_").to_uppercase()
}

// ------------------------------------------------------------- conformance

struct Core;

impl Harness for Core {
    type Broker = NatsBroker;

    fn capabilities(&self) -> Capabilities {
        // Core NATS is at-most-once: an unsettled delivery of a consumer that
        // goes away is gone with it.
        Capabilities::all().without_unsettled_redelivery()
    }

    async fn connect(&self, _prefix: &str) -> Result<NatsBroker> {
        Ok(nats().await)
    }
}

struct Js;

impl Harness for Js {
    type Broker = JetStream;

    fn capabilities(&self) -> Capabilities {
        // Replies to a stream subject would be the stream's own publish
        // acknowledgements: request/reply is core NATS's job.
        Capabilities::all().without_request_reply()
    }

    async fn connect(&self, prefix: &str) -> Result<JetStream> {
        nats()
            .await
            .jetstream(
                StreamSpec::new(stream_name(prefix), [format!("{prefix}.>")])
                    .memory_storage()
                    .ack_wait(Duration::from_secs(5))
                    .pull_expires(Duration::from_secs(1)),
            )
            .await
    }

    async fn cleanup(&self, prefix: &str) {
        let js = async_nats::jetstream::new(nats().await.client().clone());
        let _ = js.delete_stream(stream_name(prefix)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_nats_conforms() {
    let report = conformance::run(&Core).await;
    report.assert_passed();
    assert_eq!(
        report.skipped,
        ["unsettled_delivery_of_a_dropped_consumer_is_redelivered"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_conforms() {
    let report = conformance::run(&Js).await;
    report.assert_passed();
    assert_eq!(report.skipped, ["request_reply_round_trip"]);
}

// ------------------------------------------------------------- nak delay

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_nak_with_delay_redelivers_no_sooner() {
    let prefix = unique("nak");
    let js = nats()
        .await
        .jetstream(StreamSpec::new(stream_name(&prefix), [format!("{prefix}.>")]).memory_storage())
        .await
        .unwrap();
    let subject = format!("{prefix}.jobs");
    let mut sub = js
        .subscribe(SubscribeOptions::new(subject.as_str()).queue_group("w"))
        .await
        .unwrap();
    js.publish_message(&subject, Message::new("later"), None)
        .await
        .unwrap();
    let first = within(10, "the first delivery", sub.next()).await.unwrap();
    assert_eq!(first.envelope().attempt(), 1);
    let delay = Duration::from_millis(600);
    let nacked_at = tokio::time::Instant::now();
    first.nack_after(delay).await.unwrap();
    let again = within(10, "the delayed redelivery", sub.next())
        .await
        .unwrap();
    assert!(nacked_at.elapsed() >= delay, "redelivered before its delay");
    assert_eq!(again.envelope().attempt(), 2);
    assert_eq!(again.envelope().payload(), "later".as_bytes());
    again.ack().await.unwrap();
    js.delete_stream().await.unwrap();
}

// ------------------------------------------------------------- over-fetch

/// A subscriber built at run time (its subject has a random suffix).
struct Blocked {
    subject: String,
    gate: Arc<Gate>,
    done: Arc<AtomicU32>,
}

impl Subscriber for Blocked {
    type Body = Bytes;
    type Codec = Json;

    fn config(&self) -> SubscriberConfig {
        SubscriberConfig::new(self.subject.as_str())
            .queue_group("overfetch")
            .workers_by_key(2)
    }

    fn decode(&self, payload: &Bytes) -> std::result::Result<Bytes, ruststream::BoxError> {
        let _ = Json::CONTENT_TYPE;
        Ok(payload.clone())
    }

    fn handle(&self, body: Bytes, scope: &Scope<'_>) -> impl Future<Output = Outcome> {
        self.handle_send(body, scope)
    }
}

impl SendSubscriber for Blocked {
    fn handle_send(
        &self,
        _body: Bytes,
        _scope: &Scope<'_>,
    ) -> impl Future<Output = Outcome> + Send {
        let gate = Arc::clone(&self.gate);
        let done = Arc::clone(&self.done);
        async move {
            gate.pass().await;
            done.fetch_add(1, Ordering::SeqCst);
            Outcome::Ack(None)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_app_never_over_fetches_from_jetstream() {
    const M: usize = 4;
    const IN_FLIGHT: usize = 2;
    const N: u32 = 100;
    let prefix = unique("of");
    let js = nats()
        .await
        .jetstream(
            StreamSpec::new(stream_name(&prefix), [format!("{prefix}.>")])
                .memory_storage()
                .pull_window(1),
        )
        .await
        .unwrap();
    let subject = format!("{prefix}.jobs");
    for i in 0..N {
        // Two keys: two handlers run at once, the rest queue with permits.
        let message = Message::new(i.to_string()).with_key(format!("k{}", i % 2));
        js.publish_message(&subject, message, None).await.unwrap();
    }
    let gate = Arc::new(Gate::new());
    let done = Arc::new(AtomicU32::new(0));
    let running = App::new()
        .broker(js.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(M))
        .subscriber(Blocked {
            subject: subject.clone(),
            gate: Arc::clone(&gate),
            done: Arc::clone(&done),
        })
        .start()
        .await
        .unwrap();
    // Saturated: every permit is reserved or travels with a queued record.
    // The loop either waits for a permit or — the subscriber is a queue-group
    // (request/reply) source — holds its reservation with pulls paused by the
    // PAUSED pressure state (JQ-15). Either way, no pull is outstanding.
    until(10, "the app is saturated", || {
        running.pressure().in_use == M
    })
    .await;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = js
        .context()
        .get_consumer_from_stream("overfetch", &stream_name(&prefix))
        .await
        .unwrap();
    let info = consumer.info().await.unwrap().clone();
    let delivered = info.num_ack_pending;
    assert!(
        delivered <= M + IN_FLIGHT,
        "JetStream delivered {delivered} messages to an app that can hold {M} queued + {IN_FLIGHT} running"
    );
    assert!(info.num_pending as u32 >= N - (M + IN_FLIGHT) as u32);

    gate.open();
    until(20, "every message handled", || {
        done.load(Ordering::SeqCst) == N
    })
    .await;
    running.shutdown().await.unwrap();
    js.delete_stream().await.unwrap();
}

// ------------------------------------------------------------- restart

/// A nats-server of this test's own on a free loopback port, with its own
/// JetStream directory; killed when dropped. The shared server is never
/// touched.
struct OwnServer {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnServer {
    fn start(port: u16, dir: &std::path::Path) -> Child {
        Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!("cannot run nats-server ({err}); install it: apt-get install nats-server")
            })
    }

    async fn new() -> OwnServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(unique("rs-nats-"));
        std::fs::create_dir_all(&dir).unwrap();
        let server = OwnServer {
            child: Self::start(port, &dir),
            port,
            dir,
        };
        server.wait_up().await;
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn wait_up(&self) {
        let port = self.port;
        until(10, "the test's nats-server accepts connections", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
    }

    async fn restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::start(self.port, &self.dir);
        self.wait_up().await;
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_stream_loses_no_jetstream_message() {
    let mut server = OwnServer::new().await;
    let js = NatsBroker::connect(&server.url())
        .await
        .unwrap()
        .jetstream(
            StreamSpec::new("RESTART", ["restart.>"])
                .ack_wait(Duration::from_secs(2))
                .pull_expires(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    let mut sub = js
        .subscribe(SubscribeOptions::new("restart.jobs").queue_group("workers"))
        .await
        .unwrap();
    for i in 0..20 {
        js.publish_message("restart.jobs", Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    let mut acked = std::collections::BTreeSet::new();
    // Ten acked, one taken and left unsettled across the restart.
    for _ in 0..10 {
        let d = within(10, "a message before the restart", sub.next())
            .await
            .unwrap();
        acked.insert(text(d.envelope()));
        d.ack().await.unwrap();
    }
    js.nats().client().flush().await.unwrap();
    let in_hand = within(10, "the message in hand", sub.next()).await.unwrap();
    let in_hand_text = text(in_hand.envelope());

    server.restart().await;
    drop(in_hand); // its nak may be lost with the old connection: ack_wait covers it

    // The subscription resumes by itself: everything not acked arrives.
    let mut seen = std::collections::BTreeSet::new();
    while acked.len() + seen.len() < 20 {
        let d = within(30, "the rest after the restart", sub.next())
            .await
            .unwrap();
        let t = text(d.envelope());
        d.ack().await.unwrap();
        if !acked.contains(&t) {
            seen.insert(t);
        }
    }
    assert!(
        seen.contains(&in_hand_text),
        "the unsettled message came back"
    );
    let all: std::collections::BTreeSet<String> = acked.union(&seen).cloned().collect();
    assert_eq!(all.len(), 20, "no message lost");
    js.close().await.unwrap();
}

fn text(env: &Envelope) -> String {
    String::from_utf8_lossy(env.payload()).into_owned()
}
