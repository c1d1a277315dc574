//! [`Publisher`]: a typed handle for sending — one codec, one default
//! deadline, one binding operation per send.

use std::marker::PhantomData;
use std::time::Duration;

use tokio::time::Instant;

use crate::binding::{Broker, Requester};
use crate::codec::{Decode, Encode};
use crate::outgoing::{Outgoing, send};
use crate::{Codec, Envelope, Json, Message, Result};

/// A typed publisher on broker `B` with codec `C` (JSON by default).
///
/// Every send is exactly one binding operation: where the broker's
/// queue is full it waits for space until the send's deadline and then fails
/// with [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded) — never retried, never re-targeted.
/// A waiting send holds no job permit and no execution slot: other
/// deliveries keep running. A request does not wait for queue space (JQ-19):
/// a full or paused queue refuses it at once with the same error, and its
/// reply completes the caller directly.
///
/// Get one from [`Publisher::new`], from a handler's
/// [`Ctx::publisher`](crate::Ctx::publisher), or from
/// [`RunningApp::publisher`](crate::RunningApp::publisher).
///
/// ```
/// use std::time::Duration;
/// use ruststream::prelude::*;
/// use ruststream::{Publisher, SubscribeOptions};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let broker = MemoryBroker::new();
/// let mut audit = broker.subscribe(SubscribeOptions::new("audit")).await?;
/// let out = Publisher::new(broker.clone()).timeout(Duration::from_secs(1));
///
/// out.publish("audit", &serde_json::json!({"user": 7})).await?;
/// // Metadata goes on the message: headers, key, correlation id.
/// let message = out.encode(&"login")?.with_key("user-7").with_header("source", "web");
/// out.send("audit", message).await?;
///
/// let first = audit.next().await.unwrap();
/// assert_eq!(first.envelope().payload(), &br#"{"user":7}"#[..]);
/// first.ack().await?;
/// let second = audit.next().await.unwrap();
/// assert_eq!(second.envelope().key().map(|k| k.as_str()), Some("user-7"));
/// second.ack().await?;
/// # Ok::<_, ruststream::Error>(()) }).unwrap();
/// ```
pub struct Publisher<B, C = Json> {
    broker: B,
    timeout: Option<Duration>,
    /// The app's publish hooks, for a publisher the app handed out.
    outgoing: Outgoing,
    codec: PhantomData<fn() -> C>,
}

impl<B: Clone, C> Clone for Publisher<B, C> {
    fn clone(&self) -> Self {
        Publisher {
            broker: self.broker.clone(),
            timeout: self.timeout,
            outgoing: self.outgoing.clone(),
            codec: PhantomData,
        }
    }
}

impl<B: Broker, C> std::fmt::Debug for Publisher<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("broker", &self.broker.name())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl<B: Broker> Publisher<B> {
    /// A JSON publisher on `broker`, with the broker's default publish timeout.
    /// Its sends are spans (and timed) when a tracing subscriber (and
    /// [`record_handler_timings`](crate::metrics::record_handler_timings))
    /// was installed before it was made.
    pub fn new(broker: B) -> Self {
        Publisher::of_app(broker, Outgoing::standalone())
    }

    /// A publisher the app hands out: its publish hooks, spans and timings.
    pub(crate) fn of_app(broker: B, outgoing: Outgoing) -> Self {
        Publisher {
            broker,
            timeout: None,
            outgoing,
            codec: PhantomData,
        }
    }
}

impl<B: Broker, C: Codec> Publisher<B, C> {
    /// The same publisher with another codec.
    pub fn with_codec<D: Codec>(self) -> Publisher<B, D> {
        Publisher {
            broker: self.broker,
            timeout: self.timeout,
            outgoing: self.outgoing,
            codec: PhantomData,
        }
    }

    /// How long one send may wait for queue space; the default is the
    /// broker's own publish timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The broker underneath.
    pub fn broker(&self) -> &B {
        &self.broker
    }

    /// Encodes `value` into a message, ready for metadata
    /// ([`Message::with_header`], [`with_key`](Message::with_key),
    /// [`with_correlation_id`](Message::with_correlation_id)).
    /// The message carries the codec's content type in its `content-type`
    /// header.
    pub fn encode<T: ?Sized>(&self, value: &T) -> Result<Message>
    where
        C: Encode<T>,
    {
        crate::codec::encode_message::<C, T>(value)
    }

    /// Encodes `value` and publishes it to `subject`.
    pub async fn publish<T: ?Sized>(&self, subject: &str, value: &T) -> Result<()>
    where
        C: Encode<T>,
    {
        let message = self.encode(value)?;
        self.send(subject, message).await
    }

    /// Publishes a prepared message, waiting for queue space at most this
    /// publisher's timeout.
    pub async fn send(&self, subject: &str, message: Message) -> Result<()> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        send!(
            self.outgoing,
            Publish,
            self.broker.name(),
            subject,
            message,
            self.broker.publish_message(subject, message, deadline)
        )
    }

    /// Publishes a prepared message, waiting for queue space until
    /// `deadline` at most.
    pub async fn send_until(
        &self,
        subject: &str,
        message: Message,
        deadline: Instant,
    ) -> Result<()> {
        send!(
            self.outgoing,
            Publish,
            self.broker.name(),
            subject,
            message,
            self.broker
                .publish_message(subject, message, Some(deadline))
        )
    }
}

impl<B: Requester, C: Codec> Publisher<B, C> {
    /// Sends `value` as a request and decodes the reply. Failures of the
    /// other side come back as their own variants: [`Error::Protocol`](crate::Error::Protocol) (the
    /// request could not be decoded there), [`Error::Handler`](crate::Error::Handler),
    /// [`Error::StructuralLimit`](crate::Error::StructuralLimit); no reply in time is [`Error::Timeout`](crate::Error::Timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream::prelude::*;
    /// use ruststream::Publisher;
    ///
    /// #[subscriber("math.double")]
    /// async fn double(n: u64) -> u64 {
    ///     n * 2
    /// }
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let broker = MemoryBroker::new();
    /// let running = App::new().broker(broker.clone()).subscriber(double).start().await?;
    /// let client = Publisher::new(broker);
    /// let four: u64 = client.request("math.double", &2, Duration::from_secs(1)).await?;
    /// assert_eq!(four, 4);
    /// running.shutdown().await?;
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    pub async fn request<T, R>(&self, subject: &str, value: &T, timeout: Duration) -> Result<R>
    where
        T: ?Sized,
        C: Encode<T> + Decode<R>,
    {
        let message = self.encode(value)?;
        let reply = self.request_message(subject, message, timeout).await?;
        crate::codec::decode_reply::<C, R>(&reply)
    }

    /// Sends a prepared message as a request; the reply's status is mapped
    /// to an error as in [`request`](Self::request).
    pub async fn request_message(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        send!(
            self.outgoing,
            Request,
            self.broker.name(),
            subject,
            message,
            self.broker.request_message(subject, message, timeout)
        )
    }
}
