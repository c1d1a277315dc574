//! A consumer group member's side of rebalances: where an assigned
//! partition starts, its settlement window, and the last commit when it is
//! revoked.
//!
//! * Assigned: the partition starts at the group's committed offset; a
//!   partition the group never committed starts where the topic ended when
//!   the subscription was made (so nothing published after `subscribe`
//!   returned is missed, and nothing older is read), or at the beginning
//!   for a partition that did not exist then. The commit metadata says how
//!   often the record at the committed offset was handed out before.
//! * Revoked: the settled prefix is committed synchronously, before the
//!   partition goes, with how often its first unsettled record was handed
//!   out; settlements that come later are ignored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::commits::Mark;
use super::offsets::{Commit, PartitionAcks};

/// How long a rebalance waits for the group's committed offsets.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(10);

/// A topic and partition.
pub(crate) type Partition = (Arc<str>, i32);

/// The consumer context of a subscription.
#[derive(Default)]
pub(crate) struct GroupContext {
    /// Settlement windows of the partitions assigned now.
    windows: Mutex<HashMap<Partition, Arc<PartitionAcks>>>,
    /// Where each partition ended when the subscription was made: the start
    /// of a partition the group never committed.
    pub(crate) ends: Mutex<HashMap<(String, i32), i64>>,
    /// Set while the receive flow is paused: newly assigned partitions are
    /// paused too.
    pub(crate) paused: AtomicBool,
    /// Whether the subscription commits (queue groups do; a fan-out
    /// subscription reads on its own and commits nothing).
    pub(crate) commits: bool,
}

impl ClientContext for GroupContext {}

impl GroupContext {
    /// A context for a subscription that commits when `commits`.
    pub(crate) fn new(commits: bool) -> Self {
        GroupContext {
            commits,
            ..GroupContext::default()
        }
    }

    fn windows(&self) -> std::sync::MutexGuard<'_, HashMap<Partition, Arc<PartitionAcks>>> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The window of an assigned partition.
    pub(crate) fn window(
        &self,
        topic: &str,
        partition: i32,
    ) -> Option<(Arc<str>, Arc<PartitionAcks>)> {
        let windows = self.windows();
        windows
            .get_key_value(&(Arc::<str>::from(topic), partition))
            .map(|((topic, _), acks)| (Arc::clone(topic), Arc::clone(acks)))
    }

    /// The settled prefixes that moved since the last commit, and their
    /// windows (each to be told [`PartitionAcks::enqueued`] once the
    /// commit is with librdkafka).
    pub(crate) fn commits_due(&self) -> (TopicPartitionList, Vec<Arc<PartitionAcks>>) {
        let mut tpl = TopicPartitionList::new();
        let mut taken = Vec::new();
        for ((topic, partition), acks) in self.windows().iter() {
            if let Some(commit) = acks.take_commit() {
                add_commit(&mut tpl, topic, *partition, &commit);
                taken.push(Arc::clone(acks));
            }
        }
        (tpl, taken)
    }

    fn assigned(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let committed = match consumer.committed_offsets(tpl.clone(), COMMITTED_TIMEOUT) {
            Ok(committed) => committed,
            Err(err) => {
                tracing::warn!(error = %err, "Kafka: the group's committed offsets could not be read; partitions start at their committed offsets, attempts uncounted");
                crate::metrics::connection_event("kafka", "committed_offsets_failed");
                tpl.clone()
            }
        };
        let ends = self.ends.lock().unwrap_or_else(|e| e.into_inner());
        let mut windows = self.windows();
        for elem in committed.elements() {
            let (topic, partition) = (elem.topic(), elem.partition());
            let (start, mark) = match elem.offset() {
                Offset::Offset(at) => (Offset::Offset(at), Mark::decode(elem.metadata())),
                _ => match ends.get(&(topic.to_owned(), partition)) {
                    Some(&end) => (Offset::Offset(end), Mark::default()),
                    None => (Offset::Beginning, Mark::default()),
                },
            };
            let _ = tpl.set_partition_offset(topic, partition, start);
            windows.insert(
                (topic.into(), partition),
                Arc::new(PartitionAcks::new(start.to_raw().filter(|o| *o >= 0), mark)),
            );
        }
    }

    /// Seals the windows of the revoked partitions and commits what they
    /// settled, synchronously.
    fn revoked(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let mut last = TopicPartitionList::new();
        {
            let mut windows = self.windows();
            for elem in tpl.elements() {
                let key: Partition = (elem.topic().into(), elem.partition());
                let Some(acks) = windows.remove(&key) else {
                    continue;
                };
                if let Some(commit) = acks.seal() {
                    add_commit(&mut last, elem.topic(), elem.partition(), &commit);
                }
            }
        }
        if self.commits
            && last.count() > 0
            && let Err(err) = consumer.commit(&last, CommitMode::Sync)
        {
            {
                tracing::warn!(error = %err, "Kafka: the commit on revocation failed; the partitions' next owner reads their settled records again");
                crate::metrics::connection_event("kafka", "commit_failed");
            }
        }
    }
}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let result: KafkaResult<()> = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.assigned(consumer, tpl);
                let assigned = consumer.assign(tpl);
                if assigned.is_ok() && self.paused.load(Ordering::Acquire) {
                    let _ = consumer.pause(tpl);
                }
                assigned
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.revoked(consumer, tpl);
                consumer.unassign()
            }
            err => {
                tracing::warn!(error = ?err, "Kafka rebalance failed");
                let all =
                    self.windows()
                        .keys()
                        .fold(TopicPartitionList::new(), |mut tpl, (t, p)| {
                            tpl.add_partition(t, *p);
                            tpl
                        });
                self.revoked(consumer, &all);
                consumer.unassign()
            }
        };
        if let Err(err) = result {
            tracing::warn!(error = %err, "Kafka: applying a rebalance failed");
        }
    }

    /// A failed commit is sent again with the next one (a group in the
    /// middle of a rebalance refuses commits for a moment).
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let Err(err) = result else { return };
        tracing::debug!(error = %err, "Kafka offset commit failed; it is sent again with the next");
        crate::metrics::connection_event("kafka", "commit_failed");
        for elem in offsets.elements() {
            if let (Some((_, acks)), Offset::Offset(at)) =
                (self.window(elem.topic(), elem.partition()), elem.offset())
            {
                acks.commit_failed(at);
            }
        }
    }
}

/// Adds the commit of one partition to `tpl`.
pub(crate) fn add_commit(
    tpl: &mut TopicPartitionList,
    topic: &str,
    partition: i32,
    commit: &Commit,
) {
    let mut elem = tpl.add_partition(topic, partition);
    let _ = elem.set_offset(Offset::Offset(commit.offset));
    if !commit.metadata.is_empty() {
        elem.set_metadata(&commit.metadata);
    }
}
