//! Redis Streams scenarios next to the raw `redis` client in the same
//! process: 100k preloaded entries of 512 bytes read by one consumer of a
//! group, 100 per read. The raw side acks each batch with one `XACK`; the
//! framework acks per message, coalesced by the binding, with a handler
//! per message (`redis-streams`) or per batch (`redis-streams-batch`).

use ruststream::bytes::Bytes;
use ruststream::redis::RedisBroker;
use ruststream::{App, BoxError, IntoSubscriber, subscriber};

use crate::progress;
use crate::scenarios::{Mark, Measurement};

/// The scenarios that need Redis.
pub const NAMES: &[&str] = &["redis-streams", "redis-streams-batch", "raw-redis-streams"];

const BATCH: usize = 100;

/// Runs Redis scenario `name` over `n` entries; `None` for other names.
pub async fn run(name: &str, n: u64) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "redis-streams" => framework(n).await,
        "redis-streams-batch" => framework_batch(n).await,
        "raw-redis-streams" => raw(n).await,
        _ => return None,
    })
}

pub(crate) fn url() -> String {
    std::env::var("RUSTSTREAM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A fresh stream of `n` entries with a group at its start, outside the
/// timed section.
async fn preload(stream: &str, n: u64) -> Result<redis::aio::MultiplexedConnection, BoxError> {
    let client = redis::Client::open(url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("DEL").arg(stream).query_async(&mut conn).await?;
    let payload = vec![b'x'; 512];
    let mut sent = 0;
    while sent < n {
        let mut pipe = redis::pipe();
        for _ in 0..1000.min(n - sent) {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("p")
                .arg(&payload[..])
                .ignore();
            sent += 1;
        }
        let _: () = pipe.query_async(&mut conn).await?;
    }
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("bench")
        .arg("0")
        .query_async(&mut conn)
        .await?;
    Ok(conn)
}

async fn framework(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.redis.fw", queue_group = "bench")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    through_app(count, "bench.redis.fw", n).await
}

/// The same with a batch handler (`batch(max = 100)`): one handler call
/// per read.
async fn framework_batch(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.redis.batch", queue_group = "bench", batch(max = 100))]
    async fn count(payloads: Vec<Bytes>) {
        progress::seen_many(payloads.len());
    }
    through_app(count, "bench.redis.batch", n).await
}

/// `n` preloaded entries of `stream` through an app running `subscriber`.
async fn through_app<M>(
    subscriber: impl IntoSubscriber<M>,
    stream: &str,
    n: u64,
) -> Result<Measurement, BoxError> {
    let mut conn = preload(stream, n).await?;
    progress::expect(n);
    let redis = RedisBroker::builder()
        .read_count(BATCH)
        .connect(&url())
        .await?;
    let start = Mark::now();
    let running = App::new().broker(redis).subscriber(subscriber).start().await?;
    progress::all_seen().await;
    let end = Mark::now();
    running.shutdown().await?;
    let _: () = redis::cmd("DEL").arg(stream).query_async(&mut conn).await?;
    Ok(start.until(end))
}

async fn raw(n: u64) -> Result<Measurement, BoxError> {
    let mut conn = preload("bench.redis.raw", n).await?;
    let start = Mark::now();
    let mut seen = 0u64;
    while seen < n {
        let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("bench")
            .arg("raw")
            .arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg("bench.redis.raw")
            .arg(">")
            .query_async(&mut conn)
            .await?;
        let ids: Vec<String> = reply
            .keys
            .into_iter()
            .flat_map(|k| k.ids)
            .map(|entry| {
                if let Some(redis::Value::BulkString(payload)) = entry.map.get("p") {
                    std::hint::black_box(Bytes::from(payload.clone()));
                }
                progress::seen();
                entry.id
            })
            .collect();
        seen += ids.len() as u64;
        if !ids.is_empty() {
            let _: () = redis::cmd("XACK")
                .arg("bench.redis.raw")
                .arg("bench")
                .arg(ids)
                .query_async(&mut conn)
                .await?;
        }
    }
    let end = Mark::now();
    let _: () = redis::cmd("DEL")
        .arg("bench.redis.raw")
        .query_async(&mut conn)
        .await?;
    Ok(start.until(end))
}
