//! Request/reply over MQTT 5: a request carries the broker's own response
//! topic and a correlation data of its own; the responder publishes the
//! reply there with the same correlation data, and the inbox (the publishing
//! connection's subscription to its response topic) hands it straight to
//! the waiting caller — no subscription loop, no permit (JQ-6). A reply for
//! a request that already ended is dropped and counted: first terminal wins.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::Publish;
use tokio::sync::oneshot;

use super::{MqttBroker, convert};
use crate::binding::{Broker, Requester};
use crate::{Envelope, Error, Message, Result};

/// Correlation data of this broker's requests start with this.
const PREFIX: &str = "rq-";

/// The callers waiting for replies on one broker's response topic.
#[derive(Default)]
pub(super) struct Inbox {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Envelope>>>,
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Envelope>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl super::connection::Inbound for Inbox {
    async fn deliver(&self, publish: Publish, _epoch: u64) {
        let env = convert::envelope(publish, false, &mut None);
        let id = env
            .correlation_id()
            .and_then(|id| id.strip_prefix(PREFIX))
            .and_then(|id| id.parse::<u64>().ok());
        match id.and_then(|id| self.lock().remove(&id)) {
            Some(tx) => {
                let _ = tx.send(env);
            }
            None => {
                crate::metrics::late_reply("mqtt");
                tracing::debug!(subject = %env.subject(), "late or unknown MQTT reply dropped");
            }
        }
    }

    fn reset(&self) {}
}

/// Removes a request's entry however the request ends.
struct Waiting<'a>(&'a Inbox, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

impl Requester for MqttBroker {
    /// Publishes the request with this broker's response topic and a
    /// correlation data of its own (replacing the message's correlation
    /// id), and waits up to `timeout` for the reply. MQTT cannot tell that
    /// nobody subscribes: a request nobody answers ends in `Error::Timeout`.
    async fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        self.ensure_open()?;
        let inbox = &self.inner.inbox;
        let id = inbox.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        inbox.lock().insert(id, tx);
        let _waiting = Waiting(inbox, id);
        let deadline = tokio::time::Instant::now() + timeout;
        let message = message
            .with_reply_to(self.inner.reply_topic.as_str())
            .with_correlation_id(format!("{PREFIX}{id}"));
        self.publish_message(subject, message, Some(deadline))
            .await?;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed("MQTT reply inbox closed before the reply")),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}
