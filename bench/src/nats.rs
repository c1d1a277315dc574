//! NATS scenarios, each next to the raw `async-nats` client doing the same
//! work in the same process: 512-byte payloads, core pub/sub, and JetStream
//! consumption with one ack per message; and typed core pub/sub, as most
//! services use it: a small JSON order published with its `content-type`
//! header and decoded by the handler. They need a server on
//! `RUSTSTREAM_NATS_URL` (default `nats://127.0.0.1:4222`); `bench/brokers.sh`
//! runs them and prints the ratios.

use async_nats::jetstream;
use futures_util::StreamExt;
use ruststream::bytes::Bytes;
use ruststream::nats::{NatsBroker, StreamSpec};
use ruststream::{App, BoxError, Broker, IntoSubscriber, Message, RunningApp, subscriber};

use crate::progress;
use crate::scenarios::{Mark, Measurement};

/// The scenarios that need NATS.
pub const NAMES: &[&str] = &[
    "nats-core",
    "raw-nats-core",
    "nats-json",
    "raw-nats-json",
    "nats-js",
    "raw-nats-js",
];

const PAYLOAD: usize = 512;
/// Messages a core subscription may buffer, the same for both sides: core
/// NATS drops what a full buffer cannot take, which would end a run early.
const CAPACITY: usize = 1 << 17;

/// Runs NATS scenario `name` over `n` messages; `None` for other names.
pub async fn run(name: &str, n: u64) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "nats-core" => core(n).await,
        "raw-nats-core" => raw_core(n).await,
        "nats-json" => json(n).await,
        "raw-nats-json" => raw_json(n).await,
        "nats-js" => js(n).await,
        "raw-nats-js" => raw_js(n).await,
        _ => return None,
    })
}

pub(crate) fn url() -> String {
    std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

fn payload() -> Bytes {
    Bytes::from(vec![b'x'; PAYLOAD])
}

async fn raw_client() -> Result<async_nats::Client, BoxError> {
    Ok(async_nats::ConnectOptions::new()
        .subscription_capacity(CAPACITY)
        .connect(url())
        .await?)
}

/// A connection with the bench's subscription capacity and an app running
/// `subscriber` on it, expecting `n` messages.
async fn core_app<M>(
    n: u64,
    subscriber: impl IntoSubscriber<M>,
) -> Result<(NatsBroker, RunningApp), BoxError> {
    progress::expect(n);
    let nats = NatsBroker::builder()
        .subscription_capacity(CAPACITY)
        .connect(&url())
        .await?;
    let running = App::new()
        .broker(nats.clone())
        .subscriber(subscriber)
        .start()
        .await?;
    Ok((nats, running))
}

/// Framework: an app subscriber on core NATS; the framework publishes. Its
/// subject is as long as the raw side's: the client and the server parse
/// every subject, and a longer one costs more.
async fn core(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.nats.fw")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    let (nats, running) = core_app(n, count).await?;
    let payload = payload();
    let start = Mark::now();
    for _ in 0..n {
        nats.publish_message("bench.nats.fw", Message::new(payload.clone()), None)
            .await?;
    }
    nats.client().flush().await?;
    progress::all_seen().await;
    let end = Mark::now();
    running.shutdown().await?;
    Ok(start.until(end))
}

/// Raw: one client subscribes and counts each message as the framework's
/// handler does ([`progress::seen`]), the same client publishes.
async fn raw_core(n: u64) -> Result<Measurement, BoxError> {
    let client = raw_client().await?;
    let mut sub = client.subscribe("bench.nats.rw").await?;
    client.flush().await?;
    let consumer = tokio::spawn(async move {
        let mut seen = 0;
        while sub.next().await.is_some() {
            progress::seen();
            seen += 1;
            if seen == n {
                return Mark::now();
            }
        }
        Mark::now()
    });
    let payload = payload();
    let start = Mark::now();
    for _ in 0..n {
        client.publish("bench.nats.rw", payload.clone()).await?;
    }
    client.flush().await?;
    let end = consumer.await?;
    Ok(start.until(end))
}

/// The order both typed scenarios publish (~90 bytes of JSON).
#[derive(serde::Serialize)]
struct OrderOut<'a> {
    id: u64,
    customer: &'a str,
    amount_cents: u64,
    currency: &'a str,
}

impl OrderOut<'static> {
    fn new(id: u64) -> Self {
        OrderOut {
            id,
            customer: "customer-0042",
            amount_cents: 129_900,
            currency: "EUR",
        }
    }
}

/// The order as both typed handlers decode it.
#[derive(serde::Deserialize)]
struct Order {
    id: u64,
    customer: String,
    amount_cents: u64,
    currency: String,
}

impl Order {
    /// Reads every field, so that decoding cannot be optimised away.
    fn check(&self) {
        std::hint::black_box((self.id, &self.customer, self.amount_cents, &self.currency));
    }
}

/// Framework, typed: a [`Publisher`](ruststream::Publisher) publishes each
/// order as JSON (with its `content-type` header, as every codec-encoded
/// message carries), a handler takes it decoded.
async fn json(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.nats.fj")]
    async fn take(order: Order) {
        order.check();
        progress::seen();
    }
    let (nats, running) = core_app(n, take).await?;
    let publisher = ruststream::Publisher::new(nats.clone());
    let start = Mark::now();
    for id in 0..n {
        publisher.publish("bench.nats.fj", &OrderOut::new(id)).await?;
    }
    nats.client().flush().await?;
    progress::all_seen().await;
    let end = Mark::now();
    running.shutdown().await?;
    Ok(start.until(end))
}

/// Raw, typed: the same orders encoded with `serde_json`, published with a
/// `content-type` header, and decoded by a consumer that checks the header
/// as the framework does.
async fn raw_json(n: u64) -> Result<Measurement, BoxError> {
    const JSON: &str = "application/json";
    let client = raw_client().await?;
    let mut sub = client.subscribe("bench.nats.rj").await?;
    client.flush().await?;
    let consumer = tokio::spawn(async move {
        let mut seen = 0;
        while let Some(message) = sub.next().await {
            let typed = message
                .headers
                .as_ref()
                .and_then(|h| h.get("content-type"))
                .is_some_and(|v| v.as_str() == JSON);
            if let (true, Ok(order)) = (typed, serde_json::from_slice::<Order>(&message.payload)) {
                order.check();
            }
            progress::seen();
            seen += 1;
            if seen == n {
                return Mark::now();
            }
        }
        Mark::now()
    });
    let start = Mark::now();
    for id in 0..n {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("content-type", JSON);
        let payload = serde_json::to_vec(&OrderOut::new(id))?;
        client
            .publish_with_headers("bench.nats.rj", headers, payload.into())
            .await?;
    }
    client.flush().await?;
    let end = consumer.await?;
    Ok(start.until(end))
}

/// Fills a fresh memory-storage stream with `n` messages (acks pipelined),
/// outside the timed section.
async fn preload(
    client: &async_nats::Client,
    stream: &str,
    subject: &str,
    n: u64,
) -> Result<(), BoxError> {
    let context = jetstream::new(client.clone());
    let _ = context.delete_stream(stream).await;
    context
        .create_stream(jetstream::stream::Config {
            name: stream.to_owned(),
            subjects: vec![subject.to_owned()],
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
    let payload = payload();
    let mut acks = Vec::with_capacity(1024);
    for _ in 0..n {
        acks.push(context.publish(subject.to_owned(), payload.clone()).await?);
        if acks.len() == 1024 {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

/// Framework: a queue-group subscriber on a JetStream durable pull
/// consumer, acking each message.
async fn js(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("benchjs.fw", queue_group = "bench")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    let stream = format!("BENCHJS_FW_{}", std::process::id());
    let nats = NatsBroker::connect(&url()).await?;
    preload(nats.client(), &stream, "benchjs.fw", n).await?;
    progress::expect(n);
    let js = nats
        .jetstream(StreamSpec::new(&stream, ["benchjs.fw"]).pull_window(256))
        .await?;
    let start = Mark::now();
    let running = App::new()
        .broker(js.clone())
        .subscriber(count)
        .start()
        .await?;
    progress::all_seen().await;
    let end = Mark::now();
    running.shutdown().await?;
    js.delete_stream().await?;
    Ok(start.until(end))
}

/// Raw: a durable pull consumer read with `messages()` (async-nats keeps
/// pulls going in the background), acking and counting each message.
async fn raw_js(n: u64) -> Result<Measurement, BoxError> {
    let stream = format!("BENCHJS_RAW_{}", std::process::id());
    let client = raw_client().await?;
    preload(&client, &stream, "benchjs.raw", n).await?;
    let context = jetstream::new(client.clone());
    let start = Mark::now();
    let consumer = context
        .get_stream(&stream)
        .await?
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("bench".to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(256)
        .messages()
        .await?;
    let mut seen = 0;
    while let Some(message) = messages.next().await {
        message?.ack().await?;
        progress::seen();
        seen += 1;
        if seen == n {
            break;
        }
    }
    let end = Mark::now();
    context.delete_stream(&stream).await?;
    Ok(start.until(end))
}
