//! Request/reply with RabbitMQ's direct reply-to: requests go out on a
//! channel that consumes `amq.rabbitmq.reply-to`, with the request id as the
//! correlation id; replies come back on that consumer (no queue, no ack) and
//! complete their caller directly (JQ-6). A request nobody's queue takes is
//! returned by the broker (`mandatory`): `Error::NoResponders`. A reply for
//! a request that already ended is dropped and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::Confirmation;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{FieldTable, ShortString};
use tokio::sync::oneshot;

use super::{RabbitBroker, transport};
use crate::binding::Requester;
use crate::{Envelope, Error, Message, Result};

/// The pseudo-queue of direct reply-to.
pub(crate) const REPLY_TO: &str = "amq.rabbitmq.reply-to";

type Waiting = HashMap<String, oneshot::Sender<Envelope>>;

/// One broker's request channel and the callers waiting on it.
pub(crate) struct Inbox {
    channel: lapin::Channel,
    next: AtomicU64,
    waiting: Arc<Mutex<Waiting>>,
}

fn lock(waiting: &Mutex<Waiting>) -> MutexGuard<'_, Waiting> {
    waiting.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inbox {
    pub(crate) async fn start(conn: &lapin::Connection) -> Result<Inbox> {
        let channel = conn.create_channel().await.map_err(transport)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(transport)?;
        let mut replies = channel
            .basic_consume(
                REPLY_TO.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(transport)?;
        let waiting: Arc<Mutex<Waiting>> = Arc::default();
        let dispatch = Arc::clone(&waiting);
        let recovering = channel.clone();
        tokio::spawn(async move {
            while let Some(reply) = replies.next().await {
                // A connection loss: requests in flight time out; replies
                // flow again once the client has re-created the consumer.
                let reply = match reply {
                    Ok(reply) => reply,
                    Err(err) => match recovering.wait_for_recovery(err).await {
                        Ok(()) => continue,
                        Err(err) => {
                            tracing::warn!(error = %err, "RabbitMQ reply consumer ended");
                            break;
                        }
                    },
                };
                let id = reply
                    .properties
                    .correlation_id()
                    .as_ref()
                    .map(|id| id.as_str().to_owned());
                let waiter = id.as_deref().and_then(|id| lock(&dispatch).remove(id));
                match waiter {
                    Some(tx) => {
                        let envelope = super::subscription::envelope(reply, None);
                        let _ = tx.send(envelope);
                    }
                    None => {
                        crate::metrics::late_reply("rabbitmq");
                        tracing::debug!("late or unknown RabbitMQ reply dropped");
                    }
                }
            }
        });
        Ok(Inbox {
            channel,
            next: AtomicU64::new(1),
            waiting,
        })
    }
}

/// Removes a request's entry however it ends.
struct Entry<'a>(&'a Mutex<Waiting>, String);

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

impl Requester for RabbitBroker {
    /// Publishes `message` to `subject` with a direct reply-to address and
    /// waits up to `timeout` for the reply. The request's correlation id is
    /// the request's own (a caller's correlation id is replaced).
    async fn request_message(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        self.ensure_open()?;
        let inbox = self.inbox().await?;
        let id = format!("rs-{}", inbox.next.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        lock(&inbox.waiting).insert(id.clone(), tx);
        let _entry = Entry(&inbox.waiting, id.clone());
        let properties = super::properties(&message, &[])
            .with_correlation_id(ShortString::from(id.as_str()))
            .with_reply_to(ShortString::from(REPLY_TO));
        let deadline = tokio::time::Instant::now() + timeout;
        let publish = async {
            let confirm = inbox
                .channel
                .basic_publish(
                    self.inner.settings.exchange.as_str().into(),
                    subject.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    message.payload(),
                    properties,
                )
                .await
                .map_err(transport)?;
            match confirm.await.map_err(transport)? {
                Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
                    Err(Error::NoResponders(subject.to_owned()))
                }
                Confirmation::Nack(None) => Err(Error::Transport(
                    "RabbitMQ refused the request (publisher confirm nack)".into(),
                )),
                _ => Ok(()),
            }
        };
        match tokio::time::timeout_at(deadline, publish).await {
            Ok(result) => result?,
            Err(_) => return Err(Error::Timeout(timeout)),
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed(
                "RabbitMQ reply channel closed before the reply",
            )),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}
