//! Delayed retries the broker holds: a TTL'd copy in a delay queue per
//! delay, dead-lettered back into the consuming queue when due, so a
//! `retry_after` survives a crash.

use std::collections::HashMap;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tokio::time::Instant;

use super::exchanges::close_admin;
use super::{
    MAX_HELD_DELAY_MS, REDECLARE_AFTER, RabbitBroker, SUBJECT, long, properties, transport,
};
use crate::{Error, Message, Result};

impl RabbitBroker {
    /// The queue that holds `queue`'s retries of `delay` until it has passed,
    /// then dead-letters them back into `queue` through the default
    /// exchange. One queue per delay: RabbitMQ expires messages only at a
    /// queue's head, so mixed delays would wait for each other. Declared
    /// before each use, which renews its lease: it goes away a minute after
    /// its last message is due. Declarations are remembered for
    /// [`REDECLARE_AFTER`], well inside that lease, so a burst of retries
    /// opens no channel each.
    async fn delay_queue(&self, queue: &str, delay: Duration) -> Result<String> {
        let ms = u32::try_from(delay.as_millis())
            .ok()
            .filter(|ms| *ms <= MAX_HELD_DELAY_MS)
            .ok_or_else(|| Error::Config(format!("a delay of {delay:?} is too long to hold")))?;
        let name = format!("{queue}.delay.{ms}");
        let fresh = |at: &Instant| at.elapsed() < REDECLARE_AFTER;
        if self.declared_delays().get(&name).is_some_and(fresh) {
            return Ok(name);
        }
        let mut arguments = FieldTable::default();
        arguments.insert("x-dead-letter-exchange".into(), long(""));
        arguments.insert("x-dead-letter-routing-key".into(), long(queue));
        arguments.insert(
            "x-expires".into(),
            AMQPValue::LongUInt(ms.saturating_add(60_000)),
        );
        let admin = self.admin_channel().await?;
        let declared = admin
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .map_err(transport);
        close_admin(admin).await;
        declared?;
        let mut declared = self.declared_delays();
        declared.retain(|_, at| fresh(at));
        declared.insert(name.clone(), Instant::now());
        Ok(name)
    }

    fn declared_delays(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.inner
            .delay_queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `message` (to be delivered as `subject`) into `queue`'s
    /// delay queue; the broker moves it into `queue` once `delay` has passed.
    pub(crate) async fn publish_delayed(
        &self,
        queue: &str,
        subject: &str,
        message: &Message,
        delay: Duration,
    ) -> Result<()> {
        let delay_queue = self.delay_queue(queue, delay).await?;
        let properties = properties(message, &[(SUBJECT, subject.to_owned())])
            .with_expiration(ShortString::from(delay.as_millis().to_string()));
        let published = self
            .publish_to("", &delay_queue, message.payload(), properties, None)
            .await;
        if published.is_err() {
            // Deleted behind our back? Declare it again next time.
            self.declared_delays().remove(&delay_queue);
        }
        published
    }
}
