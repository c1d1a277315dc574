//! Messages JetStream gave up on: delivered `max_deliver` times and never
//! settled. That is a handler that took its process down on every run — or
//! a message the client cannot read at all: async-nats treats a header that
//! is not valid UTF-8 (or a header name with other than visible ASCII) as a
//! protocol error and drops the whole connection, so no handler ever sees
//! that message and nothing can settle it.
//!
//! The server announces each such message with an advisory. One member of
//! the consumer reads it by its stream sequence through the stream API,
//! which sends headers as base64 — out of the client parser's way — and
//! publishes it to the dead-letter subject with the reason (refused
//! before any handler, with a reason, never lost).

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream;
use base64::Engine;
use futures_util::StreamExt;
use serde::Deserialize;

use super::{NatsBroker, convert};
use crate::message::header;
use crate::{Error, Result, Text};

/// Watches a consumer's advisories while it lives; stops when dropped.
pub(super) struct GivenUp(tokio::task::JoinHandle<()>);

impl Drop for GivenUp {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The dead letters of one consumer.
struct Watch {
    nats: NatsBroker,
    context: jetstream::Context,
    stream: String,
    dead_letter: Option<Text>,
}

/// The advisory JetStream publishes for a message it gave up on.
#[derive(Deserialize)]
struct Advisory {
    stream_seq: u64,
    deliveries: u64,
}

/// `STREAM.MSG.GET`'s answer: the stored message, headers and payload in
/// base64.
#[derive(Deserialize)]
struct Stored {
    message: Option<Raw>,
}

#[derive(Deserialize)]
struct Raw {
    subject: String,
    #[serde(default)]
    hdrs: Option<String>,
    #[serde(default)]
    data: Option<String>,
}

/// Starts watching consumer `consumer` of `stream`. The members of a
/// queue group share the work (a queue subscription), so each message is
/// dead-lettered once.
pub(super) async fn watch(
    nats: &NatsBroker,
    context: &jetstream::Context,
    stream: &str,
    consumer: &str,
    dead_letter: Option<Text>,
) -> Result<GivenUp> {
    let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}");
    let mut advisories = nats
        .client
        .queue_subscribe(subject, format!("rs-given-up-{consumer}"))
        .await
        .map_err(|err| Error::Transport(err.into()))?;
    let watch = Watch {
        nats: nats.clone(),
        context: context.clone(),
        stream: stream.to_owned(),
        dead_letter,
    };
    Ok(GivenUp(tokio::spawn(async move {
        while let Some(advisory) = advisories.next().await {
            let Ok(advisory) = serde_json::from_slice::<Advisory>(&advisory.payload) else {
                continue;
            };
            if let Err(err) = watch.dead_letter(&advisory).await {
                tracing::warn!(
                    stream = %watch.stream,
                    sequence = advisory.stream_seq,
                    error = %err,
                    "JetStream gave up on a message that could not be dead-lettered; it stays in the stream"
                );
            }
        }
    })))
}

impl Watch {
    async fn dead_letter(&self, advisory: &Advisory) -> Result<()> {
        let sequence = advisory.stream_seq;
        let stored: Stored = self
            .context
            .request(
                format!("STREAM.MSG.GET.{}", self.stream),
                &serde_json::json!({ "seq": sequence }),
            )
            .await
            .map_err(|err| Error::Transport(err.into()))?;
        let Some(raw) = stored.message else {
            return Ok(()); // Gone from the stream meanwhile: nothing to keep.
        };
        let base64 = base64::engine::general_purpose::STANDARD;
        let decode = |field: &Option<String>| {
            field
                .as_deref()
                .map(|text| base64.decode(text))
                .transpose()
                .map(Option::unwrap_or_default)
                .map_err(|err| Error::Transport(err.into()))
        };
        let (headers, unreadable) = headers(&decode(&raw.hdrs)?);
        let payload = bytes::Bytes::from(decode(&raw.data)?);
        let deliveries = advisory.deliveries;
        let reason = match unreadable {
            0 => format!(
                "attempts exhausted: delivered {deliveries} times (the consumer's max_deliver) \
                 and never settled"
            ),
            n => format!(
                "malformed headers: {n} header(s) the NATS client cannot read (not UTF-8, or a \
                 name of other than visible ASCII: it drops the connection on them); delivered \
                 {deliveries} times, never handled"
            ),
        };
        let subject = Text::from(raw.subject.as_str());
        match unreadable {
            0 => crate::metrics::exhausted("", &subject),
            _ => crate::metrics::malformed("", &subject),
        }
        crate::metrics::rejected("", &subject);
        tracing::warn!(stream = %self.stream, sequence, reason, "JetStream gave up on a message");
        let Some(dead_letter) = &self.dead_letter else {
            tracing::warn!(stream = %self.stream, sequence, "no dead-letter subject: the message stays in the stream, never delivered again");
            return Ok(());
        };
        let message = convert::message(payload, Some(&headers), None);
        let attempt = u32::try_from(deliveries).unwrap_or(u32::MAX);
        let env = convert::envelope(&raw.subject, message, attempt);
        let message = super::core::dead_letter_message(env, &reason)
            .with_header(header::ORIGINAL_ID, sequence.to_string());
        crate::Broker::publish_message(&self.nats, dead_letter, message, None).await
    }
}

/// The headers of a stored message (`NATS/1.0` and `name: value` lines)
/// the client can carry, and how many it cannot.
fn headers(raw: &[u8]) -> (HeaderMap, usize) {
    let mut map = HeaderMap::new();
    let mut unreadable = 0;
    for line in raw.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let parsed = line.iter().position(|&b| b == b':').and_then(|colon| {
            let name = std::str::from_utf8(&line[..colon]).ok()?;
            let value = std::str::from_utf8(&line[colon + 1..]).ok()?;
            Some((name.parse::<HeaderName>().ok()?, value.trim()))
        });
        match parsed {
            Some((name, value)) => map.append(name, HeaderValue::from(value)),
            None => unreadable += 1,
        }
    }
    (map, unreadable)
}
