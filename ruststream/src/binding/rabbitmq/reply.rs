//! Request/reply with RabbitMQ's direct reply-to: requests go out on a
//! channel that consumes `amq.rabbitmq.reply-to`, with the request id as the
//! correlation id; replies come back on that consumer (no queue, no ack) and
//! complete their caller directly. A request nobody's queue takes is
//! returned by the broker (`mandatory`): `Error::NoResponders`. A reply for
//! a request that already ended is dropped and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};
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
    /// Cleared when the reply consumer ends for good: the broker then
    /// starts a new inbox for the next request.
    alive: Arc<AtomicBool>,
}

impl Inbox {
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub(crate) fn channel(&self) -> &lapin::Channel {
        &self.channel
    }
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
        let alive = Arc::new(AtomicBool::new(true));
        let ended = Arc::clone(&alive);
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
                        let envelope = super::delivery::envelope(reply, None);
                        let _ = tx.send(envelope);
                    }
                    None => {
                        crate::metrics::late_reply("rabbitmq");
                        tracing::debug!("late or unknown RabbitMQ reply dropped");
                    }
                }
            }
            // Ended for good: waiting callers learn it now (their reply
            // can no longer come), and the next request starts a new inbox.
            ended.store(false, Ordering::Release);
            lock(&dispatch).clear();
        });
        Ok(Inbox {
            channel,
            next: AtomicU64::new(1),
            waiting,
            alive,
        })
    }
}

/// Removes a request's entry however it ends.
struct Entry(Arc<Mutex<Waiting>>, String);

impl Drop for Entry {
    fn drop(&mut self) {
        lock(&self.0).remove(&self.1);
    }
}

/// How one try to send a request ended.
enum Sent {
    Sent,
    /// Refused because the inbox's reply consumer is gone on the broker
    /// (its channel was re-created without it yet): nothing was sent.
    NoReplyConsumer,
}

fn no_reply_consumer(err: &lapin::Error) -> bool {
    err.to_string()
        .contains("fast reply consumer does not exist")
}

impl RabbitBroker {
    /// Publishes one request on `inbox`, waiting for its confirm.
    async fn send_request(
        &self,
        inbox: &Inbox,
        properties: BasicProperties,
        subject: &str,
        message: &Message,
    ) -> Result<Sent> {
        let confirm = loop {
            let sent = inbox
                .channel
                .basic_publish(
                    self.inner.settings.exchange.as_str().into(),
                    subject.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    message.payload(),
                    properties.clone(),
                )
                .await;
            match sent {
                Ok(confirm) => break confirm,
                Err(err) if no_reply_consumer(&err) => return Ok(Sent::NoReplyConsumer),
                // Not sent: the connection is coming back; send it once it
                // is (a request already sent is never sent twice).
                Err(err) => inbox
                    .channel
                    .wait_for_recovery(err)
                    .await
                    .map_err(transport)?,
            }
        };
        match confirm.await {
            Err(err) if no_reply_consumer(&err) => Ok(Sent::NoReplyConsumer),
            Err(err) => Err(transport(err)),
            Ok(Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_))) => {
                Err(Error::NoResponders(subject.to_owned()))
            }
            Ok(Confirmation::Nack(None)) => Err(Error::Transport(
                "RabbitMQ refused the request (publisher confirm nack)".into(),
            )),
            Ok(_) => Ok(Sent::Sent),
        }
    }
}

impl Requester for RabbitBroker {
    /// Publishes `message` to `subject` with a direct reply-to address and
    /// waits up to `timeout` for the reply. The request's correlation id is
    /// the request's own (a caller's correlation id is replaced). While the
    /// connection recovers, a request that could not be sent yet — no
    /// request channel, or the broker refusing it because the recovered
    /// channel has no reply consumer yet — is tried again, within `timeout`,
    /// on a fresh request channel.
    async fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = Duration::from_millis(20);
        loop {
            self.ensure_open()?;
            let inbox = match self.inbox().await {
                Ok(inbox) => inbox,
                Err(err) => {
                    if !pause(deadline, &mut backoff).await {
                        return Err(err);
                    }
                    continue;
                }
            };
            let id = format!("rs-{}", inbox.next.fetch_add(1, Ordering::Relaxed));
            let (tx, rx) = oneshot::channel();
            lock(&inbox.waiting).insert(id.clone(), tx);
            let entry = Entry(Arc::clone(&inbox.waiting), id.clone());
            let properties = super::properties(&message, &[])
                .with_correlation_id(ShortString::from(id.as_str()))
                .with_reply_to(ShortString::from(REPLY_TO));
            let sent = self.send_request(&inbox, properties, subject, &message);
            match tokio::time::timeout_at(deadline, sent).await {
                Err(_) => return Err(Error::Timeout(timeout)),
                Ok(Err(err)) => return Err(err),
                Ok(Ok(Sent::NoReplyConsumer)) => {
                    drop(entry);
                    self.discard_inbox(&inbox).await;
                    if !pause(deadline, &mut backoff).await {
                        return Err(Error::Timeout(timeout));
                    }
                    continue;
                }
                Ok(Ok(Sent::Sent)) => {}
            }
            let reply = match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) => Err(Error::Closed(
                    "RabbitMQ reply channel closed before the reply",
                )),
                Err(_) => Err(Error::Timeout(timeout)),
            };
            drop(entry);
            return reply;
        }
    }
}

/// Waits `backoff` (doubling it, up to half a second) if that ends before
/// `deadline`; `false` if it would not.
async fn pause(deadline: tokio::time::Instant, backoff: &mut Duration) -> bool {
    if tokio::time::Instant::now() + *backoff >= deadline {
        return false;
    }
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_millis(500));
    true
}
