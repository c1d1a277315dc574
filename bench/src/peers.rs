//! Our side of `bench/peers/faststream.sh`, which runs FastStream's
//! subscribers on the same workload: each consumer is its own process, and
//! the messages come from another one, so what a consumer's process costs
//! is the consuming alone.
//!
//! * `peer-nats-core`, `peer-redis-streams`, `peer-rabbitmq`: an app with
//!   one subscriber on `bench.peers` consumes N messages of 512 bytes; its
//!   `secs` and `cpu_s` (the process's CPU time, all threads) span the
//!   first message handled to the N-th, and it also prints `peak_rss_kib`:
//!   the process's peak resident set (`VmHWM`) when the N-th message was
//!   handled. On NATS it
//!   prints `ready` once subscribed, and `handled=<k>` every
//!   [`REPORT_EVERY`] messages, which the driver passes on to the
//!   publisher.
//! * `peer-publish-nats`: publishes N raw messages to `bench.peers` (no
//!   headers) with `async-nats`, at most [`AHEAD`] beyond the last
//!   `handled=<k>` line on its standard input, then flushes. Core NATS has
//!   no flow control: nats-server cuts off a subscriber that falls behind by
//!   more than it can write within its deadline (10 s), and a publisher
//!   that outran a slow consumer by all N messages got FastStream's
//!   subscriber cut off on a loaded machine. A consumer that keeps up never
//!   waits for credit.
//! * `peer-load-rabbitmq`: fills the durable queue `bench@bench.peers` (the
//!   one group `bench` on subject `bench.peers` reads) with N raw messages,
//!   publisher confirms awaited.
//!
//! The driver loads the Redis stream itself, as each framework's publisher
//! would write it.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Duration;

use ruststream::bytes::Bytes;
use ruststream::nats::NatsBroker;
use ruststream::rabbitmq::RabbitBroker;
use ruststream::redis::RedisBroker;
use ruststream::{App, BoxError, Broker, subscriber};

use crate::progress;
use crate::scenarios::{Mark, Measurement};

/// The scenarios `bench/peers/faststream.sh` runs.
pub const NAMES: &[&str] = &[
    "peer-nats-core",
    "peer-redis-streams",
    "peer-rabbitmq",
    "peer-publish-nats",
    "peer-load-rabbitmq",
];

/// The subject, stream or routing key of every peer scenario.
const SUBJECT: &str = "bench.peers";
/// The RabbitMQ queue of group `bench` on [`SUBJECT`].
const QUEUE: &str = "bench@bench.peers";
/// Entries per `XREADGROUP` (FastStream: `max_records`).
const READ_COUNT: usize = 100;
/// Unacknowledged deliveries RabbitMQ may send ahead (FastStream: the
/// channel's `prefetch_count`).
const PREFETCH: u16 = 256;
/// Core NATS messages the subscription may buffer: more than any run sends,
/// so a burst is never dropped.
const CAPACITY: usize = 1 << 17;
/// How often a NATS consumer reports how many messages it has handled.
const REPORT_EVERY: u64 = 1_000;
/// How many messages the NATS publisher may be ahead of the consumer:
/// about 5.5 MB, which even a consumer doing 1,000 msgs/s drains within
/// nats-server's write deadline.
const AHEAD: u64 = 10_000;

/// Runs peer scenario `name` over `n` messages; `None` for other names.
pub async fn run(name: &str, n: u64) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "peer-nats-core" => nats_core(n).await,
        "peer-redis-streams" => redis_streams(n).await,
        "peer-rabbitmq" => rabbitmq(n).await,
        "peer-publish-nats" => publish_nats(n).await,
        "peer-load-rabbitmq" => load_rabbitmq(n).await,
        _ => return None,
    })
}

/// The peak resident set of this process so far (`VmHWM`), in KiB.
fn peak_rss_kib() -> Result<u64, BoxError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmHWM in /proc/self/status".into())
}

/// When the first message was handled; every scenario here runs once per
/// process.
static FIRST: OnceLock<Mark> = OnceLock::new();

/// The handlers' body: stamp the first message, count every one.
fn handled() {
    FIRST.get_or_init(Mark::now);
    progress::seen();
}

/// Starts `app`, waits for `n` handled messages (bounded: a consumer that
/// stalls fails the run), and measures from the first to the last.
async fn consume<B: Broker>(
    app: App<B>,
    n: u64,
    ready: impl AsyncFnOnce() -> Result<(), BoxError>,
) -> Result<Measurement, BoxError> {
    progress::expect(n);
    let running = app.start().await?;
    ready().await?;
    if tokio::time::timeout(Duration::from_secs(600), progress::all_seen())
        .await
        .is_err()
    {
        return Err(format!("saw {} of {n} messages in 600 s", progress::count()).into());
    }
    let end = Mark::now();
    let peak_rss_kib = peak_rss_kib()?;
    let first = FIRST.get().copied().ok_or("no message handled")?;
    running.shutdown().await?;
    Ok(Measurement {
        peak_rss_kib: Some(peak_rss_kib),
        ..first.until(end)
    })
}

/// Core NATS: a plain subscription (no queue group), fed by
/// `peer-publish-nats` once this prints `ready`.
async fn nats_core(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.peers")]
    async fn count(_payload: Bytes) {
        handled();
        let seen = progress::count();
        if seen.is_multiple_of(REPORT_EVERY) {
            println!("handled={seen}");
        }
    }
    let nats = NatsBroker::builder()
        .subscription_capacity(CAPACITY)
        .connect(&crate::nats::url())
        .await?;
    let app = App::new().broker(nats.clone()).subscriber(count);
    consume(app, n, async || {
        // The server has the subscription once a round trip after it is back.
        nats.client().flush().await?;
        println!("ready");
        std::io::stdout().flush()?;
        Ok(())
    })
    .await
}

/// Redis Streams: one consumer of group `bench` on the preloaded stream,
/// [`READ_COUNT`] entries per read, every entry acknowledged.
async fn redis_streams(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.peers", queue_group = "bench")]
    async fn count(_payload: Bytes) {
        handled();
    }
    let redis = RedisBroker::builder()
        .read_count(READ_COUNT)
        .connect(&crate::redis::url())
        .await?;
    consume(App::new().broker(redis).subscriber(count), n, async || Ok(())).await
}

/// RabbitMQ: group `bench` reads the preloaded queue [`QUEUE`] with a
/// prefetch of [`PREFETCH`], every delivery acknowledged.
async fn rabbitmq(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.peers", queue_group = "bench")]
    async fn count(_payload: Bytes) {
        handled();
    }
    let rabbit = RabbitBroker::builder()
        .prefetch(PREFETCH)
        .connect(&crate::rabbitmq::url())
        .await?;
    consume(App::new().broker(rabbit).subscriber(count), n, async || Ok(())).await
}

/// `n` raw 512-byte messages to [`SUBJECT`], as fast as the client takes
/// them while the consumer's last report on standard input leaves credit.
async fn publish_nats(n: u64) -> Result<Measurement, BoxError> {
    let client = async_nats::connect(crate::nats::url()).await?;
    let (report, mut handled) = tokio::sync::watch::channel(0);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Some(k) = line.ok().and_then(|l| l.strip_prefix("handled=")?.parse().ok()) else {
                continue;
            };
            if report.send(k).is_err() {
                return;
            }
        }
    });
    let payload = Bytes::from(vec![b'x'; 512]);
    let start = Mark::now();
    let mut sent = 0;
    while sent < n {
        let credit = (*handled.borrow_and_update() + AHEAD).min(n);
        if sent == credit {
            client.flush().await?;
            handled
                .changed()
                .await
                .map_err(|_| format!("stdin closed after {sent} of {n} messages"))?;
            continue;
        }
        for _ in sent..credit {
            client.publish(SUBJECT, payload.clone()).await?;
        }
        sent = credit;
    }
    client.flush().await?;
    Ok(start.until(Mark::now()))
}

/// [`QUEUE`], emptied and then holding `n` raw 512-byte messages.
async fn load_rabbitmq(n: u64) -> Result<Measurement, BoxError> {
    let conn =
        lapin::Connection::connect(&crate::rabbitmq::url(), Default::default()).await?;
    let start = Mark::now();
    crate::rabbitmq::preload(&conn, QUEUE, n).await?;
    Ok(start.until(Mark::now()))
}
