//! Stream entries as Redis sends them, read one entry at a time: a reply
//! is taken apart by hand rather than as one typed value, so an entry any
//! producer can write — a field name that is not UTF-8, say — fails alone
//! and never the read that brought it along with good ones.

use redis::Value;

use super::field;
use crate::Message;
use crate::binding::known_text::{owned_text, text};

/// One entry: its id and its fields, as bytes.
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) fields: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The entries of an `XREADGROUP` reply (one stream), in order.
pub(crate) fn read_reply(reply: Value) -> Vec<Entry> {
    // [[stream, [entry, …]]] in RESP2, {stream: [entry, …]} in RESP3.
    let streams = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|stream| match stream {
                Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                _ => None,
            })
            .collect(),
        Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
        _ => Vec::new(),
    };
    streams.into_iter().flat_map(entries).collect()
}

/// The entries of an `XCLAIM` reply, or of one stream in a read:
/// `[[id, [field, value, …]], …]`. An entry deleted while it was pending
/// comes without fields (`nil`): there is nothing left to deliver.
pub(crate) fn entries(list: Value) -> Vec<Entry> {
    let Value::Array(list) = list else {
        return Vec::new();
    };
    list.into_iter()
        .filter_map(|entry| {
            let Value::Array(entry) = entry else {
                return None;
            };
            let mut entry = entry.into_iter();
            let id = entry.next().and_then(string)?;
            let fields = match entry.next()? {
                Value::Array(flat) => pairs(flat),
                Value::Map(map) => map.into_iter().map(|(n, v)| (bytes(n), bytes(v))).collect(),
                _ => return None,
            };
            Some(Entry { id, fields })
        })
        .collect()
}

fn pairs(flat: Vec<Value>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut flat = flat.into_iter();
    std::iter::from_fn(|| Some((bytes(flat.next()?), bytes(flat.next()?)))).collect()
}

fn bytes(value: Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        Value::Int(n) => n.to_string().into_bytes(),
        _ => Vec::new(),
    }
}

fn string(value: Value) -> Option<String> {
    String::from_utf8(bytes(value)).ok()
}

impl Entry {
    /// Why the entry cannot be a message at all: a field name that is not
    /// UTF-8 (any producer can write one). `None` for a readable entry.
    pub(crate) fn malformed(&self) -> Option<String> {
        let (name, _) = self
            .fields
            .iter()
            .find(|(name, _)| std::str::from_utf8(name).is_err())?;
        Some(format!(
            "malformed entry {}: field name \"{}\" is not valid UTF-8",
            self.id,
            escaped(name)
        ))
    }

    /// The reply a caller waiting on this entry gets when it is refused
    /// before any handler (JQ-13: a request's caller gets a protocol error,
    /// not a timeout): its reply address and the message, if the entry
    /// carries a readable reply address.
    pub(crate) fn refusal_reply(&self, reason: &str) -> Option<(String, Message)> {
        let field = |name: &str| {
            self.fields
                .iter()
                .find(|(n, _)| n == name.as_bytes())
                .and_then(|(_, value)| std::str::from_utf8(value).ok())
        };
        let reply_to = field(field::REPLY_TO)?.to_owned();
        let mut message = crate::binding::protocol_error_reply(reason);
        if let Some(id) = field(field::CORRELATION_ID) {
            message = message.with_correlation_id(id.to_owned());
        }
        Some((reply_to, message))
    }

    /// The message the entry carries (see [`malformed`](Self::malformed)
    /// first). A header, key, correlation id or reply address whose value
    /// is not UTF-8 is left out of the message, logged once and counted;
    /// the message is still delivered.
    pub(crate) fn into_message(self, stream: &str) -> (String, Message) {
        let mut payload = Vec::new();
        let mut rest = Vec::with_capacity(self.fields.len().saturating_sub(1));
        for (name, value) in self.fields {
            if name == field::PAYLOAD.as_bytes() {
                payload = value;
            } else if let Ok(name) = String::from_utf8(name) {
                rest.push((name, value));
            }
        }
        let mut message = Message::new(payload);
        for (name, value) in rest {
            let Ok(value) = String::from_utf8(value) else {
                crate::metrics::unreadable_header("redis", stream, &name);
                continue;
            };
            message = match name.as_str() {
                field::KEY => message.with_key(value),
                field::CORRELATION_ID => message.with_correlation_id(value),
                field::REPLY_TO => message.with_reply_to(value),
                other => match other.strip_prefix(field::HEADER) {
                    Some(header) => message.with_header(text(header), owned_text(value)),
                    None => message,
                },
            };
        }
        (self.id, message)
    }
}

/// Bytes for a log line or a reason: printable ASCII as is, the rest as
/// `\xNN`.
pub(crate) fn escaped(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}
