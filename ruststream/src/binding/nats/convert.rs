//! Messages both ways between ruststream and NATS: payload as is, headers as
//! NATS headers, the key and the correlation id as reserved headers (so they
//! survive any NATS client on the way), the reply address as NATS's own.

use std::str::FromStr;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};

use super::subjects;
use crate::binding::known_text::{self, text};
use crate::{Envelope, Error, Message, Result, Text};

/// Header carrying [`Message::key`].
pub(crate) const KEY: &str = "ruststream-key";
/// Header carrying [`Message::correlation_id`].
pub(crate) const CORRELATION_ID: &str = "ruststream-correlation-id";
/// Header carrying the attempt of a core-NATS redelivery.
pub(crate) const REDELIVERY: &str = "ruststream-redelivery";

/// Names NATS alone writes (the rest are [`known_text`]'s): made the
/// client's `HeaderName` unchecked on the way out.
const NATS_NAMES: &[&str] = &[KEY, CORRELATION_ID, REDELIVERY];

/// `s` as one of the strings the framework writes into NATS headers.
fn known(s: &str) -> Option<&'static str> {
    known_text::known(s).or_else(|| NATS_NAMES.iter().copied().find(|name| *name == s))
}

/// Whether `message` needs NATS headers: its own, a key or a correlation id.
pub(crate) fn carries_headers(message: &Message) -> bool {
    !message.headers().is_empty() || message.key().is_some() || message.correlation_id().is_some()
}

/// The NATS headers of `message`, `None` when it has none. A header name or
/// value NATS cannot carry (control characters, `:` in a name) is a clear
/// [`Error::Encode`], never a panic.
pub(crate) fn headers(message: &Message) -> Result<Option<HeaderMap>> {
    if !carries_headers(message) {
        return Ok(None);
    }
    let headers = message.headers();
    let mut map = HeaderMap::new();
    let mut put = |name: &str, value: &str| -> Result<()> {
        let bad = |what: &str| Error::Encode(format!("NATS cannot carry header {what}").into());
        let name = match known(name) {
            Some(known) => HeaderName::from_static(known),
            None => HeaderName::from_str(name).map_err(|_| bad(&format!("name {name:?}")))?,
        };
        let value = HeaderValue::from_str(value).map_err(|_| bad(&format!("value {value:?}")))?;
        map.insert(name, value);
        Ok(())
    };
    for (name, value) in headers.iter() {
        put(name, value)?;
    }
    if let Some(key) = message.key() {
        put(KEY, key)?;
    }
    if let Some(id) = message.correlation_id() {
        put(CORRELATION_ID, id)?;
    }
    Ok(Some(map))
}

/// The ruststream message of a received NATS message. `reply` is kept only
/// where it is a request's reply address (core NATS), not a JetStream ack
/// subject. Inlined: a core NATS delivery is made from it on every message.
#[inline]
pub(crate) fn message(
    payload: bytes::Bytes,
    headers: Option<&HeaderMap>,
    reply: Option<&str>,
) -> Message {
    let mut message = Message::new(payload);
    if let Some(map) = headers {
        for (name, values) in map.iter() {
            let name: &str = name.as_ref();
            let Some(value) = values.first() else {
                continue;
            };
            let value = value.as_str();
            match name {
                KEY => message = message.with_key(value),
                CORRELATION_ID => message = message.with_correlation_id(value),
                REDELIVERY => {}
                _ => message = message.with_header(text(name), text(value)),
            }
        }
    }
    if let Some(reply) = reply {
        message = message.with_reply_to(reply);
    }
    message
}

/// The envelope of a received message on `subject`.
pub(crate) fn envelope(subject: &str, message: Message, attempt: u32) -> Envelope {
    Envelope::new(Text::from(subject), message).with_attempt(attempt)
}

/// The [`Text`] of the subjects a subscription receives on: a subscription
/// without wildcards always sees the same one, so it is made once, not per
/// message, and kept static ([`subjects::intern`]) so that handing it to each
/// delivery counts no references.
pub(crate) struct SubjectCache {
    /// The subject every message arrives on, not compared: each delivery's
    /// `Text` is made from it in place (a clone would call through the
    /// bytes' vtable).
    only: Option<&'static str>,
    last: Option<Text>,
}

impl SubjectCache {
    /// The cache of a JetStream consumer filtering on `subject`, holding it
    /// already when it names one subject (no `*` or `>` token). Each
    /// received subject is still compared: a consumer the app binds to may
    /// filter on others.
    pub(crate) fn of(subject: &str) -> Self {
        SubjectCache {
            only: None,
            last: literal(subject).map(Text::from_static),
        }
    }

    /// The cache of a core subscription to `subject`: without wildcards the
    /// server delivers it only what was published to that very subject, so
    /// no received subject needs a compare.
    pub(crate) fn core(subject: &str) -> Self {
        SubjectCache {
            only: literal(subject),
            last: None,
        }
    }

    #[inline]
    pub(crate) fn text(&mut self, subject: &str) -> Text {
        if let Some(only) = self.only {
            return Text::from_static(only);
        }
        match &self.last {
            Some(text) if text.as_str() == subject => text.clone(),
            _ => self.last.insert(Text::from(subject)).clone(),
        }
    }
}

/// `subject` kept for the process when it names one subject (no `*` or `>`
/// token) and there is room for it.
fn literal(subject: &str) -> Option<&'static str> {
    let literal = !subject.split('.').any(|token| token == "*" || token == ">");
    literal.then(|| subjects::intern(subject)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::header;

    #[test]
    fn only_what_the_framework_writes_is_known() {
        assert_eq!(known(header::CONTENT_TYPE), Some(header::CONTENT_TYPE));
        assert_eq!(known("application/json"), Some("application/json"));
        assert_eq!(known(KEY), Some(KEY));
        assert_eq!(known("x-tenant"), None);
        assert_eq!(known("application/json; charset=utf-8"), None);
        assert!(matches!(text("x-tenant").as_str(), "x-tenant"));
    }

    #[test]
    fn each_delivery_is_named_by_the_subject_it_arrived_on() {
        let mut core = SubjectCache::core("orders.created");
        assert_eq!(core.text("orders.created").as_str(), "orders.created");
        let mut wildcard = SubjectCache::core("orders.*");
        assert_eq!(wildcard.text("orders.a").as_str(), "orders.a");
        assert_eq!(wildcard.text("orders.b").as_str(), "orders.b");
        // A consumer the app binds to may filter on other subjects.
        let mut consumer = SubjectCache::of("orders.created");
        assert_eq!(consumer.text("orders.created").as_str(), "orders.created");
        assert_eq!(consumer.text("orders.updated").as_str(), "orders.updated");
    }
}
