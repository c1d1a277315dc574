//! RabbitMQ next to the raw `lapin` client in the same process: 100k
//! preloaded messages of 512 bytes consumed with a prefetch of 256. The raw
//! side acks each delivery on its own; the framework coalesces contiguous
//! acks into `basic.ack(multiple)`.

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use ruststream::bytes::Bytes;
use ruststream::rabbitmq::RabbitBroker;
use ruststream::{App, BoxError, subscriber};

use crate::progress;
use crate::scenarios::{Mark, Measurement};

/// The scenarios that need RabbitMQ.
pub const NAMES: &[&str] = &["rabbitmq", "raw-rabbitmq"];

const PREFETCH: u16 = 256;

/// Runs RabbitMQ scenario `name` over `n` messages; `None` for other names.
pub async fn run(name: &str, n: u64) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "rabbitmq" => framework(n).await,
        "raw-rabbitmq" => raw(n).await,
        _ => return None,
    })
}

pub(crate) fn url() -> String {
    std::env::var("RUSTSTREAM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A durable queue holding `n` messages, outside the timed section.
pub(crate) async fn preload(conn: &Connection, queue: &str, n: u64) -> Result<lapin::Channel, BoxError> {
    let channel = conn.create_channel().await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_purge(queue.into(), QueuePurgeOptions::default())
        .await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let payload = vec![b'x'; 512];
    for _ in 0..n {
        // Confirms are awaited together below.
        let _confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &payload,
                BasicProperties::default(),
            )
            .await?;
    }
    channel.wait_for_confirms().await?;
    Ok(channel)
}

async fn framework(n: u64) -> Result<Measurement, BoxError> {
    // The framework's queue for group `bench` on subject `bench.rabbit`.
    #[subscriber("bench.rabbit", queue_group = "bench")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    let conn = Connection::connect(&url(), ConnectionProperties::default()).await?;
    let rabbit = RabbitBroker::builder()
        .prefetch(PREFETCH)
        .connect(&url())
        .await?;
    // Declares and binds the group's queue, then loads it directly.
    let probe = App::new()
        .broker(rabbit.clone())
        .subscriber(count)
        .start()
        .await?;
    probe.shutdown().await?;
    let rabbit = RabbitBroker::builder()
        .prefetch(PREFETCH)
        .connect(&url())
        .await?;
    let loader = preload(&conn, "bench@bench.rabbit", n).await?;
    progress::expect(n);
    let start = Mark::now();
    let running = App::new().broker(rabbit).subscriber(count).start().await?;
    progress::all_seen().await;
    let end = Mark::now();
    running.shutdown().await?;
    loader
        .queue_purge("bench@bench.rabbit".into(), QueuePurgeOptions::default())
        .await?;
    Ok(start.until(end))
}

async fn raw(n: u64) -> Result<Measurement, BoxError> {
    let conn = Connection::connect(&url(), ConnectionProperties::default()).await?;
    let loader = preload(&conn, "bench.raw-rabbit", n).await?;
    let channel = conn.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let start = Mark::now();
    let mut consumer = channel
        .basic_consume(
            "bench.raw-rabbit".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut seen = 0;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        std::hint::black_box(Bytes::from(delivery.data));
        delivery.acker.ack(BasicAckOptions::default()).await?;
        progress::seen();
        seen += 1;
        if seen == n {
            break;
        }
    }
    let end = Mark::now();
    loader
        .queue_purge("bench.raw-rabbit".into(), QueuePurgeOptions::default())
        .await?;
    Ok(start.until(end))
}
