//! The NATS binding against a real nats-server (JetStream enabled): the
//! conformance suite on core NATS and on JetStream, the no-over-fetch bound,
//! and a server restart mid-stream on a server of the test's own.
//!
//! Needs NATS on `RUSTSTREAM_NATS_URL` (default `nats://127.0.0.1:4222`);
//! `scripts/test.sh` starts it when it is down. The tests fail — never skip —
//! when it is unreachable.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::blocked::Blocked;
use common::retry_once::{RetryApp, in_a_process_that_dies};
use common::server::OwnServer;
use common::{assert_handler_failure, unique, until, within};
use ruststream::conformance::{self, Capabilities, Harness};
use ruststream::ingress::{JobQueueSettings, PressureState};
use ruststream::nats::{JetStream, NatsBroker, NatsSubscription, StreamSpec};
use ruststream::subscriber::SubscriberConfig;
use ruststream::{
    App, Broker, Configure, Delivery, Envelope, Error, Message, Requester, Result,
    SubscribeOptions, Subscription, header,
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

/// A core subscription to `subject`, known to the server once this returns.
async fn subscribed(nats: &NatsBroker, subject: &str) -> NatsSubscription {
    let sub = nats
        .subscribe(SubscribeOptions::new(subject))
        .await
        .unwrap();
    nats.client().flush().await.unwrap();
    sub
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
        // acknowledgements: request/reply is core NATS's job. The server
        // counts every delivery, also one to the pull request a dropped
        // consumer still had open, so a dropped consumer's redelivery may
        // come with more than attempt + 1.
        Capabilities::all()
            .without_request_reply()
            .counting_returns()
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
        [
            "unsettled_delivery_of_a_dropped_consumer_is_redelivered",
            "acks_of_a_consumer_that_leaves_are_kept"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_conforms() {
    let report = conformance::run(&Js).await;
    report.assert_passed();
    assert_eq!(report.skipped, ["request_reply_round_trip"]);
}

// ------------------------------------------------------ requests on JetStream

/// A request to a subject the stream captures would be stored and answered
/// by the stream's own receipt: it is refused with a clear error, at once.
/// A request to a core NATS responder goes through on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_request_to_a_stream_subject_is_refused_and_core_requests_work() {
    let prefix = unique("jsreq");
    let js = nats()
        .await
        .jetstream(StreamSpec::new(stream_name(&prefix), [format!("{prefix}.>")]).memory_storage())
        .await
        .unwrap();
    let stored = format!("{prefix}.double");
    let refused = within(
        5,
        "the refusal",
        js.request_message(&stored, Message::new("2"), Duration::from_secs(5)),
    )
    .await;
    match refused {
        Err(Error::Config(why)) => assert!(why.contains("JetStream::nats()"), "{why}"),
        other => panic!("expected a configuration error, got {other:?}"),
    }

    let core = format!("core-{prefix}.double");
    let mut responder = js
        .nats()
        .subscribe(SubscribeOptions::new(core.as_str()))
        .await
        .unwrap();
    js.nats().client().flush().await.unwrap();
    let caller = tokio::spawn({
        let js = js.clone();
        async move {
            js.request_message(&core, Message::new("2"), Duration::from_secs(5))
                .await
        }
    });
    let request = within(5, "the request", responder.next()).await.unwrap();
    let reply_to = request.envelope().reply_to().expect("a request").clone();
    js.nats()
        .publish_message(&reply_to, Message::new("4"), None)
        .await
        .unwrap();
    request.ack().await.unwrap();
    let reply = within(5, "the reply", caller).await.unwrap().unwrap();
    assert_eq!(reply.payload(), "4".as_bytes());
    js.delete_stream().await.unwrap();
}

// ----------------------------------------------------------- bad subjects

/// A subject NATS cannot take (empty, or with whitespace, which would break
/// the protocol's framing) is refused at once with `Error::Config`, on every
/// publish path, before anything reaches the server; the connection goes on
/// working, for a subject it used before as well as for a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_nats_cannot_take_is_refused_and_the_connection_goes_on() {
    let prefix = unique("badsubj");
    let nats = nats().await;
    let good = format!("{prefix}.good");
    let mut sub = subscribed(&nats, &good).await;
    nats.publish_message(&good, Message::new("1"), None)
        .await
        .unwrap();
    let refused = |result: Result<()>, what: &str| match result {
        Err(Error::Config(why)) => assert!(why.contains("not a NATS subject"), "{what}: {why}"),
        other => panic!("{what}: expected a configuration error, got {other:?}"),
    };
    for bad in [
        format!("{prefix} bad"),
        format!("{prefix}.\tbad"),
        String::new(),
    ] {
        refused(
            nats.publish_message(&bad, Message::new("x"), None).await,
            "a payload",
        );
        refused(
            nats.publish_message(&bad, Message::new("x").with_header("h", "v"), None)
                .await,
            "a message with headers",
        );
        refused(
            nats.request_message(&bad, Message::new("x"), Duration::from_secs(5))
                .await
                .map(drop),
            "a request",
        );
    }
    let js = nats
        .jetstream(
            StreamSpec::new(stream_name(&prefix), [format!("{prefix}.js.>")]).memory_storage(),
        )
        .await
        .unwrap();
    refused(
        js.publish_message(&format!("{prefix}.js. x"), Message::new("x"), None)
            .await,
        "a JetStream publish",
    );
    js.delete_stream().await.unwrap();
    nats.publish_message(&good, Message::new("2"), None)
        .await
        .unwrap();
    for expected in ["1", "2"] {
        let delivery = within(5, "a message after the refusals", sub.next())
            .await
            .expect("the subscription is open");
        assert_eq!(delivery.envelope().payload(), expected.as_bytes());
        delivery.ack().await.unwrap();
    }
}

// ------------------------------------------------------------- nak delay

/// Publish subjects are kept for the life of the process up to 64 KiB in
/// all; past that room each publish copies its subject. Either way every
/// message goes out on its own subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_subjects_than_are_kept_all_reach_their_subscribers() {
    let prefix = unique("manysubj");
    let nats = nats().await;
    let mut sub = subscribed(&nats, &format!("{prefix}.>")).await;
    // 100 subjects of ~1 KB: more than the 64 KiB kept, whatever other
    // tests in this process kept before.
    let long = "s".repeat(1000);
    let subject = |i: usize| format!("{prefix}.{long}.{i}");
    for i in 0..100 {
        nats.publish_message(&subject(i), Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    for i in 0..100 {
        let delivery = within(5, "a message on a long subject", sub.next())
            .await
            .expect("the subscription is open");
        assert_eq!(delivery.envelope().subject().as_str(), subject(i));
        assert_eq!(delivery.envelope().payload(), i.to_string().as_bytes());
        delivery.ack().await.unwrap();
    }
}

/// Headers the framework writes itself (a codec's content type, its own
/// names) skip the copy and the check on the way out and in; they, a
/// content type under another name, and a service's own headers all arrive
/// as sent. A name NATS cannot carry is still refused, as a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_and_unknown_headers_arrive_as_sent() {
    let prefix = unique("headers");
    let nats = nats().await;
    let subject = format!("{prefix}.h");
    let mut sub = subscribed(&nats, &subject).await;
    let sent = [
        (header::CONTENT_TYPE, "application/json"),
        ("x-format", "application/json"),
        (header::ERROR, "a value of the service's own"),
        ("x-tenant", "acme"),
    ];
    let message = sent.iter().fold(Message::new("body"), |m, (name, value)| {
        m.with_header(*name, *value)
    });
    let refused = nats
        .publish_message(
            &subject,
            Message::new("x").with_header("bad:name", "v"),
            None,
        )
        .await;
    assert!(matches!(refused, Err(Error::Encode(_))), "{refused:?}");
    nats.publish_message(&subject, message, None).await.unwrap();
    let delivery = within(5, "the message with headers", sub.next())
        .await
        .expect("the subscription is open");
    let mut got: Vec<(String, String)> = delivery
        .envelope()
        .headers()
        .iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    got.sort();
    let mut want: Vec<(String, String)> = sent
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(delivery.envelope().payload(), b"body".as_slice());
}

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

/// A memory-backed stream on `<prefix>.>` whose pulls ask for `window`.
async fn memory_stream(prefix: &str, window: usize) -> JetStream {
    nats()
        .await
        .jetstream(
            StreamSpec::new(stream_name(prefix), [format!("{prefix}.>")])
                .memory_storage()
                .pull_window(window),
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_app_never_over_fetches_from_jetstream() {
    const M: usize = 4;
    const IN_FLIGHT: usize = 2;
    const N: u32 = 100;
    let prefix = unique("of");
    let js = memory_stream(&prefix, 1).await;
    let subject = format!("{prefix}.jobs");
    for i in 0..N {
        // Two keys: two handlers run at once, the rest queue with permits.
        let message = Message::new(i.to_string()).with_key(format!("k{}", i % 2));
        js.publish_message(&subject, message, None).await.unwrap();
    }
    let blocked = Blocked::new(
        SubscriberConfig::new(subject.as_str())
            .queue_group("overfetch")
            .workers_by_key(2),
    );
    let (gate, done) = (Arc::clone(&blocked.gate), Arc::clone(&blocked.done));
    let running = App::new()
        .broker(js.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(M))
        .subscriber(blocked)
        .start()
        .await
        .unwrap();
    // Saturated: the permits travel with queued records, and the subscriber
    // is a queue-group (request/reply) source, so the PAUSED pressure state
    // stops its pulls (JQ-15). Beyond what the app holds, JetStream may have
    // handed out one pull window (1 here): the message the idle loop waits
    // for, without a permit, until it can take one.
    until(10, "the app is saturated", || {
        running.pressure().state == PressureState::Paused
    })
    .await;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = js
        .context()
        .get_consumer_from_stream("overfetch", &stream_name(&prefix))
        .await
        .unwrap();
    let info = consumer.info().await.unwrap().clone();
    let delivered = info.num_ack_pending;
    const WINDOW: usize = 1;
    assert!(
        delivered <= M + IN_FLIGHT + WINDOW,
        "JetStream delivered {delivered} messages to an app that can hold {M} queued + {IN_FLIGHT} running, with a pull window of {WINDOW}"
    );
    assert!(info.num_pending as u32 >= N - (M + IN_FLIGHT + WINDOW) as u32);

    gate.open();
    until(20, "every message handled", || {
        done.load(Ordering::SeqCst) == N
    })
    .await;
    running.shutdown().await.unwrap();
    js.delete_stream().await.unwrap();
}

// ------------------------------------------------------------- restart

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_stream_loses_no_jetstream_message() {
    let mut server = OwnServer::nats().await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let js = NatsBroker::connect(&url)
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

// ------------------------------------------------- retried requests on core

#[ruststream::subscriber("rs.core.flaky.quote", queue_group = "flaky", max_attempts = 3)]
async fn flaky_quote(n: u64, ctx: ruststream::Ctx) -> Result<u64, ruststream::HandlerError> {
    if ctx.attempt() == 1 {
        return Err(ruststream::HandlerError::retry("transient"));
    }
    Ok(n * 10)
}

#[ruststream::subscriber("rs.core.failing.quote", queue_group = "failing", max_attempts = 2)]
async fn failing_quote(_n: u64) -> Result<u64, ruststream::HandlerError> {
    Err(ruststream::HandlerError::retry("down"))
}

/// A request whose handler fails and is retried on core NATS keeps its
/// reply address: the retry's answer reaches the caller, and a handler
/// that gives up answers with `Error::Handler`, not a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_core_request_gets_its_reply() {
    let running = App::new()
        .broker(nats().await)
        .subscriber(flaky_quote)
        .subscriber(failing_quote)
        .start()
        .await
        .unwrap();
    let caller = ruststream::Publisher::new(nats().await);
    let quoted: u64 = within(
        10,
        "the retried request's reply",
        caller.request("rs.core.flaky.quote", &4u64, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(quoted, 40);
    let failed = within(
        10,
        "the failure reply",
        caller.request::<u64, u64>("rs.core.failing.quote", &4, Duration::from_secs(5)),
    )
    .await;
    assert_handler_failure(failed, "down");
    running.shutdown().await.unwrap();
}

// ------------------------------------------------------------- retry_after

/// RT-8 on JetStream: `retry_after` is a nak with delay, held by the
/// server, so the retry survives the process that asked for it dying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_retry_survives_the_consumer_process_dying() {
    const DELAY: Duration = Duration::from_millis(1500);
    let prefix = unique("retry");
    let spec = StreamSpec::new(stream_name(&prefix), [format!("{prefix}.>")]).memory_storage();
    let subject = format!("{prefix}.jobs");
    let config = SubscriberConfig::new(subject.as_str())
        .queue_group("retry")
        .max_attempts(3);

    // The first process handles it, asks for the retry, and dies: its
    // runtime is dropped with the app and the connection.
    let asked = {
        let (subject, config, spec) = (subject.clone(), config.clone(), spec.clone());
        in_a_process_that_dies(async move {
            let js = nats().await.jetstream(spec).await.unwrap();
            let mut app = RetryApp::start(js.clone(), config, DELAY).await;
            let asked = std::time::Instant::now();
            js.publish_message(&subject, Message::new("job"), None)
                .await
                .unwrap();
            let env = within(10, "the first run", app.seen.recv()).await.unwrap();
            assert_eq!(env.total_attempt(), 1);
            within(10, "the nak with delay", app.settled.recv()).await;
            assert!(
                asked.elapsed() < DELAY,
                "the process dies before the delay is over"
            );
            asked
        })
    };

    let js = nats().await.jetstream(spec).await.unwrap();
    let mut app = RetryApp::start(js.clone(), config, DELAY).await;
    let env = within(20, "the retry in the next process", app.seen.recv())
        .await
        .unwrap();
    assert!(
        asked.elapsed() >= DELAY,
        "retried after {:?}, before the {DELAY:?} delay",
        asked.elapsed()
    );
    assert_eq!(env.total_attempt(), 2, "one more attempt counted");
    assert_eq!(env.payload(), "job".as_bytes());
    app.running.shutdown().await.unwrap();
    assert!(app.seen.try_recv().is_err(), "delivered once");
    js.delete_stream().await.unwrap();
}

// ------------------------------------------------------------- credentials

/// A server that requires credentials: without them connecting is a clear
/// transport error; `options` passes them to the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_go_through_the_client_options() {
    let server = OwnServer::start(
        "nats-server",
        &[
            "-a",
            "127.0.0.1",
            "-p",
            "{port}",
            "--user",
            "svc",
            "--pass",
            "s3cret",
            "-js",
            "-sd",
        ],
    )
    .await;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let refused = NatsBroker::connect(&url).await.expect_err("no credentials");
    assert!(
        matches!(&refused, ruststream::Error::Transport(e) if e.to_string().contains(&url)),
        "{refused:?}"
    );
    let nats = NatsBroker::builder()
        .options(|o| o.user_and_password("svc".into(), "s3cret".into()))
        .connect(&url)
        .await
        .unwrap();
    let mut sub = nats
        .subscribe(SubscribeOptions::new("auth.jobs"))
        .await
        .unwrap();
    nats.publish_message("auth.jobs", Message::new("in"), None)
        .await
        .unwrap();
    let d = within(10, "a message with credentials", sub.next())
        .await
        .unwrap();
    assert_eq!(d.envelope().payload(), "in".as_bytes());
    d.ack().await.unwrap();
    nats.close().await.unwrap();
}

// ------------------------------------------------------------- batch handlers

/// Every batch a batch handler got; call number `hold` waits for `gate`
/// (the test sees it waiting in `holding`).
#[derive(Clone)]
struct Batches {
    seen: Arc<std::sync::Mutex<Vec<Vec<u32>>>>,
    gate: Arc<common::Gate>,
    hold: usize,
    holding: Arc<std::sync::atomic::AtomicBool>,
}

impl Batches {
    fn holding_call(hold: usize) -> Self {
        Batches {
            seen: Arc::default(),
            gate: Arc::new(common::Gate::new()),
            hold,
            holding: Arc::default(),
        }
    }

    async fn record(&self, numbers: Vec<u32>) {
        let call = self.seen.lock().unwrap().len();
        if call == self.hold {
            self.holding.store(true, Ordering::SeqCst);
            self.gate.pass().await;
        }
        self.seen.lock().unwrap().push(numbers);
    }

    fn handled(&self) -> Vec<u32> {
        self.seen.lock().unwrap().concat()
    }

    fn sizes(&self) -> Vec<usize> {
        self.seen.lock().unwrap().iter().map(Vec::len).collect()
    }
}

#[ruststream::subscriber("rs_test.nats.batch", batch(max = 50))]
async fn batched(numbers: Vec<u32>, batches: ruststream::State<Batches>) {
    batches.record(numbers).await;
}

/// Without a wait, a batch is what the client has already received: a
/// backlog in the client's buffer is taken up to `max` at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_nats_batch_takes_what_the_client_has_received() {
    const N: u32 = 200;
    let nats = nats().await;
    let batches = Batches::holding_call(0);
    let running = App::new()
        .broker(nats.clone())
        .state(batches.clone())
        .subscriber(batched)
        .start()
        .await
        .unwrap();
    // On the same connection: once this one has the last message, the
    // subscriber's buffer has everything before it.
    let mut observer = nats
        .subscribe(SubscribeOptions::new("rs_test.nats.batch"))
        .await
        .unwrap();
    for n in 0..N {
        nats.publish_message("rs_test.nats.batch", Message::new(n.to_string()), None)
            .await
            .unwrap();
    }
    for _ in 0..N {
        let delivery = within(10, "the observer's copy", observer.next())
            .await
            .unwrap();
        delivery.ack().await.unwrap();
    }
    batches.gate.open();
    until(10, "every message handled", || {
        batches.handled().len() == N as usize
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(batches.handled(), (0..N).collect::<Vec<_>>());
    let sizes = batches.sizes();
    assert!(sizes.iter().all(|&n| n <= 50), "{sizes:?}");
    assert!(
        sizes.iter().filter(|&&n| n == 50).count() >= 3,
        "the buffered backlog goes 50 at a time: {sizes:?}"
    );
}

/// JetStream: the messages of an open pull the client has received are
/// taken into the batch without waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_batch_takes_the_received_messages_of_its_pull() {
    const N: u32 = 120;
    let prefix = unique("jsbatch");
    let js = memory_stream(&prefix, 64).await;
    let subject = format!("{prefix}.events");
    for n in 0..N {
        js.publish_message(&subject, Message::new(n.to_string()), None)
            .await
            .unwrap();
    }
    // The first pull asks for one message (a new consumer pulls carefully);
    // the second batch, from the first full pull, waits until the server
    // has sent that pull's messages.
    let batches = Batches::holding_call(1);
    let running = App::new()
        .broker(js.clone())
        .state(batches.clone())
        .subscriber(batched.configure(|c| c.on_subject(subject.clone()).queue_group("batchers")))
        .start()
        .await
        .unwrap();
    until(10, "the second batch in its handler", || {
        batches.holding.load(Ordering::SeqCst)
    })
    .await;
    // Asked on the subscriber's own connection: the answer comes after
    // every message the server sent before it, so those are in the
    // client's buffer when it arrives.
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = js
        .context()
        .get_consumer_from_stream("batchers", &stream_name(&prefix))
        .await
        .unwrap();
    within(10, "the pull's messages sent", async {
        while consumer.info().await.unwrap().num_ack_pending < 10 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    batches.gate.open();
    until(10, "every message handled", || {
        batches.handled().len() == N as usize
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(batches.handled(), (0..N).collect::<Vec<_>>());
    let sizes = batches.sizes();
    assert!(sizes.iter().all(|&n| n <= 50), "{sizes:?}");
    assert!(
        sizes.get(2).is_some_and(|&n| n >= 8),
        "the received messages of the pull are taken together: {sizes:?}"
    );
    let js_context = async_nats::jetstream::new(nats().await.client().clone());
    let _ = js_context.delete_stream(stream_name(&prefix)).await;
}

/// A graceful stop with messages still in the stream or pulled ahead
/// (RT-9): the next app gets exactly the messages the first one did not
/// handle. What the client had received of the stopped app's pull is
/// nak'ed as the subscription goes and comes back at once — unless the
/// server hands the redelivery to that pull while it is still open
/// (about half the runs, for the last message or so): then after
/// `ack_wait` (5 s here, within the helper's bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_stop_mid_stream_acks_everything_it_handled() {
    jetstream_stopped_mid_stream("stopmid", |config| config).await;
}

/// The same on `threads(4)`: dedicated threads claim what the pull has
/// received in place (on the app runtime's context), and a graceful stop
/// still acks everything they handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_stop_mid_stream_on_dedicated_threads_acks_everything_it_handled() {
    jetstream_stopped_mid_stream("stopthreads", |config| config.threads(4)).await;
}

/// [`common::faults::stopped_mid_stream`] on a fresh stream with `ack_wait`
/// 5 s, the subscriber configured by `mode`.
async fn jetstream_stopped_mid_stream(
    name: &str,
    mode: impl FnOnce(SubscriberConfig) -> SubscriberConfig,
) {
    let prefix = unique(name);
    let subject = format!("{prefix}.jobs");
    let connect = || async {
        nats()
            .await
            .jetstream(
                StreamSpec::new(stream_name(&prefix), [format!("{prefix}.>")])
                    .memory_storage()
                    .ack_wait(Duration::from_secs(5)),
            )
            .await
            .unwrap()
    };
    let config = mode(SubscriberConfig::new(subject.as_str()).queue_group("stoppers"));
    let publisher = connect().await;
    common::faults::stopped_mid_stream(connect, &publisher, config, 60).await;
    publisher.delete_stream().await.unwrap();
}
