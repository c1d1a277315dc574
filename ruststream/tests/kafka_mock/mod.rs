//! librdkafka's mock cluster: a real Kafka-protocol server (produce,
//! fetch, consumer groups, offset commits, topic auto-creation) running
//! inside the test process on loopback ports, so the Kafka tests need no
//! Kafka installation. Other processes (the fault tests' app processes)
//! reach it by its bootstrap address like any cluster.
//!
//! What it cannot do: no CreateTopics/DeleteTopics API (topics are
//! auto-created with 4 partitions), no TLS or SASL, no transactions across
//! restarts, and nothing is kept on disk (taking a broker down keeps its
//! log; there is no process to kill -9).

use rdkafka::ClientConfig;
use rdkafka::bindings as raw;
use rdkafka::producer::BaseProducer;

/// A mock cluster, alive as long as this value.
pub struct MockKafka {
    /// The client that owns the cluster (`test.mock.num.brokers`).
    owner: BaseProducer,
}

impl MockKafka {
    /// A cluster of `brokers` brokers whose groups form at once (a real
    /// broker's `group.initial.rebalance.delay.ms` is 3 s by default,
    /// which only slows tests down).
    pub fn start(brokers: u32) -> MockKafka {
        let owner: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", brokers.to_string())
            .create()
            .expect("librdkafka's mock cluster starts");
        let mock = MockKafka { owner };
        // SAFETY: the pointer is the owner's mock cluster, alive while
        // `owner` is; this setter only stores a number.
        unsafe { raw::rd_kafka_mock_group_initial_rebalance_delay_ms(mock.cluster(), 0) };
        mock
    }

    fn cluster(&self) -> *mut raw::rd_kafka_mock_cluster_t {
        use rdkafka::producer::Producer;
        // SAFETY: the owner was made with `test.mock.num.brokers`.
        let cluster =
            unsafe { raw::rd_kafka_handle_mock_cluster(self.owner.client().native_ptr()) };
        assert!(!cluster.is_null(), "the owner has a mock cluster");
        cluster
    }

    /// `host:port,…` of its brokers, all on 127.0.0.1.
    pub fn bootstrap(&self) -> String {
        use rdkafka::producer::Producer;
        self.owner
            .client()
            .mock_cluster()
            .expect("a mock cluster")
            .bootstrap_servers()
    }

    /// Takes broker `id` (1-based) down: its connections close and new
    /// ones are refused until [`up`](Self::up).
    pub fn down(&self, id: i32) {
        use rdkafka::producer::Producer;
        self.owner
            .client()
            .mock_cluster()
            .unwrap()
            .broker_down(id)
            .unwrap();
    }

    /// Brings broker `id` back.
    pub fn up(&self, id: i32) {
        use rdkafka::producer::Producer;
        self.owner
            .client()
            .mock_cluster()
            .unwrap()
            .broker_up(id)
            .unwrap();
    }

    /// The group refuses the next `n` offset commits, as it does while a
    /// rebalance is in progress.
    #[allow(
        dead_code,
        reason = "used by some of the test files that include this module"
    )]
    pub fn refuse_commits(&self, n: usize) {
        use rdkafka::producer::Producer;
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        let errors = vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS; n];
        self.owner
            .client()
            .mock_cluster()
            .unwrap()
            .request_errors(RDKafkaApiKey::OffsetCommit, &errors);
    }
}
