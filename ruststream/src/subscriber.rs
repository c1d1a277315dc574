//! The [`Subscriber`] trait (what `#[subscriber]` implements) and its
//! [`SubscriberConfig`].

use std::future::Future;

use bytes::Bytes;

#[cfg(doc)]
use crate::Ctx;
use crate::{BoxError, Codec, Envelope, HandlerError, Text};

/// How one subscriber consumes: subject, queue group, dead-letter subject and
/// retry budget. Every `#[subscriber(...)]` argument has a method here, so apps
/// can configure subscribers without the macro.
///
/// ```
/// use ruststream::SubscriberConfig;
///
/// let config = SubscriberConfig::new("orders.created")
///     .queue_group("billing")
///     .dead_letter("orders.dlq")
///     .max_attempts(5);
/// assert_eq!(config.get_max_attempts(), 5);
/// ```
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    pub(crate) subject: Text,
    pub(crate) queue_group: Option<Text>,
    pub(crate) dead_letter: Option<Text>,
    pub(crate) max_attempts: u32,
}

impl SubscriberConfig {
    /// Default number of deliveries before a failing message is rejected.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

    /// A subscriber to `subject`, with defaults for everything else.
    pub fn new(subject: impl Into<Text>) -> Self {
        SubscriberConfig {
            subject: subject.into(),
            queue_group: None,
            dead_letter: None,
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Competes with the other members of `group` for messages.
    pub fn queue_group(mut self, group: impl Into<Text>) -> Self {
        self.queue_group = Some(group.into());
        self
    }

    /// Where rejected and exhausted messages go.
    pub fn dead_letter(mut self, subject: impl Into<Text>) -> Self {
        self.dead_letter = Some(subject.into());
        self
    }

    /// Deliveries a failing message gets before it is rejected (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The subject.
    pub fn subject(&self) -> &Text {
        &self.subject
    }

    /// The retry budget.
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    pub(crate) fn subscribe_options(&self) -> crate::SubscribeOptions {
        crate::SubscribeOptions {
            subject: self.subject.clone(),
            queue_group: self.queue_group.clone(),
            dead_letter: self.dead_letter.clone(),
        }
    }
}

/// What a handler produced.
#[derive(Debug)]
pub enum Outcome {
    /// Success, with the encoded reply if the handler returned a value.
    Ack(Option<Bytes>),
    /// Failure; the error decides between redelivery and rejection.
    Failed(HandlerError),
}

/// A message handler with its configuration. `#[subscriber]` implements it for
/// a hidden companion type of the annotated function; implement it by hand to
/// build subscribers at run time.
pub trait Subscriber: Send + Sync + 'static {
    /// The decoded message body.
    type Body: Send + 'static;
    /// The payload format.
    type Codec: Codec;

    /// Subject and settings.
    fn config(&self) -> SubscriberConfig;

    /// Decodes a payload (JQ-13: a failure never reaches [`handle`](Self::handle)).
    fn decode(&self, payload: &Bytes) -> Result<Self::Body, BoxError>;

    /// Runs the handler on a decoded body. `envelope` is the delivery being
    /// handled; build a [`Ctx`] from it (`Ctx::from(envelope)`) only if the
    /// handler takes one.
    fn handle(&self, body: Self::Body, envelope: &Envelope)
    -> impl Future<Output = Outcome> + Send;
}
