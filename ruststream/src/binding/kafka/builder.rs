//! Settings of a [`KafkaBroker`](super::KafkaBroker), and the librdkafka
//! configuration they make.

use std::time::Duration;

use rdkafka::ClientConfig;

/// Settings for a [`KafkaBroker`](super::KafkaBroker).
///
/// Everything librdkafka can be told passes through
/// [`property`](Self::property); the rest are the settings the binding
/// itself uses, with defaults that keep memory bounded.
///
/// ```no_run
/// use std::time::Duration;
/// use ruststream::kafka::KafkaBroker;
///
/// # async fn run() -> ruststream::Result<()> {
/// let kafka = KafkaBroker::builder()
///     .client_id("orders-service")
///     .security_protocol("sasl_ssl")
///     .sasl("SCRAM-SHA-512", "orders", "secret")
///     .property("ssl.ca.location", "/etc/ssl/certs/kafka-ca.pem")
///     .prefetch_kbytes(2048)
///     .commit_interval(Duration::from_millis(200))
///     .connect("127.0.0.1:9092")
///     .await?;
/// # drop(kafka); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct KafkaBrokerBuilder {
    pub(crate) client_id: String,
    /// librdkafka properties for every client, in the order they were set.
    pub(crate) properties: Vec<(String, String)>,
    pub(crate) prefetch_kbytes: usize,
    pub(crate) commit_every: usize,
    pub(crate) commit_interval: Duration,
    pub(crate) publish_timeout: Duration,
    pub(crate) spread_keyless: bool,
    pub(crate) metadata_timeout: Duration,
}

impl Default for KafkaBrokerBuilder {
    fn default() -> Self {
        KafkaBrokerBuilder {
            client_id: "ruststream".to_owned(),
            properties: Vec::new(),
            prefetch_kbytes: 4096,
            commit_every: 1024,
            commit_interval: Duration::from_millis(100),
            publish_timeout: Duration::from_secs(10),
            spread_keyless: false,
            metadata_timeout: Duration::from_secs(10),
        }
    }
}

impl KafkaBrokerBuilder {
    /// The `client.id` the broker sees in its logs and quotas (default
    /// `ruststream`).
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Any librdkafka property (`CONFIGURATION.md` of librdkafka), given
    /// to every client this broker makes: the producer, each subscription's
    /// consumer and the reply consumer. Set later wins. Properties the
    /// binding relies on (`enable.auto.commit`, `enable.auto.offset.store`,
    /// `group.id`) are set after these and cannot be changed.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// `security.protocol`: `plaintext` (default), `ssl`, `sasl_plaintext`
    /// or `sasl_ssl`. TLS files and SASL settings beyond
    /// [`sasl`](Self::sasl) go through [`property`](Self::property)
    /// (`ssl.ca.location`, `ssl.certificate.location`, …).
    pub fn security_protocol(self, protocol: impl Into<String>) -> Self {
        self.property("security.protocol", protocol)
    }

    /// SASL with a user name and password: `mechanism` is `PLAIN`,
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub fn sasl(
        self,
        mechanism: impl Into<String>,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.property("sasl.mechanism", mechanism)
            .property("sasl.username", username)
            .property("sasl.password", password)
    }

    /// KiB of fetched records librdkafka may hold per subscription before
    /// the handlers take them (`queued.max.messages.kbytes`; default 4096,
    /// librdkafka's own default is 65536). librdkafka also caps one fetch
    /// (`fetch.max.bytes`) at this size, but never below the largest
    /// record (`message.max.bytes`). When the queue is full librdkafka
    /// waits `fetch.queue.backoff.ms` before fetching again: the binding
    /// sets it to 10 ms (librdkafka's default is 1000 ms, a visible stall
    /// each time the handlers drain a small queue) unless a
    /// [`property`](Self::property) sets it.
    pub fn prefetch_kbytes(mut self, kbytes: usize) -> Self {
        self.prefetch_kbytes = kbytes.max(1);
        self
    }

    /// Settled records after which a subscription commits at once
    /// (default 1024). Commits are coalesced: each commits the settled
    /// prefix of every partition that moved.
    pub fn commit_every(mut self, records: usize) -> Self {
        self.commit_every = records.max(1);
        self
    }

    /// How long a settlement may wait for its commit (default 100 ms).
    /// Commits also go out when a partition is revoked and when the
    /// broker closes.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Where messages without a key go. By default, to partition 0, so
    /// they keep their publish order as they do on every other broker;
    /// `true` lets librdkafka's partitioner spread them over the
    /// partitions (no order between them). Messages with a key always go
    /// to their key's partition.
    pub fn spread_keyless(mut self, spread: bool) -> Self {
        self.spread_keyless = spread;
        self
    }

    /// How long metadata, watermark and offset look-ups may take (default
    /// 10 s): at subscribe, and when a partition is assigned.
    pub fn metadata_timeout(mut self, timeout: Duration) -> Self {
        self.metadata_timeout = timeout;
        self
    }

    /// The configuration every client starts from.
    pub(crate) fn client_config(&self, bootstrap: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("client.id", &self.client_id);
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }

    /// A subscription's consumer: offsets are committed by the binding
    /// only, librdkafka's prefetch is bounded.
    pub(crate) fn consumer_config(&self, bootstrap: &str, group: &str) -> ClientConfig {
        let mut config = self.client_config(bootstrap);
        if config.get("auto.offset.reset").is_none() {
            // Where a committed offset is gone (retention): the oldest
            // record left, so nothing is skipped.
            config.set("auto.offset.reset", "earliest");
        }
        if config.get("fetch.queue.backoff.ms").is_none() {
            // When its prefetch queue counts as full, librdkafka waits this
            // long before fetching again (default 1000 ms): with a small
            // `prefetch_kbytes` a second's stall each time the handlers
            // drain the queue.
            config.set("fetch.queue.backoff.ms", "10");
        }
        let kbytes = self.prefetch_kbytes;
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("queued.max.messages.kbytes", kbytes.to_string())
            .set("queued.min.messages", "1000");
        config
    }
}
