//! Request/reply on Redis: a request is an ordinary stream entry whose `r`
//! field names a reply channel; the reply is a Redis pub/sub message on that
//! channel, which the requesting broker's inbox (one `PSUBSCRIBE` per
//! broker) hands straight to the waiting caller. A reply for a
//! request that already ended is dropped and counted: first terminal wins.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::oneshot;

use super::{RedisBroker, transport};
use crate::binding::{Broker, Requester};
use crate::{Envelope, Error, Message, Result, Text};

/// Reply channels start with this; the rest is `<inbox>.<request id>`.
pub(crate) const PREFIX: &str = "_rs.inbox.";

static NEXT_INBOX: AtomicU64 = AtomicU64::new(1);

/// One broker's reply inbox: its pattern subscription and the callers
/// waiting on it.
pub(crate) struct Inbox {
    /// `_rs.inbox.<pid>x<n>.`
    prefix: String,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Envelope>>>,
}

impl Inbox {
    /// Subscribes `_rs.inbox.<id>.*` and starts the task that completes
    /// callers. The task ends with the pub/sub connection.
    pub(crate) async fn start(client: &redis::Client) -> Result<Arc<Inbox>> {
        let prefix = format!(
            "{PREFIX}{}x{}.",
            std::process::id(),
            NEXT_INBOX.fetch_add(1, Ordering::Relaxed)
        );
        let mut pubsub = client.get_async_pubsub().await.map_err(transport)?;
        pubsub
            .psubscribe(format!("{prefix}*"))
            .await
            .map_err(transport)?;
        let inbox = Arc::new(Inbox {
            prefix,
            next: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&inbox);
        tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Some(inbox) = weak.upgrade() else { return };
                inbox.complete(message.get_channel_name(), message.get_payload_bytes());
            }
        });
        Ok(inbox)
    }

    fn complete(&self, channel: &str, frame: &[u8]) {
        let id = channel
            .strip_prefix(self.prefix.as_str())
            .and_then(|id| id.parse::<u64>().ok());
        let waiter = id.and_then(|id| self.lock().remove(&id));
        match (waiter, decode(frame)) {
            (Some(tx), Some(message)) => {
                let _ = tx.send(Envelope::new(Text::from(channel), message));
            }
            (Some(_), None) => tracing::warn!(channel, "malformed reply frame dropped"),
            (None, _) => {
                crate::metrics::late_reply("redis");
                tracing::debug!(channel, "late or unknown reply dropped");
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Envelope>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes a request's entry however the request ends.
struct Waiting<'a>(&'a Inbox, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

/// A reply on the wire: headers (name and value, length-prefixed), an end
/// marker, then the payload.
pub(crate) fn encode(message: &Message) -> Bytes {
    let mut out = BytesMut::with_capacity(message.payload().len() + 64);
    let mut put = |name: &str, value: &str| {
        out.put_u16(name.len() as u16);
        out.put_slice(name.as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    };
    for (name, value) in message.headers().iter() {
        put(name, value);
    }
    if let Some(id) = message.correlation_id() {
        put(super::field::CORRELATION_ID, id);
    }
    out.put_u16(u16::MAX);
    out.put_slice(message.payload());
    out.freeze()
}

fn decode(mut frame: &[u8]) -> Option<Message> {
    let mut headers = Vec::new();
    loop {
        if frame.remaining() < 2 {
            return None;
        }
        let name_len = frame.get_u16();
        if name_len == u16::MAX {
            break;
        }
        let name = take_str(&mut frame, name_len as usize)?;
        if frame.remaining() < 4 {
            return None;
        }
        let value_len = frame.get_u32() as usize;
        let value = take_str(&mut frame, value_len)?;
        headers.push((name, value));
    }
    let mut message = Message::new(Bytes::copy_from_slice(frame));
    for (name, value) in headers {
        message = if name == super::field::CORRELATION_ID {
            message.with_correlation_id(value)
        } else {
            message.with_header(name, value)
        };
    }
    Some(message)
}

fn take_str(frame: &mut &[u8], len: usize) -> Option<String> {
    if frame.remaining() < len {
        return None;
    }
    let (text, rest) = frame.split_at(len);
    *frame = rest;
    String::from_utf8(text.to_vec()).ok()
}

impl Requester for RedisBroker {
    /// Adds the request to the stream named by `subject` with a reply
    /// channel, and waits up to `timeout` for the reply. A stream without
    /// consumer groups has no responders: `Error::NoResponders` at once.
    async fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        self.ensure_open()?;
        let groups: redis::Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(subject)
            .query_async(&mut self.conn())
            .await
            .unwrap_or(redis::Value::Nil);
        if !matches!(&groups, redis::Value::Array(groups) if !groups.is_empty()) {
            return Err(Error::NoResponders(subject.to_owned()));
        }
        let inbox = self.inbox().await?;
        let id = inbox.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        inbox.lock().insert(id, tx);
        let _waiting = Waiting(&inbox, id);
        let deadline = tokio::time::Instant::now() + timeout;
        let reply_to = format!("{}{id}", inbox.prefix);
        self.publish_message(subject, message.with_reply_to(reply_to), Some(deadline))
            .await?;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed("Redis reply inbox closed before the reply")),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}
