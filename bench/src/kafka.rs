//! Kafka scenarios next to a raw rdkafka `StreamConsumer` in the same
//! process: 512 B records preloaded round-robin over 16 partitions,
//! consumed by a group from the beginning. Raw: `recv`, copy the payload,
//! `commit_message` (async) for each record, with the binding's prefetch
//! settings. Framework: the default loop, acks coalesced into one commit
//! per `commit_every` records or `commit_interval`.
//!
//! Runs on the cluster at `RUSTSTREAM_KAFKA_BOOTSTRAP`, else on
//! librdkafka's mock cluster started in this process. The mock cluster
//! keeps only about 5 MiB per partition (older segments are dropped), so
//! 100k records on a few partitions would lose records and leave the
//! consumer waiting for them: the preload spreads them over 16 partitions
//! and checks every partition's watermarks (low 0, highs summing to N)
//! before anything is timed. Every wait is bounded and fails with what it
//! saw.

use std::time::Duration;

use ruststream::BoxError;
use ruststream::bytes::Bytes;
use ruststream::kafka::KafkaBroker;
use ruststream::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream::kafka::rdkafka::client::DefaultClientContext;
use ruststream::kafka::rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use ruststream::kafka::rdkafka::producer::{
    BaseRecord, DefaultProducerContext, Producer, ThreadedProducer,
};
use ruststream::kafka::rdkafka::{ClientConfig, Message as _, bindings};
use ruststream::prelude::*;
use ruststream::subscriber::SubscriberConfig;

use crate::progress;
use crate::scenarios::{Mark, Measurement};

pub const NAMES: &[&str] = &["kafka", "raw-kafka"];

/// Partitions of a bench topic: 100k records of 512 B stay well under the
/// mock cluster's ~5 MiB per partition.
const PARTITIONS: i32 = 16;

/// How long the consumers may take for all records before the run fails.
const CONSUME_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn run(name: &str, n: u64) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "kafka" => framework(n).await,
        "raw-kafka" => raw(n).await,
        _ => return None,
    })
}

/// A cluster for one run: the given one, or a mock cluster that lives as
/// long as the returned producer.
struct Cluster {
    bootstrap: String,
    producer: ThreadedProducer<DefaultProducerContext>,
    mock: bool,
}

impl Cluster {
    fn start() -> Result<Cluster, BoxError> {
        let given = std::env::var("RUSTSTREAM_KAFKA_BOOTSTRAP").ok();
        let mut config = ClientConfig::new();
        config.set("linger.ms", "5");
        match &given {
            Some(bootstrap) => config.set("bootstrap.servers", bootstrap),
            None => config.set("test.mock.num.brokers", "1"),
        };
        let producer: ThreadedProducer<DefaultProducerContext> = config.create()?;
        let (bootstrap, mock) = match given {
            Some(bootstrap) => (bootstrap, false),
            None => {
                // SAFETY: the producer owns this mock cluster while it lives;
                // the setter only stores a number (groups form at once).
                unsafe {
                    let mock =
                        bindings::rd_kafka_handle_mock_cluster(producer.client().native_ptr());
                    bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(mock, 0);
                }
                let mock = producer.client().mock_cluster().ok_or("no mock cluster")?;
                (mock.bootstrap_servers(), true)
            }
        };
        Ok(Cluster {
            bootstrap,
            producer,
            mock,
        })
    }

    /// A fresh topic of [`PARTITIONS`] partitions.
    async fn topic(&self, prefix: &str) -> Result<String, BoxError> {
        let topic = format!("{prefix}.{}.{}", std::process::id(), unique());
        if self.mock {
            let mock = self.producer.client().mock_cluster().ok_or("no mock cluster")?;
            mock.create_topic(&topic, PARTITIONS, 1)?;
            return Ok(topic);
        }
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let new = NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let created = tokio::time::timeout(
            Duration::from_secs(15),
            admin.create_topics([&new], &options),
        )
        .await
        .map_err(|_| format!("creating topic `{topic}` took over 15 s"))??;
        for result in created {
            result.map_err(|(topic, err)| format!("creating topic `{topic}`: {err}"))?;
        }
        Ok(topic)
    }

    /// `n` records of 512 B, round-robin over the partitions of `topic`;
    /// then checks that the cluster holds exactly them.
    fn preload(&self, topic: &str, n: u64) -> Result<(), BoxError> {
        let payload = vec![b'x'; 512];
        let started = std::time::Instant::now();
        for i in 0..n {
            let partition = (i % PARTITIONS as u64) as i32;
            let mut record = BaseRecord::<(), [u8]>::to(topic)
                .payload(&payload)
                .partition(partition);
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((err, back)) => {
                        if err.rdkafka_error_code()
                            != Some(ruststream::kafka::rdkafka::types::RDKafkaErrorCode::QueueFull)
                        {
                            return Err(err.into());
                        }
                        if started.elapsed() > Duration::from_secs(120) {
                            return Err(format!("preload: {i} of {n} records queued in 120 s").into());
                        }
                        record = back;
                        // Waits for the producer's queue to drain (a
                        // producer backoff, not a synchronisation).
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
        }
        self.producer.flush(Duration::from_secs(60))?;
        let mut stored = 0;
        for partition in 0..PARTITIONS {
            let (low, high) = self.producer.client().fetch_watermarks(
                topic,
                partition,
                Duration::from_secs(10),
            )?;
            if low != 0 {
                return Err(format!(
                    "preload: partition {partition} of `{topic}` starts at offset {low}, not 0: \
                     the cluster dropped records (the mock cluster keeps ~5 MiB per partition)"
                )
                .into());
            }
            stored += high;
        }
        if stored != n as i64 {
            return Err(format!("preload: `{topic}` holds {stored} records, not {n}").into());
        }
        Ok(())
    }

    /// Consumer settings for both sides: on the mock cluster a fetch waits
    /// at most 10 ms for data (librdkafka's 500 ms default shows as idle
    /// gaps on an in-process broker).
    fn consumer_properties(&self) -> Vec<(&'static str, &'static str)> {
        let mut properties = vec![("auto.offset.reset", "earliest")];
        if self.mock {
            properties.push(("fetch.wait.max.ms", "10"));
        }
        properties
    }
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

async fn framework(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench.kafka.fw", queue_group = "bench")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    let cluster = Cluster::start()?;
    let topic = cluster.topic("bench.kafka.fw").await?;
    cluster.preload(&topic, n)?;
    progress::expect(n);
    let mut kafka = KafkaBroker::builder();
    for (key, value) in cluster.consumer_properties() {
        kafka = kafka.property(key, value);
    }
    let kafka = kafka.connect(&cluster.bootstrap).await?;
    let start = Mark::now();
    let running = App::new()
        .broker(kafka)
        .subscriber(count.configure({
            let topic = topic.clone();
            // The same subscriber on this run's topic.
            move |_| SubscriberConfig::new(topic).queue_group("bench")
        }))
        .start()
        .await?;
    let all = tokio::time::timeout(CONSUME_TIMEOUT, progress::all_seen()).await;
    let end = Mark::now();
    if all.is_err() {
        let seen = progress::count();
        let _ = tokio::time::timeout(Duration::from_secs(10), running.shutdown()).await;
        return Err(format!(
            "the framework handled {seen} of {n} records in {} s",
            CONSUME_TIMEOUT.as_secs()
        )
        .into());
    }
    tokio::time::timeout(Duration::from_secs(30), running.shutdown())
        .await
        .map_err(|_| "the app did not shut down within 30 s")??;
    drop(cluster);
    Ok(start.until(end))
}

async fn raw(n: u64) -> Result<Measurement, BoxError> {
    let cluster = Cluster::start()?;
    let topic = cluster.topic("bench.kafka.raw").await?;
    cluster.preload(&topic, n)?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &cluster.bootstrap)
        .set("group.id", "bench-raw")
        .set("enable.auto.commit", "false")
        // What the binding sets by default: the same prefetch bound, and
        // fetching again 10 ms (not librdkafka's 1 s) after the queue was
        // full, so the pair compares commits, not a default.
        .set("queued.max.messages.kbytes", "4096")
        .set("fetch.queue.backoff.ms", "10");
    for (key, value) in cluster.consumer_properties() {
        config.set(key, value);
    }
    let consumer: StreamConsumer = config.create()?;
    let start = Mark::now();
    consumer.subscribe(&[topic.as_str()])?;
    let mut seen = 0u64;
    let consumed = tokio::time::timeout(CONSUME_TIMEOUT, async {
        while seen < n {
            let record = consumer.recv().await?;
            std::hint::black_box(Bytes::copy_from_slice(record.payload().unwrap_or_default()));
            consumer.commit_message(&record, CommitMode::Async)?;
            progress::seen();
            seen += 1;
        }
        Ok::<(), BoxError>(())
    })
    .await;
    let end = Mark::now();
    match consumed {
        Ok(result) => result?,
        Err(_) => {
            return Err(format!(
                "the raw consumer received {seen} of {n} records in {} s",
                CONSUME_TIMEOUT.as_secs()
            )
            .into());
        }
    }
    drop(consumer);
    drop(cluster);
    Ok(start.until(end))
}
