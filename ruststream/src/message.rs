//! What crosses the binding seam: [`Message`] going out, [`Envelope`] coming in.

use bytes::Bytes;

use crate::Text;
use crate::meta_box::{Meta, MetaBox};
use crate::reply_port::ReplyPort;

/// Header names the runtime itself reads and writes.
pub mod header {
    /// Status of a failed reply: `protocol-error`, `handler-error` or
    /// `structural-limit`. A reply without it succeeded.
    pub const STATUS: &str = "ruststream-status";
    /// Human-readable error of a failed reply or of a dead-lettered message.
    pub const ERROR: &str = "ruststream-error";
    /// Subject a dead-lettered message was first delivered on.
    pub const ORIGINAL_SUBJECT: &str = "ruststream-original-subject";
    /// Attempt number at which a message was dead-lettered.
    pub const ATTEMPT: &str = "ruststream-attempt";
    /// The broker's id of a message a binding dead-lettered on its own,
    /// before any handler could see it (a malformed Redis entry's id, the
    /// stream sequence of a JetStream message the client could not read).
    pub const ORIGINAL_ID: &str = "ruststream-original-id";
    /// Attempts made on the earlier copies of a message that `retry_after`
    /// republished.
    pub const RETRIES: &str = "ruststream-retries";
    /// Delay a `retry_after` still had to wait when a shutdown published it
    /// early; the next consumer re-arms it.
    pub const RETRY_DELAY_MS: &str = "ruststream-retry-delay-ms";
    /// The payload's format, set by the codec that encoded it (e.g.
    /// `application/json`); a subscriber whose codec reads another format
    /// treats the message as malformed.
    pub const CONTENT_TYPE: &str = "content-type";
}

/// Ordered message headers. Names may repeat; lookups return the first match.
///
/// An empty `Headers` does not allocate, nor does one with a single header.
///
/// ```
/// use ruststream::Headers;
///
/// let mut h = Headers::new();
/// h.insert("trace-id", "abc");
/// assert_eq!(h.get("trace-id"), Some("abc"));
/// assert_eq!(h.get("missing"), None);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// The first header, inline: a message with one header (a reply's status,
    /// say) needs no list. `None` only when `rest` is empty too, so equal
    /// headers always look alike.
    first: Option<(Text, Text)>,
    rest: Vec<(Text, Text)>,
}

/// Room for this many headers beyond the first stays with a recycled
/// message's metadata ([`Headers::clear`]).
const KEPT_HEADERS: usize = 8;

impl Headers {
    /// No headers.
    pub const fn new() -> Self {
        Headers {
            first: None,
            rest: Vec::new(),
        }
    }

    fn pairs(&self) -> impl Iterator<Item = &(Text, Text)> {
        self.first.iter().chain(self.rest.iter())
    }

    /// Appends a header; an existing header of the same name is replaced.
    pub fn insert(&mut self, name: impl Into<Text>, value: impl Into<Text>) {
        let name = name.into();
        let value = value.into();
        let Some(first) = &mut self.first else {
            self.first = Some((name, value));
            return;
        };
        match std::iter::once(first)
            .chain(self.rest.iter_mut())
            .find(|(n, _)| *n == name)
        {
            Some(slot) => slot.1 = value,
            None => self.rest.push((name, value)),
        }
    }

    /// Removes every header called `name`.
    pub fn remove(&mut self, name: &str) {
        self.rest.retain(|(n, _)| n.as_str() != name);
        if self.first.as_ref().is_some_and(|(n, _)| n.as_str() == name) {
            self.first = (!self.rest.is_empty()).then(|| self.rest.remove(0));
        }
    }

    /// The first value of `name`.
    #[inline]
    pub fn get(&self, name: &str) -> Option<&str> {
        // The first header by hand: most messages have none or one.
        let (first, value) = self.first.as_ref()?;
        if first.as_str() == name {
            return Some(value.as_str());
        }
        self.rest
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every `(name, value)` pair in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// True when there are no headers.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Removes every header, keeping the list's room for the next message
    /// unless it grew large.
    pub(crate) fn clear(&mut self) {
        if self.first.is_some() {
            // Dropped where it lies, not moved out first.
            self.first = None;
        }
        if self.rest.capacity() > KEPT_HEADERS {
            self.rest = Vec::new();
        } else if !self.rest.is_empty() {
            self.rest.clear();
        }
    }

    /// Bytes the names and values occupy; used for HWM accounting.
    pub(crate) fn byte_len(&self) -> usize {
        self.pairs().map(|(n, v)| n.len() + v.len()).sum()
    }
}

// As the list it is: `Headers([(name, value), ..])`.
impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct List<'a>(&'a Headers);
        impl std::fmt::Debug for List<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_list().entries(self.0.pairs()).finish()
            }
        }
        f.debug_tuple("Headers").field(&List(self)).finish()
    }
}

/// A message to publish: payload plus the metadata a broker carries for it.
///
/// Metadata lives behind one box that exists only when some is set, so a plain
/// message is two words of payload handle and moves cheaply.
///
/// ```
/// use ruststream::Message;
///
/// let m = Message::new("hello")
///     .with_header("trace-id", "t-1")
///     .with_key("customer-7")
///     .with_correlation_id("c-42");
/// assert_eq!(m.payload(), "hello".as_bytes());
/// assert_eq!(m.key().map(|k| k.as_str()), Some("customer-7"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    payload: Bytes,
    meta: Option<MetaBox>,
}

static NO_HEADERS: Headers = Headers::new();

impl Message {
    /// A message with this payload and no metadata.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Message {
            payload: payload.into(),
            meta: None,
        }
    }

    /// Whether it carries any header (a key, reply address or correlation
    /// id alone is no header).
    #[inline]
    pub(crate) fn has_headers(&self) -> bool {
        self.meta.as_ref().is_some_and(|m| !m.headers.is_empty())
    }

    fn meta_mut(&mut self) -> &mut Meta {
        self.meta.get_or_insert_with(MetaBox::new)
    }

    /// The payload, giving up the rest.
    pub fn into_payload(self) -> Bytes {
        self.payload
    }

    /// The same metadata with another payload.
    #[cfg(feature = "testing")]
    pub(crate) fn with_payload(mut self, payload: Bytes) -> Self {
        self.payload = payload;
        self
    }

    /// Adds (or replaces) a header.
    pub fn with_header(mut self, name: impl Into<Text>, value: impl Into<Text>) -> Self {
        self.meta_mut().headers.insert(name, value);
        self
    }

    /// Replaces all headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.meta_mut().headers = headers;
        self
    }

    /// Sets the ordering/partition key.
    pub fn with_key(mut self, key: impl Into<Text>) -> Self {
        self.meta_mut().key = Some(key.into());
        self
    }

    /// Sets the subject a reply should go to.
    pub fn with_reply_to(mut self, subject: impl Into<Text>) -> Self {
        let meta = self.meta_mut();
        meta.reply_to = Some(subject.into());
        meta.reply_port = None;
        self
    }

    /// Makes it a request whose caller waits in this process, reached
    /// through `port`.
    pub(crate) fn with_reply_port(mut self, port: ReplyPort) -> Self {
        match &mut self.meta {
            Some(meta) => {
                meta.reply_port = Some(port);
                meta.reply_to = None;
            }
            // A new box is empty: nothing to clear (a request's usual case).
            None => {
                let mut meta = MetaBox::new();
                meta.reply_port = Some(port);
                self.meta = Some(meta);
            }
        }
        self
    }

    /// Sets the correlation id.
    pub fn with_correlation_id(mut self, id: impl Into<Text>) -> Self {
        self.meta_mut().correlation_id = Some(id.into());
        self
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Headers.
    pub fn headers(&self) -> &Headers {
        self.meta.as_ref().map_or(&NO_HEADERS, |m| &m.headers)
    }

    /// Mutable access to the headers.
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.meta_mut().headers
    }

    /// The key, if any.
    pub fn key(&self) -> Option<&Text> {
        self.meta.as_ref()?.key.as_ref()
    }

    /// The reply subject, if any.
    pub fn reply_to(&self) -> Option<&Text> {
        let meta = self.meta.as_ref()?;
        meta.reply_to
            .as_ref()
            .or_else(|| meta.reply_port.as_ref().map(ReplyPort::subject))
    }

    /// The caller's port, when the request's caller waits in this process.
    pub(crate) fn reply_port(&self) -> Option<&ReplyPort> {
        self.meta.as_ref()?.reply_port.as_ref()
    }

    /// Whether it is a request: someone waits for a reply (without making
    /// its subject, as `reply_to` may).
    #[inline]
    pub(crate) fn expects_reply(&self) -> bool {
        self.meta
            .as_ref()
            .is_some_and(|m| m.reply_to.is_some() || m.reply_port.is_some())
    }

    /// The correlation id, if any.
    pub fn correlation_id(&self) -> Option<&Text> {
        self.meta.as_ref()?.correlation_id.as_ref()
    }

    /// Payload plus header bytes: the message's own size.
    #[inline]
    pub fn byte_len(&self) -> usize {
        self.payload.len() + self.meta.as_ref().map_or(0, |m| m.headers.byte_len())
    }
}

/// Bytes a byte high-water mark charges a frame beyond its payload and
/// headers: the frame's own bookkeeping, a fixed estimate that does not
/// change with the runtime's types.
pub const FRAME_OVERHEAD: usize = 80;

/// What a binding hands the runtime for one received message: the published
/// [`Message`] plus the subject it arrived on and its delivery attempt.
///
/// The payload is the broker's own buffer (`Bytes`): reading it never copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    subject: Text,
    message: Message,
    attempt: u32,
}

impl Envelope {
    /// An envelope for a first delivery (attempt 1).
    pub fn new(subject: Text, message: Message) -> Self {
        Envelope {
            subject,
            message,
            attempt: 1,
        }
    }

    /// The headers, to change before the handler reads them (middleware).
    pub(crate) fn headers_mut(&mut self) -> &mut Headers {
        self.message.headers_mut()
    }

    /// The same envelope with another attempt number.
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Subject the message was published to.
    pub fn subject(&self) -> &Text {
        &self.subject
    }

    /// The payload, as received.
    pub fn payload(&self) -> &Bytes {
        &self.message.payload
    }

    /// Headers, as received.
    pub fn headers(&self) -> &Headers {
        self.message.headers()
    }

    /// Ordering/partition key, if the publisher set one.
    pub fn key(&self) -> Option<&Text> {
        self.message.key()
    }

    /// Where a reply should be published, for requests.
    pub fn reply_to(&self) -> Option<&Text> {
        self.message.reply_to()
    }

    /// Whether it is a request (see [`Message::expects_reply`]).
    #[inline]
    pub(crate) fn expects_reply(&self) -> bool {
        self.message.expects_reply()
    }

    /// The caller's port, when the request's caller waits in this process.
    pub(crate) fn reply_port(&self) -> Option<&ReplyPort> {
        self.message.reply_port()
    }

    /// Correlation id, if the publisher set one.
    pub fn correlation_id(&self) -> Option<&Text> {
        self.message.correlation_id()
    }

    /// Delivery attempt as the broker counts it, starting at 1; a redelivery
    /// after `nack` adds one.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Attempts made on the earlier copies `retry_after` republished (the
    /// `ruststream-retries` header): one per retry, more where a copy was
    /// also redelivered before it asked for the retry, so attempts never go
    /// down across retries.
    #[inline(always)]
    pub fn retries(&self) -> u32 {
        // Checked on every delivery: a message without metadata, the
        // common case, answers without a header lookup.
        if self.message.meta.is_none() {
            return 0;
        }
        self.retries_header()
    }

    #[inline(never)]
    fn retries_header(&self) -> u32 {
        self.headers()
            .get(header::RETRIES)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Attempts counting both broker redeliveries and `retry_after`
    /// republishes: what `max_attempts` is checked against.
    #[inline]
    pub fn total_attempt(&self) -> u32 {
        self.attempt.saturating_add(self.retries())
    }

    /// The remaining delay of a `retry_after` that a shutdown published early.
    #[inline(always)]
    pub fn retry_delay(&self) -> Option<std::time::Duration> {
        // Checked on every delivery: a message without metadata, the
        // common case, answers without a header lookup.
        self.message.meta.as_ref()?;
        self.retry_delay_header()
    }

    #[inline(never)]
    fn retry_delay_header(&self) -> Option<std::time::Duration> {
        let ms: u64 = self.headers().get(header::RETRY_DELAY_MS)?.parse().ok()?;
        (ms > 0).then(|| std::time::Duration::from_millis(ms))
    }

    /// The message as published.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// Takes the message out, e.g. to republish it to a dead-letter subject.
    pub fn into_message(self) -> Message {
        self.message
    }

    /// Bytes a queue holding this frame owns: payload, headers and the
    /// frame's own bookkeeping. What a byte high-water mark charges.
    #[inline]
    pub fn frame_bytes(&self) -> usize {
        self.message.byte_len() + FRAME_OVERHEAD
    }

    /// The copy a `retry_after` publishes: the attempts made so far counted
    /// (a copy a shutdown published early was never handled, and adds
    /// none), and the delay it still has to wait, if any.
    pub(crate) fn retry_copy(&self, remaining: std::time::Duration) -> Message {
        let made = if self.retry_delay().is_none() {
            self.attempt()
        } else {
            0
        };
        let retries = self.retries() + made;
        let mut message = self.message().clone();
        let headers = message.headers_mut();
        headers.insert(header::RETRIES, retries.to_string());
        if remaining.is_zero() {
            headers.remove(header::RETRY_DELAY_MS);
        } else {
            headers.insert(header::RETRY_DELAY_MS, remaining.as_millis().to_string());
        }
        message
    }
}
