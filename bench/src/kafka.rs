//! Kafka scenarios next to a raw rdkafka `StreamConsumer` in the same
//! process: 512 B records preloaded on one partition, consumed by a group
//! from the beginning. Raw: `recv`, copy the payload, `commit_message`
//! (async) for each record. Framework: the default loop, acks coalesced
//! into one commit per `commit_every` records or `commit_interval`.
//!
//! Runs on the cluster at `RUSTSTREAM_KAFKA_BOOTSTRAP`, else on
//! librdkafka's mock cluster started in this process.

use std::time::Duration;

use ruststream::bytes::Bytes;
use ruststream::kafka::KafkaBroker;
use ruststream::kafka::rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use ruststream::kafka::rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use ruststream::kafka::rdkafka::{ClientConfig, Message as _, bindings};
use ruststream::prelude::*;
use ruststream::BoxError;

use crate::progress;
use crate::scenarios::{Mark, Measurement};

pub const NAMES: &[&str] = &["kafka", "raw-kafka"];

pub async fn run(name: &str, n: u64) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "kafka" => framework(n).await,
        "raw-kafka" => raw(n).await,
        _ => return None,
    })
}

/// A cluster for one run: the given one, or a mock cluster that lives as
/// long as the returned producer.
fn cluster() -> Result<(String, ThreadedProducer<DefaultProducerContext>), BoxError> {
    let given = std::env::var("RUSTSTREAM_KAFKA_BOOTSTRAP").ok();
    let mut config = ClientConfig::new();
    config.set("linger.ms", "5");
    match &given {
        Some(bootstrap) => config.set("bootstrap.servers", bootstrap),
        None => config.set("test.mock.num.brokers", "1"),
    };
    let producer: ThreadedProducer<DefaultProducerContext> = config.create()?;
    let bootstrap = match given {
        Some(bootstrap) => bootstrap,
        None => {
            // SAFETY: the producer owns this mock cluster while it lives;
            // the setter only stores a number (groups form at once).
            unsafe {
                let mock = bindings::rd_kafka_handle_mock_cluster(producer.client().native_ptr());
                bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(mock, 0);
            }
            producer.client().mock_cluster().ok_or("no mock cluster")?.bootstrap_servers()
        }
    };
    Ok((bootstrap, producer))
}

/// `n` records of 512 B on partition 0 of `topic`.
fn preload(producer: &ThreadedProducer<DefaultProducerContext>, topic: &str, n: u64) -> Result<(), BoxError> {
    let payload = vec![b'x'; 512];
    for _ in 0..n {
        let mut record = BaseRecord::<(), [u8]>::to(topic).payload(&payload).partition(0);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((err, back)) => {
                    if err.rdkafka_error_code()
                        != Some(ruststream::kafka::rdkafka::types::RDKafkaErrorCode::QueueFull)
                    {
                        return Err(err.into());
                    }
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

async fn framework(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.kafka.fw", queue_group = "bench")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    let (bootstrap, producer) = cluster()?;
    preload(&producer, "bench.kafka.fw", n)?;
    progress::expect(n);
    let kafka = KafkaBroker::builder()
        .property("auto.offset.reset", "earliest")
        .connect(&bootstrap)
        .await?;
    let start = Mark::now();
    let running = App::new().broker(kafka).subscriber(count).start().await?;
    progress::all_seen().await;
    let end = Mark::now();
    running.shutdown().await?;
    drop(producer);
    Ok(start.until(end))
}

async fn raw(n: u64) -> Result<Measurement, BoxError> {
    let (bootstrap, producer) = cluster()?;
    preload(&producer, "bench.kafka.raw", n)?;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "bench-raw")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("queued.max.messages.kbytes", "4096")
        .create()?;
    let start = Mark::now();
    consumer.subscribe(&["bench.kafka.raw"])?;
    let mut seen = 0u64;
    while seen < n {
        let record = consumer.recv().await?;
        std::hint::black_box(Bytes::copy_from_slice(record.payload().unwrap_or_default()));
        consumer.commit_message(&record, CommitMode::Async)?;
        seen += 1;
    }
    let end = Mark::now();
    drop(consumer);
    drop(producer);
    Ok(start.until(end))
}
