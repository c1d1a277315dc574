//! The MQTT binding against a real Mosquitto (MQTT 5): the conformance
//! suite (request/reply included), `+`/`#` wildcards, sessions that outlive
//! the app, shared subscriptions splitting the load, retries counted then
//! dead-lettered, request/reply through an app, and a crash before the ack
//! redelivering.
//!
//! Needs Mosquitto on `RUSTSTREAM_MQTT_URL` (default
//! `mqtt://127.0.0.1:1883`); `scripts/test.sh` starts it when it is down.
//! The tests fail — never skip — when it is unreachable.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::retry_once::in_a_process_that_dies;
use common::{assert_handler_failure, unique, until, within};
use ruststream::bytes::Bytes;
use ruststream::conformance::{self, Capabilities, Harness};
use ruststream::ingress::JobQueueSettings;
use ruststream::mqtt::{MqttBroker, MqttBrokerBuilder, QoS};
use ruststream::subscriber::{Outcome, Scope, SendSubscriber, Subscriber, SubscriberConfig};
use ruststream::{
    App, BoxError, Broker, Configure, Delivery, HandlerError, Json, Message, Requester, Result,
    SubscribeOptions, Subscription, header,
};
use tokio::sync::Semaphore;

const START: &str = "mosquitto -d -c /etc/mosquitto/mosquitto.conf \
     (or run scripts/test.sh, which starts it)";

fn url() -> String {
    std::env::var("RUSTSTREAM_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".to_owned())
}

/// Sessions of test clients go away a minute after they disconnect.
fn builder() -> MqttBrokerBuilder {
    MqttBroker::builder().session_expiry(Duration::from_secs(60))
}

async fn connect(builder: MqttBrokerBuilder) -> MqttBroker {
    let url = url();
    match builder.connect(&url).await {
        Ok(mqtt) => mqtt,
        Err(err) => panic!("Mosquitto is not reachable at {url}: {err}\nstart it with: {START}"),
    }
}

async fn mqtt() -> MqttBroker {
    connect(builder()).await
}

struct Mosquitto;

impl Harness for Mosquitto {
    type Broker = MqttBroker;

    /// The suite's wildcards are NATS-style (`.`-separated, `*`, `>`); MQTT's
    /// `+`/`#` are checked below. Mosquitto keeps a dropped member's
    /// unacked messages in its session rather than handing them to another
    /// member of the shared subscription.
    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
            .without_wildcards()
            .without_unsettled_redelivery()
    }

    async fn connect(&self, _prefix: &str) -> Result<MqttBroker> {
        Ok(mqtt().await)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_conforms() {
    let report = conformance::run(&Mosquitto).await;
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

fn text(delivery: &impl Delivery) -> String {
    String::from_utf8_lossy(delivery.envelope().payload()).into_owned()
}

async fn publish(mqtt: &MqttBroker, topic: &str, payload: &str) {
    mqtt.publish_message(topic, Message::new(payload.to_owned()), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plus_matches_one_level_and_hash_the_rest() {
    let root = unique("rs/wild/");
    let mqtt = mqtt().await;
    let mut one = mqtt
        .subscribe(SubscribeOptions::new(format!("{root}/+/temp")))
        .await
        .unwrap();
    let mut all = mqtt
        .subscribe(SubscribeOptions::new(format!("{root}/#")))
        .await
        .unwrap();
    publish(&mqtt, &format!("{root}/kitchen/temp"), "21").await;
    publish(&mqtt, &format!("{root}/kitchen/oven/temp"), "180").await;
    let d = within(10, "the one-level match", one.next()).await.unwrap();
    assert_eq!(text(&d), "21");
    assert_eq!(
        d.envelope().subject().as_str(),
        format!("{root}/kitchen/temp")
    );
    d.ack().await.unwrap();
    for expected in ["21", "180"] {
        let d = within(10, "a multi-level match", all.next()).await.unwrap();
        assert_eq!(text(&d), expected);
        d.ack().await.unwrap();
    }
    // `+` stops at one level: the oven's reading never reaches `one`.
    publish(&mqtt, &format!("{root}/hall/temp"), "marker").await;
    let d = within(10, "the marker", one.next()).await.unwrap();
    assert_eq!(text(&d), "marker");
    d.ack().await.unwrap();
    mqtt.close().await.unwrap();
}

/// The app's subscription is a persistent session: QoS 1 messages published
/// while the app is down reach it when it comes back with the same client id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_what_was_published_while_the_app_was_down() {
    let topic = unique("rs/session/");
    let client_id = unique("rs-session-");
    let sender = mqtt().await;
    let config = SubscriberConfig::new(topic.as_str()).queue_group("keepers");
    let first = Recorder::new(config.clone(), None);
    let seen = Arc::clone(&first.seen);
    let app = connect(builder().client_id(client_id.as_str())).await;
    let running = start(&app, first).await;
    publish(&sender, &topic, "while up").await;
    until(10, "the first message handled", || {
        seen.lock().unwrap().len() == 1
    })
    .await;
    running.shutdown().await.unwrap();

    for i in 0..5 {
        publish(&sender, &topic, &format!("while down {i}")).await;
    }

    let second = Recorder::new(config, None);
    let seen = Arc::clone(&second.seen);
    let app = connect(builder().client_id(client_id.as_str())).await;
    let running = start(&app, second).await;
    until(10, "the messages published while down", || {
        seen.lock().unwrap().len() == 5
    })
    .await;
    let got = payloads(&seen);
    assert_eq!(
        got,
        (0..5)
            .map(|i| format!("while down {i}"))
            .collect::<Vec<_>>()
    );
    running.shutdown().await.unwrap();
    sender.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_subscription_splits_the_load_between_members() {
    const N: usize = 60;
    let topic = unique("rs/split/");
    let mqtt = mqtt().await;
    let options = || SubscribeOptions::new(topic.as_str()).queue_group("split");
    let mut a = mqtt.subscribe(options()).await.unwrap();
    let mut b = mqtt.subscribe(options()).await.unwrap();
    for i in 0..N {
        publish(&mqtt, &topic, &i.to_string()).await;
    }
    let mut got: BTreeMap<usize, &str> = BTreeMap::new();
    let (mut from_a, mut from_b) = (0, 0);
    within(20, "every message once", async {
        while got.len() < N {
            let (who, d) = tokio::select! {
                d = a.next() => ("a", d.unwrap()),
                d = b.next() => ("b", d.unwrap()),
            };
            let i: usize = text(&d).parse().unwrap();
            assert!(got.insert(i, who).is_none(), "{i} delivered twice");
            if who == "a" {
                from_a += 1
            } else {
                from_b += 1
            }
            d.ack().await.unwrap();
        }
    })
    .await;
    assert!(
        from_a > 0 && from_b > 0,
        "one member took everything: a {from_a}, b {from_b}"
    );
    mqtt.close().await.unwrap();
}

/// `nack` redelivers with the attempt counted (through the subscription's
/// retry topic); the app gives up at `max_attempts` and dead-letters the
/// message with the reason and where it came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_counted_then_the_message_is_dead_lettered() {
    let topic = unique("rs/retry/");
    let dead = format!("{topic}/dead");
    let mqtt = mqtt().await;
    let mut dlq = mqtt
        .subscribe(SubscribeOptions::new(dead.as_str()))
        .await
        .unwrap();
    let failing = Recorder::new(
        SubscriberConfig::new(topic.as_str())
            .max_attempts(3)
            .dead_letter(dead.as_str()),
        Some("always fails"),
    );
    let seen = Arc::clone(&failing.seen);
    let running = App::new()
        .broker(mqtt.clone())
        .subscriber(failing)
        .start()
        .await
        .unwrap();
    let message = Message::new("poison").with_header("x-tenant", "acme");
    mqtt.publish_message(&topic, message, None).await.unwrap();
    let d = within(15, "the dead letter", dlq.next()).await.unwrap();
    let env = d.envelope();
    assert_eq!(env.payload(), "poison".as_bytes());
    assert_eq!(env.headers().get("x-tenant"), Some("acme"));
    assert_eq!(
        env.headers().get(header::ORIGINAL_SUBJECT),
        Some(topic.as_str())
    );
    assert!(
        env.headers()
            .get(header::ERROR)
            .is_some_and(|e| e.contains("always fails")),
        "reason: {:?}",
        env.headers().get(header::ERROR)
    );
    d.ack().await.unwrap();
    let attempts: Vec<u32> = seen.lock().unwrap().iter().map(|(_, a)| *a).collect();
    assert_eq!(
        attempts,
        [1, 2, 3],
        "every attempt, each on its own subject"
    );
    running.shutdown().await.unwrap();
    mqtt.close().await.unwrap();
}

/// Request/reply through an app: MQTT 5 response topic and correlation
/// data; the reply completes the caller without a permit (JQ-6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_answers_requests_on_the_response_topic() {
    let topic = unique("rs/rpc/");
    let mqtt = mqtt().await;
    let echo = Recorder::new(SubscriberConfig::new(topic.as_str()), None);
    let running = App::new()
        .broker(mqtt.clone())
        .subscriber(echo)
        .start()
        .await
        .unwrap();
    let caller = connect(builder()).await;
    for i in 0..3 {
        let reply = caller
            .request_message(
                &topic,
                Message::new(format!("\"n{i}\"")),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(reply.payload(), format!("\"n{i}\"").as_bytes());
    }
    running.shutdown().await.unwrap();
    caller.close().await.unwrap();
    mqtt.close().await.unwrap();
}

/// A broker that is down at start is a transport error that names the
/// address it tried.
#[tokio::test]
async fn connecting_to_a_broker_that_is_down_names_the_address() {
    let refused = within(
        15,
        "the connect error",
        MqttBroker::connect("mqtt://127.0.0.1:1"),
    )
    .await;
    match refused {
        Err(ruststream::Error::Transport(err)) => {
            assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
        }
        Err(other) => panic!("expected a transport error, got {other}"),
        Ok(_) => panic!("nothing listens on port 1"),
    }
}

#[ruststream::subscriber("placeholder", max_attempts = 3)]
async fn flaky_quote(n: u64, ctx: ruststream::Ctx) -> Result<u64, ruststream::HandlerError> {
    if n == 0 {
        return Err(ruststream::HandlerError::retry("down for good"));
    }
    if ctx.attempt() == 1 {
        return Err(ruststream::HandlerError::retry("transient"));
    }
    Ok(n * 10)
}

/// A request whose handler fails is retried with its response topic: the
/// retry's answer reaches the caller, and a handler that gives up answers
/// with `Error::Handler`, not a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_answers_its_caller() {
    let topic = unique("rs/flaky/");
    let mqtt = mqtt().await;
    let running = App::new()
        .broker(mqtt.clone())
        .subscriber(flaky_quote.configure(|c| c.on_subject(topic.as_str())))
        .start()
        .await
        .unwrap();
    let caller = ruststream::Publisher::new(connect(builder()).await);
    let quoted: u64 = within(
        10,
        "the retried request's reply",
        caller.request(&topic, &4u64, Duration::from_secs(8)),
    )
    .await
    .unwrap();
    assert_eq!(quoted, 40);
    let failed = within(
        10,
        "the failure reply",
        caller.request::<u64, u64>(&topic, &0, Duration::from_secs(8)),
    )
    .await;
    assert_handler_failure(failed, "down for good");
    running.shutdown().await.unwrap();
    mqtt.close().await.unwrap();
}

/// A delivery never acked — its process died — comes back when the session
/// resumes, with the DUP flag counted as an attempt (ack only after the
/// handler, RT-7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_ack_means_redelivery() {
    let topic = unique("rs/crash/");
    let client_id = unique("rs-crash-");
    let sender = mqtt().await;
    let crashed = connect(builder().client_id(client_id.as_str())).await;
    let mut sub = crashed
        .subscribe(SubscribeOptions::new(topic.as_str()))
        .await
        .unwrap();
    publish(&sender, &topic, "unfinished").await;
    publish(&sender, &topic, "done").await;
    let d = within(10, "the message", sub.next()).await.unwrap();
    assert_eq!(
        (text(&d).as_str(), d.envelope().attempt()),
        ("unfinished", 1)
    );
    // The handler never finished: no ack, no nack, nothing.
    std::mem::forget(d);
    let d = within(10, "the second message", sub.next()).await.unwrap();
    d.ack().await.unwrap();
    crashed.close().await.unwrap();
    drop(sub);

    let restarted = connect(builder().client_id(client_id.as_str())).await;
    let mut sub = restarted
        .subscribe(SubscribeOptions::new(topic.as_str()))
        .await
        .unwrap();
    let d = within(10, "the redelivery", sub.next()).await.unwrap();
    assert_eq!(
        (text(&d).as_str(), d.envelope().attempt()),
        ("unfinished", 2)
    );
    d.ack().await.unwrap();
    // The acked one stays acked.
    publish(&sender, &topic, "marker").await;
    let d = within(10, "the marker", sub.next()).await.unwrap();
    assert_eq!(text(&d), "marker");
    d.ack().await.unwrap();
    restarted.close().await.unwrap();
    sender.close().await.unwrap();
}

/// QoS 0 per subscriber: delivered, nothing to acknowledge; QoS 2 too, and
/// publishes with retain reach a later subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_per_subscriber_and_retained_publishes() {
    let root = unique("rs/qos/");
    let (zero, two, kept) = (
        format!("{root}/0"),
        format!("{root}/2"),
        format!("{root}/kept"),
    );
    let mqtt = connect(
        builder()
            .subscription_qos(zero.as_str(), QoS::AtMostOnce)
            .subscription_qos(two.as_str(), QoS::ExactlyOnce),
    )
    .await;
    let mut sub0 = mqtt
        .subscribe(SubscribeOptions::new(zero.as_str()))
        .await
        .unwrap();
    let mut sub2 = mqtt
        .subscribe(SubscribeOptions::new(two.as_str()))
        .await
        .unwrap();
    mqtt.publish_with(&zero, Message::new("a"), QoS::AtLeastOnce, false, None)
        .await
        .unwrap();
    mqtt.publish_with(&two, Message::new("b"), QoS::ExactlyOnce, false, None)
        .await
        .unwrap();
    let d = within(10, "the QoS 0 delivery", sub0.next()).await.unwrap();
    assert_eq!((text(&d).as_str(), d.qos()), ("a", QoS::AtMostOnce));
    d.ack().await.unwrap();
    let d = within(10, "the QoS 2 delivery", sub2.next()).await.unwrap();
    assert_eq!((text(&d).as_str(), d.qos()), ("b", QoS::ExactlyOnce));
    d.ack().await.unwrap();
    mqtt.publish_with(&kept, Message::new("last"), QoS::AtLeastOnce, true, None)
        .await
        .unwrap();
    let mut late = mqtt
        .subscribe(SubscribeOptions::new(kept.as_str()))
        .await
        .unwrap();
    let d = within(10, "the retained message", late.next())
        .await
        .unwrap();
    assert_eq!(text(&d), "last");
    d.ack().await.unwrap();
    // Clear the retained message: an empty retained publish.
    mqtt.publish_with(&kept, Message::new(""), QoS::AtLeastOnce, true, None)
        .await
        .unwrap();
    mqtt.close().await.unwrap();
}

/// A subscriber built at run time: records each payload with its attempt,
/// then fails with `fail` or answers with the payload.
struct Recorder {
    config: SubscriberConfig,
    fail: Option<&'static str>,
    seen: Arc<Mutex<Vec<(String, u32)>>>,
    calls: Arc<AtomicU32>,
    /// How long each call takes after it records.
    busy: Duration,
    /// A permit of it ends each call (after `busy`), when set.
    gate: Option<Arc<Semaphore>>,
}

impl Recorder {
    fn new(config: SubscriberConfig, fail: Option<&'static str>) -> Self {
        Recorder {
            config,
            fail,
            seen: Arc::default(),
            calls: Arc::default(),
            busy: Duration::ZERO,
            gate: None,
        }
    }

    /// Each call ends only with a permit of `gate`.
    fn gated(mut self, gate: Arc<Semaphore>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Each call takes `busy` (so messages queue up behind it).
    fn busy(mut self, busy: Duration) -> Self {
        self.busy = busy;
        self
    }
}

impl Subscriber for Recorder {
    type Body = Bytes;
    type Codec = Json;

    fn config(&self) -> SubscriberConfig {
        self.config.clone()
    }

    fn decode(&self, payload: &Bytes) -> std::result::Result<Bytes, BoxError> {
        Ok(payload.clone())
    }

    fn handle(&self, body: Bytes, scope: &Scope<'_>) -> impl Future<Output = Outcome> {
        self.handle_send(body, scope)
    }
}

impl SendSubscriber for Recorder {
    fn handle_send(&self, body: Bytes, scope: &Scope<'_>) -> impl Future<Output = Outcome> + Send {
        let attempt = scope.envelope().attempt();
        self.seen
            .lock()
            .unwrap()
            .push((String::from_utf8_lossy(&body).into_owned(), attempt));
        self.calls.fetch_add(1, Ordering::SeqCst);
        let outcome = match self.fail {
            Some(why) => Outcome::Failed(HandlerError::retry(why)),
            None => Outcome::Ack(Some(body)),
        };
        let busy = self.busy;
        let gate = self.gate.clone();
        async move {
            if !busy.is_zero() {
                tokio::time::sleep(busy).await;
            }
            if let Some(gate) = gate {
                gate.acquire().await.expect("the gate stays open").forget();
            }
            outcome
        }
    }
}

/// A graceful shutdown with messages still waiting in the subscription's
/// buffer (RT-9): every message the first run handled was acked before its
/// DISCONNECT, so the next run with the same session gets exactly the
/// others, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_mid_stream_sends_every_ack_it_owes() {
    const N: usize = 60;
    let topic = unique("rs/owed/");
    let client_id = unique("rs-owed-");
    let sender = mqtt().await;
    let config = SubscriberConfig::new(topic.as_str()).queue_group("owed");
    // Slow enough that most messages still wait in the buffer at shutdown,
    // and only five calls end before the shutdown begins (the gate opens
    // in its first step), however late this task gets to it.
    let gate = Arc::new(Semaphore::new(5));
    let opener = Arc::clone(&gate);
    let first = Recorder::new(config.clone(), None)
        .busy(Duration::from_millis(5))
        .gated(gate);
    let seen_first = Arc::clone(&first.seen);
    let app = connect(builder().client_id(client_id.as_str())).await;
    let running = App::new()
        .broker(app.clone())
        .subscriber(first)
        .on_shutdown(move |_| async move {
            opener.add_permits(Semaphore::MAX_PERMITS - 5);
            Ok(())
        })
        .start()
        .await
        .unwrap();
    for i in 0..N {
        publish(&sender, &topic, &i.to_string()).await;
    }
    until(10, "a few messages handled", || {
        seen_first.lock().unwrap().len() >= 5
    })
    .await;
    running.shutdown().await.unwrap();
    app.close().await.unwrap();
    let first = payloads(&seen_first);
    assert!(first.len() < N, "the shutdown came before the last message");

    let second = Recorder::new(config, None);
    let seen_second = Arc::clone(&second.seen);
    let app = connect(builder().client_id(client_id.as_str())).await;
    let running = start(&app, second).await;
    let rest = N - first.len();
    until(10, "the messages the first run left", || {
        seen_second.lock().unwrap().len() >= rest
    })
    .await;
    running.shutdown().await.unwrap();
    app.close().await.unwrap();
    let second = payloads(&seen_second);
    let again: Vec<&String> = second.iter().filter(|p| first.contains(p)).collect();
    assert!(
        again.is_empty(),
        "handled and acked in the first run, delivered again: {again:?}"
    );
    let mut all: Vec<usize> = first
        .iter()
        .chain(&second)
        .map(|p| p.parse().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "each message once");
    sender.close().await.unwrap();
}

/// A subscriber's config in one execution mode.
type Mode = fn(SubscriberConfig) -> SubscriberConfig;

/// Each execution mode, by name.
const EVERY_MODE: [(&str, Mode); 4] = [
    ("default", |c| c),
    ("workers", |c| c.workers(4)),
    ("by_key", |c| c.workers_by_key(2)),
    ("threads", |c| c.threads(2)),
];

/// The payloads a [`Recorder`] saw, in order.
fn payloads(seen: &Mutex<Vec<(String, u32)>>) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(p, _)| p.clone())
        .collect()
}

/// An app running `recorder` on `mqtt`.
async fn start(mqtt: &MqttBroker, recorder: Recorder) -> ruststream::RunningApp {
    App::new()
        .broker(mqtt.clone())
        .subscriber(recorder)
        .start()
        .await
        .unwrap()
}

/// Every mode acks what it handled before its DISCONNECT (RT-9), with quick
/// handlers and a small receive maximum (so `workers` and `threads(n)`
/// claim in place and poll the connection themselves): the next run with
/// the same session gets nothing again, only the marker published for it
/// (a session's unacked messages come before anything new).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_acks_what_it_handled_before_it_disconnects() {
    const N: usize = 300;
    let sender = mqtt().await;
    for (name, mode) in EVERY_MODE {
        let topic = unique(&format!("rs/acked-{name}/"));
        let client_id = unique(&format!("rs-acked-{name}-"));
        let first = Recorder::new(mode(SubscriberConfig::new(topic.as_str())), None);
        let calls = Arc::clone(&first.calls);
        let app = connect(builder().client_id(client_id.as_str()).receive_maximum(4)).await;
        let running = start(&app, first).await;
        for i in 0..N {
            publish(&sender, &topic, &i.to_string()).await;
        }
        until(30, &format!("every message handled ({name})"), || {
            calls.load(Ordering::SeqCst) as usize >= N
        })
        .await;
        running.shutdown().await.unwrap();
        app.close().await.unwrap();

        let second = Recorder::new(SubscriberConfig::new(topic.as_str()), None);
        let seen = Arc::clone(&second.seen);
        let app = connect(builder().client_id(client_id.as_str())).await;
        let running = start(&app, second).await;
        publish(&sender, &topic, "marker").await;
        until(10, &format!("the marker ({name})"), || {
            seen.lock().unwrap().iter().any(|(p, _)| p == "marker")
        })
        .await;
        running.shutdown().await.unwrap();
        app.close().await.unwrap();
        let again: Vec<String> = payloads(&seen)
            .into_iter()
            .filter(|p| p != "marker")
            .collect();
        assert!(
            again.is_empty(),
            "{name}: handled in the first run, delivered again: {again:?}"
        );
    }
    sender.close().await.unwrap();
}

/// Receive flow (JQ-21, JQ-23): the broker never has more than the receive
/// maximum of unacked QoS 1 messages out with a subscription; each ack lets
/// one more in (memory stays bounded however far behind the app is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receive_maximum_bounds_unacked_deliveries() {
    const MAX: usize = 4;
    let topic = unique("rs/flow/");
    let mqtt = connect(builder().receive_maximum(MAX as u16)).await;
    let mut sub = mqtt
        .subscribe(SubscribeOptions::new(topic.as_str()))
        .await
        .unwrap();
    for i in 0..20 {
        publish(&mqtt, &topic, &i.to_string()).await;
    }
    let mut held = Vec::new();
    for _ in 0..MAX {
        held.push(
            within(10, "a delivery within the maximum", sub.next())
                .await
                .unwrap(),
        );
    }
    // Nothing more while all of them are unacked.
    let more = tokio::time::timeout(Duration::from_millis(500), sub.next()).await;
    assert!(more.is_err(), "a delivery past the receive maximum arrived");
    held.remove(0).ack().await.unwrap();
    let d = within(10, "one more after an ack", sub.next())
        .await
        .unwrap();
    assert_eq!(text(&d), MAX.to_string());
    d.ack().await.unwrap();
    for d in held {
        d.ack().await.unwrap();
    }
    mqtt.close().await.unwrap();
}

/// JQ-15 on MQTT: while the receive flow is PAUSED the subscription hands
/// nothing out (its buffer fills to the receive maximum and the broker
/// keeps the rest); RUNNING hands out every message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_receive_flow_takes_nothing_and_resumes_exactly_once() {
    let topic = unique("rs/paused/");
    let mqtt = connect(builder().receive_maximum(2)).await;
    let mut sub = mqtt
        .subscribe(
            SubscribeOptions::new(topic.as_str())
                .queue_group("svc")
                .receive_flow(true),
        )
        .await
        .unwrap();
    let flow = sub.receive_flow().expect("a request/reply source");
    publish(&mqtt, &topic, "before").await;
    let d = within(10, "a delivery while running", sub.next())
        .await
        .unwrap();
    assert_eq!(text(&d), "before");
    d.ack().await.unwrap();

    flow.set_paused(true);
    for i in 0..5 {
        publish(&mqtt, &topic, &i.to_string()).await;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        for _ in 0..5 {
            let d = sub.next().await.unwrap();
            tx.send(text(&d)).unwrap();
            d.ack().await.unwrap();
        }
        sub
    });
    // Nothing is taken while paused (a quiet window: nothing to wait for).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "a delivery was taken while paused");
    flow.set_paused(false);
    let sub = within(10, "every message after resume", reader)
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Ok(b) = rx.try_recv() {
        got.push(b);
    }
    got.sort();
    assert_eq!(got, ["0", "1", "2", "3", "4"], "each exactly once");
    drop(sub);
    mqtt.close().await.unwrap();
}

/// A PAUSED receive flow longer than the broker's keep-alive limit (1.5
/// keep-alives), with QoS 0 messages, which MQTT does not flow-control,
/// filling the buffer: QoS 0 messages that find it full past a quarter of
/// the keep-alive are dropped (counted as `slow_consumer`) rather than the
/// keep-alive, and a QoS 1 message after them does not wait behind them
/// (it is not dropped either): the connection stays up, the buffered
/// messages are handed out after the pause, the QoS 1 one among them, and a
/// message published after it arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_longer_than_the_keep_alive_keeps_the_connection() {
    common::install_metrics();
    let topic = unique("rs/long-pause/");
    let mqtt = connect(
        builder()
            .keep_alive(Duration::from_secs(5))
            .receive_maximum(2)
            .subscription_qos(topic.as_str(), QoS::AtLeastOnce),
    )
    .await;
    let mut sub = mqtt
        .subscribe(SubscribeOptions::new(topic.as_str()).receive_flow(true))
        .await
        .unwrap();
    let flow = sub.receive_flow().expect("a receive flow");
    flow.set_paused(true);
    for i in 0..20 {
        mqtt.publish_with(
            &topic,
            Message::new(i.to_string()),
            QoS::AtMostOnce,
            false,
            None,
        )
        .await
        .unwrap();
    }
    mqtt.publish_with(&topic, Message::new("q1"), QoS::AtLeastOnce, false, None)
        .await
        .unwrap();
    // The quiet window is the point: past 1.5 keep-alives (7.5 s, which
    // Mosquitto checks about once a second), a connection that sent no
    // PINGREQ is closed by the broker.
    tokio::time::sleep(Duration::from_secs(10)).await;
    flow.set_paused(false);
    for expected in ["0", "1", "q1"] {
        let d = within(10, "a buffered message after the pause", sub.next())
            .await
            .unwrap();
        assert_eq!(text(&d), expected);
        d.ack().await.unwrap();
    }
    // Whatever else the buffer took once it had room again, the connection
    // still delivers what comes after the pause.
    mqtt.publish_with(&topic, Message::new("after"), QoS::AtMostOnce, false, None)
        .await
        .unwrap();
    within(10, "the message published after the pause", async {
        loop {
            let d = sub.next().await.unwrap();
            let after = text(&d) == "after";
            d.ack().await.unwrap();
            if after {
                break;
            }
        }
    })
    .await;
    let event = |event| {
        common::counter_with(
            ruststream::metrics::CONNECTION_EVENTS,
            &[("binding", "mqtt"), ("event", event)],
        )
    };
    assert_eq!(
        event("disconnected"),
        0,
        "the broker closed the paused connection"
    );
    assert!(
        event("slow_consumer") > 0,
        "QoS 0 messages past the full buffer are counted as dropped"
    );
    drop(sub);
    mqtt.close().await.unwrap();
}

/// A steady stream through an app's default loop (RT-2) with a small
/// receive maximum never stalls (JQ-11: no persistent wait cycle): acks never wait for the connection's event loop,
/// which itself may wait for room in the subscription's buffer (Mosquitto
/// 2.0 sends past the receive maximum under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_subscription_with_a_small_receive_maximum_never_stalls() {
    const N: usize = 600;
    let topic = unique("rs/busy/");
    let mqtt = connect(builder().receive_maximum(4)).await;
    let recorder = Recorder::new(SubscriberConfig::new(topic.as_str()), None);
    let calls = Arc::clone(&recorder.calls);
    let running = App::new()
        .broker(mqtt.clone())
        .subscriber(recorder)
        .start()
        .await
        .unwrap();
    let sender = connect(builder()).await;
    let publishing = {
        let (sender, topic) = (sender.clone(), topic.clone());
        tokio::spawn(async move {
            for i in 0..N {
                publish(&sender, &topic, &i.to_string()).await;
            }
        })
    };
    until(30, "every message handled", || {
        calls.load(Ordering::SeqCst) as usize == N
    })
    .await;
    publishing.await.unwrap();
    running.shutdown().await.unwrap();
    sender.close().await.unwrap();
    mqtt.close().await.unwrap();
}

/// Every execution mode, several subscribers sharing one job permit (so
/// their loops keep waiting for it between reads), each with a receive
/// maximum of 4: no stream stalls. Acks from worker tasks and dedicated
/// threads reach the broker while the loop that reads waits for a permit
/// (RT-3, RT-5, JQ-4, JQ-11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_sharing_one_permit_with_a_small_receive_maximum_never_stalls() {
    const N: usize = 300;
    let mqtt = connect(builder().receive_maximum(4)).await;
    let mut app = App::new()
        .broker(mqtt.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(1));
    let mut streams = Vec::new();
    for (name, mode) in EVERY_MODE {
        let topic = unique(&format!("rs/permit-{name}/"));
        let recorder = Recorder::new(mode(SubscriberConfig::new(topic.as_str())), None);
        streams.push((name, topic, Arc::clone(&recorder.calls)));
        app = app.subscriber(recorder);
    }
    let running = app.start().await.unwrap();
    let sender = connect(builder()).await;
    let publishing: Vec<_> = streams
        .iter()
        .map(|(_, topic, _)| {
            let (sender, topic) = (sender.clone(), topic.clone());
            tokio::spawn(async move {
                for i in 0..N {
                    publish(&sender, &topic, &i.to_string()).await;
                }
            })
        })
        .collect();
    for (name, _, calls) in &streams {
        until(
            30,
            &format!("every message of the {name} subscriber handled"),
            || calls.load(Ordering::SeqCst) as usize == N,
        )
        .await;
    }
    for publishing in publishing {
        publishing.await.unwrap();
    }
    running.shutdown().await.unwrap();
    sender.close().await.unwrap();
    mqtt.close().await.unwrap();
}

/// The same at the app level, in a process that really dies: its handler
/// holds the message when the runtime goes away (no shutdown, no ack, no
/// DISCONNECT); the next run of the app, with the same client id, gets it
/// again as attempt 2 and acks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_that_dies_in_its_handler_gets_the_message_again_after_a_restart() {
    let topic = unique("rs/dies/");
    let client_id = unique("rs-dies-");
    let url = url();
    let (dying_topic, dying_id) = (topic.clone(), client_id.clone());
    in_a_process_that_dies(async move {
        let mqtt = connect(
            MqttBroker::builder()
                .client_id(dying_id)
                .session_expiry(Duration::from_secs(60)),
        )
        .await;
        let hang = Hang::new(SubscriberConfig::new(dying_topic.as_str()));
        let started = Arc::clone(&hang.started);
        let _running = App::new()
            .broker(mqtt.clone())
            .subscriber(hang)
            .start()
            .await
            .unwrap();
        let sender = MqttBroker::connect(&url).await.unwrap();
        publish(&sender, &dying_topic, "in hand").await;
        within(10, "the handler to hold the message", started.notified()).await;
        // The runtime goes away here, the handler mid-way.
    });
    let recorder = Recorder::new(SubscriberConfig::new(topic.as_str()), None);
    let seen = Arc::clone(&recorder.seen);
    let mqtt = connect(builder().client_id(client_id.as_str())).await;
    let running = start(&mqtt, recorder).await;
    until(15, "the message again after the restart", || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(
        seen.lock().unwrap().clone(),
        [("in hand".to_owned(), 2)],
        "the redelivery, counted"
    );
    running.shutdown().await.unwrap();
    mqtt.close().await.unwrap();
}

/// A subscriber whose handler says it started, then never finishes.
struct Hang {
    config: SubscriberConfig,
    started: Arc<tokio::sync::Notify>,
}

impl Hang {
    fn new(config: SubscriberConfig) -> Self {
        Hang {
            config,
            started: Arc::default(),
        }
    }
}

impl Subscriber for Hang {
    type Body = Bytes;
    type Codec = Json;

    fn config(&self) -> SubscriberConfig {
        self.config.clone()
    }

    fn decode(&self, payload: &Bytes) -> std::result::Result<Bytes, BoxError> {
        Ok(payload.clone())
    }

    fn handle(&self, body: Bytes, scope: &Scope<'_>) -> impl Future<Output = Outcome> {
        self.handle_send(body, scope)
    }
}

impl SendSubscriber for Hang {
    fn handle_send(
        &self,
        _body: Bytes,
        _scope: &Scope<'_>,
    ) -> impl Future<Output = Outcome> + Send {
        self.started.notify_one();
        std::future::pending()
    }
}
