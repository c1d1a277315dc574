//! Topics a subscription needs: made to exist, their partitions listed,
//! and where each partition ends.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::FromClientConfig;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::Producer;
use tokio::time::Instant;

use super::{KafkaBroker, blocking};
use crate::{Error, Result};

/// A Kafka topic name made of `name`: characters Kafka does not allow in
/// topic names become `_`.
pub(crate) fn topic_safe(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .collect()
}

impl KafkaBroker {
    /// The partitions of `topic`, creating the topic when it is missing:
    /// a metadata request lets the cluster auto-create it, and where it
    /// does not, the admin API creates it with the cluster's default
    /// partition count.
    pub(crate) async fn ensure_topic(&self, topic: &str) -> Result<Vec<i32>> {
        let deadline = Instant::now() + self.settings().metadata_timeout;
        let mut created = false;
        loop {
            let probe = self.clone();
            let name = topic.to_owned();
            let timeout = self.settings().metadata_timeout;
            let found = blocking(move || {
                let metadata = probe
                    .producer()
                    .client()
                    .fetch_metadata(Some(&name), timeout)?;
                Ok(metadata.topics().first().map(|t| {
                    let partitions: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
                    (t.error(), partitions)
                }))
            })
            .await
            .map_err(|err| {
                Error::Transport(format!("Kafka metadata for topic `{topic}`: {err}").into())
            })?;
            match found {
                Some((None, partitions)) if !partitions.is_empty() => return Ok(partitions),
                Some((Some(code), _)) if is_invalid(code.into()) => {
                    return Err(Error::Config(format!(
                        "`{topic}` is not a valid Kafka topic name"
                    )));
                }
                _ => {}
            }
            if !created {
                created = true;
                self.create_topic(topic).await;
            }
            if Instant::now() >= deadline {
                return Err(Error::Config(format!(
                    "Kafka topic `{topic}` does not exist and could not be created"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Asks the admin API to create `topic`; failures are left to the
    /// metadata look-up that follows (the topic may exist by then).
    async fn create_topic(&self, topic: &str) {
        let config = self.settings().client_config(self.bootstrap());
        let Ok(admin) = AdminClient::<DefaultClientContext>::from_config(&config) else {
            return;
        };
        let new = NewTopic::new(topic, -1, TopicReplication::Fixed(-1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(5)));
        match admin.create_topics([&new], &options).await {
            Ok(results) => {
                for result in results {
                    if let Err((name, code)) = result {
                        tracing::debug!(topic = name, error = %code, "Kafka: creating a topic failed");
                    }
                }
            }
            Err(err) => tracing::debug!(topic, error = %err, "Kafka: creating a topic failed"),
        }
    }

    /// Where each partition of `topic` ends now (its high watermark).
    pub(crate) async fn ends<X, C>(
        &self,
        consumer: std::sync::Arc<C>,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<(i32, i64)>>
    where
        X: ConsumerContext + 'static,
        C: Consumer<X> + Send + Sync + 'static,
    {
        let timeout = self.settings().metadata_timeout;
        let name = topic.to_owned();
        let partitions = partitions.to_vec();
        blocking(move || {
            partitions
                .into_iter()
                .map(|p| Ok((p, consumer.fetch_watermarks(&name, p, timeout)?.1)))
                .collect()
        })
        .await
        .map_err(|err| Error::Transport(format!("Kafka watermarks of `{topic}`: {err}").into()))
    }
}

fn is_invalid(code: RDKafkaErrorCode) -> bool {
    matches!(code, RDKafkaErrorCode::InvalidTopic)
}
