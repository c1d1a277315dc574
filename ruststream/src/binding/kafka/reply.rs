//! The reply inbox of request/reply: a topic of the broker's own, read by
//! a consumer that joins no group, from the topic's end when it started.
//! A reply completes its caller directly by correlation id, never through
//! a subscription (and needs no job permit).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::config::FromClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tokio::sync::oneshot;

use super::topics::topic_safe;
use super::{KafkaBroker, config_error, record};
use crate::{Envelope, Error, Result};

static NEXT_INBOX: AtomicU64 = AtomicU64::new(1);

/// Callers waiting for their replies, by correlation id.
type Waiting = Mutex<HashMap<String, oneshot::Sender<Envelope>>>;

pub(crate) struct Inbox {
    topic: String,
    waiting: Arc<Waiting>,
    next: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

impl Inbox {
    /// Makes the reply topic and starts reading it from its end.
    pub(crate) async fn start(broker: &KafkaBroker) -> Result<Arc<Inbox>> {
        let settings = broker.settings();
        let n = NEXT_INBOX.fetch_add(1, Ordering::Relaxed);
        let topic = format!(
            "rs-reply.{}.{}x{n}",
            topic_safe(&settings.client_id),
            std::process::id()
        );
        let partitions = broker.ensure_topic(&topic).await?;
        let mut config = settings.client_config(broker.bootstrap());
        // A group id only because librdkafka assigns partitions through
        // its group machinery; the inbox never joins or commits.
        config
            .set("group.id", &topic)
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        let consumer: Arc<StreamConsumer> =
            Arc::new(StreamConsumer::from_config(&config).map_err(config_error)?);
        let ends = broker
            .ends(Arc::clone(&consumer), &topic, &partitions)
            .await?;
        let mut tpl = TopicPartitionList::new();
        for (p, end) in ends {
            let _ = tpl.add_partition_offset(&topic, p, Offset::Offset(end));
        }
        consumer.assign(&tpl).map_err(|err| {
            Error::Transport(format!("Kafka reply topic `{topic}`: {err}").into())
        })?;
        let waiting = Arc::new(Waiting::default());
        let reader = tokio::spawn(read_replies(consumer, Arc::clone(&waiting)));
        Ok(Arc::new(Inbox {
            topic,
            waiting,
            next: AtomicU64::new(1),
            reader,
        }))
    }

    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    /// A fresh correlation id and the reply that will carry it.
    pub(crate) fn expect(&self) -> (String, oneshot::Receiver<Envelope>) {
        let id = format!("rs-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id.clone(), tx);
        (id, rx)
    }

    /// Stops waiting for `id` (timed out, or never sent).
    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Envelope>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn stop(&self) {
        self.reader.abort();
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Completes each waiting caller with its reply; a reply nobody waits for
/// (it came too late) is dropped and counted.
async fn read_replies(consumer: Arc<StreamConsumer>, waiting: Arc<Waiting>) {
    loop {
        let record = match consumer.recv().await {
            Ok(record) => record,
            Err(err) => {
                tracing::debug!(error = %err, "Kafka reply consumer error");
                continue;
            }
        };
        let received = record::read(&record);
        let subject = record.topic().into();
        let Some(id) = received.message.correlation_id() else {
            crate::metrics::late_reply("kafka");
            continue;
        };
        let waiter = waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id.as_str());
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(Envelope::new(subject, received.message));
            }
            None => crate::metrics::late_reply("kafka"),
        }
    }
}
