//! A [`Message`] as a Kafka record and back: the payload is the record's
//! value, the key its key, headers its headers; the correlation id, the
//! reply address and the binding's own bookkeeping travel as headers of
//! their own, which a received message does not show.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Header, Headers as _, OwnedHeaders};

use crate::binding::known_text::text;
use crate::{Message, Text};

/// The correlation id of a request or reply.
pub(crate) const CORRELATION_ID: &str = "ruststream-correlation-id";
/// Where a request's reply goes: the requester's reply topic.
pub(crate) const REPLY_TO: &str = "ruststream-reply-to";
/// Attempt number of a copy that `nack` sent to the retry topic.
pub(crate) const REDELIVERY: &str = "ruststream-redelivery";
/// The topic a retry copy was first delivered on: its subject.
pub(crate) const SUBJECT: &str = "ruststream-subject";
/// When a `retry_after` copy may be handed out (Unix epoch milliseconds).
pub(crate) const NOT_BEFORE: &str = "ruststream-not-before-ms";
/// Partition of a dead-lettered record on its original topic.
pub const ORIGINAL_PARTITION: &str = "ruststream-original-partition";
/// Offset of a dead-lettered record on its original topic.
pub const ORIGINAL_OFFSET: &str = "ruststream-original-offset";

/// Headers a received message does not show: the binding reads them.
fn bookkeeping(name: &str) -> bool {
    matches!(
        name,
        CORRELATION_ID | REPLY_TO | REDELIVERY | SUBJECT | NOT_BEFORE
    )
}

/// The record headers of `message`, with `extra` bookkeeping after them.
pub(crate) fn headers(message: &Message, extra: &[(&str, &str)]) -> OwnedHeaders {
    let count = message.headers().len() + extra.len() + 2;
    let mut headers = OwnedHeaders::new_with_capacity(count);
    let mut add = |key: &str, value: &str| {
        headers = std::mem::take(&mut headers).insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    };
    for (name, value) in message.headers().iter() {
        add(name, value);
    }
    if let Some(id) = message.correlation_id() {
        add(CORRELATION_ID, id.as_str());
    }
    if let Some(reply_to) = message.reply_to() {
        add(REPLY_TO, reply_to.as_str());
    }
    for (name, value) in extra {
        add(name, value);
    }
    headers
}

/// What a received record says, beyond its message.
pub(crate) struct Received {
    pub message: Message,
    /// The attempt a `nack` copy carries; 1 for anything else.
    pub attempt: u32,
    /// The subject a retry copy was first delivered on.
    pub subject: Option<Text>,
    /// When a `retry_after` copy may be handed out.
    pub not_before: Option<SystemTime>,
}

/// Reads a record. A header value that is not UTF-8 is left out and
/// counted; a key that is not UTF-8 is taken lossily (the same bytes give
/// the same key, so per-key order holds).
pub(crate) fn read(record: &BorrowedMessage<'_>) -> Received {
    let payload = Bytes::copy_from_slice(record.payload().unwrap_or_default());
    let mut message = Message::new(payload);
    if let Some(key) = record.key() {
        message = message.with_key(String::from_utf8_lossy(key).into_owned());
    }
    let mut received = Received {
        message,
        attempt: 1,
        subject: None,
        not_before: None,
    };
    let Some(headers) = record.headers() else {
        return received;
    };
    for header in headers.iter() {
        let value = header.value.unwrap_or_default();
        let Ok(value) = std::str::from_utf8(value) else {
            crate::metrics::unreadable_header("kafka", record.topic(), header.key);
            continue;
        };
        if !bookkeeping(header.key) {
            received
                .message
                .headers_mut()
                .insert(text(header.key), text(value));
            continue;
        }
        let message = std::mem::replace(&mut received.message, Message::new(Bytes::new()));
        received.message = match header.key {
            CORRELATION_ID => message.with_correlation_id(value),
            REPLY_TO => message.with_reply_to(value),
            _ => message,
        };
        match header.key {
            REDELIVERY => received.attempt = value.parse().unwrap_or(1).max(1),
            SUBJECT => received.subject = Some(value.into()),
            NOT_BEFORE => {
                received.not_before = value
                    .parse()
                    .ok()
                    .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
            }
            _ => {}
        }
    }
    received
}

/// Unix epoch milliseconds `delay` from now, rounded up: a copy held
/// until then is never handed out before the delay (rounded down, it came
/// back up to a millisecond early).
pub(crate) fn epoch_ms_after(delay: Duration) -> u64 {
    let at = SystemTime::now() + delay;
    at.duration_since(UNIX_EPOCH).map_or(0, |d| {
        u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::epoch_ms_after;

    #[test]
    fn a_due_time_is_never_before_the_delay() {
        for _ in 0..1000 {
            let delay = Duration::from_millis(500);
            let earliest = SystemTime::now() + delay;
            let due = UNIX_EPOCH + Duration::from_millis(epoch_ms_after(delay));
            assert!(due >= earliest, "{due:?} < {earliest:?}");
        }
    }
}
