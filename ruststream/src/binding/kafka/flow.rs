//! The receive-flow switch of a Kafka subscription: PAUSED pauses every
//! assigned partition, so librdkafka stops fetching (and drops what it had
//! fetched for them; it fetches again from the same place on resume).
//! Partitions assigned while paused start paused.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, Weak};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;

use super::subscription::Consumer_;
use crate::ingress::ReceiveFlow;

/// Pauses and resumes a subscription's partitions.
pub(crate) struct KafkaFlow {
    consumer: Weak<Consumer_>,
    /// Partitions paused for a held retry copy: RUNNING leaves them paused.
    held: Mutex<HashSet<(String, i32)>>,
}

impl KafkaFlow {
    pub(crate) fn new(consumer: Weak<Consumer_>) -> Self {
        KafkaFlow {
            consumer,
            held: Mutex::new(HashSet::new()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashSet<(String, i32)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A partition paused for a held retry copy.
    pub(crate) fn hold(&self, topic: &str, partition: i32) {
        self.held().insert((topic.to_owned(), partition));
    }

    /// The held copy of a partition was handed out: true when the flow is
    /// paused, so the partition stays paused.
    pub(crate) fn release(&self, topic: &str, partition: i32) -> bool {
        self.held().remove(&(topic.to_owned(), partition));
        self.consumer
            .upgrade()
            .is_some_and(|c| c.context().paused.load(Ordering::Acquire))
    }
}

impl ReceiveFlow for KafkaFlow {
    fn set_paused(&self, paused: bool) {
        let Some(consumer) = self.consumer.upgrade() else {
            return;
        };
        consumer.context().paused.store(paused, Ordering::Release);
        let Ok(assigned) = consumer.assignment() else {
            return;
        };
        let result = if paused {
            consumer.pause(&assigned)
        } else {
            let held = self.held();
            let mut running = TopicPartitionList::new();
            for elem in assigned.elements() {
                if !held.contains(&(elem.topic().to_owned(), elem.partition())) {
                    running.add_partition(elem.topic(), elem.partition());
                }
            }
            consumer.resume(&running)
        };
        if let Err(err) = result {
            tracing::warn!(error = %err, paused, "Kafka: pausing or resuming partitions failed");
            crate::metrics::connection_event("kafka", "flow_failed");
        }
    }
}
