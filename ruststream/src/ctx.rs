//! [`Ctx`]: what a handler may know about the delivery it is handling.

use bytes::Bytes;

use crate::{Envelope, Headers, Text};

/// The delivery context, taken by a handler as an extra argument.
///
/// ```
/// use ruststream::prelude::*;
///
/// #[subscriber("audit.events")]
/// async fn audit(event: String, ctx: Ctx) {
///     println!("{} (attempt {}) on {}", event, ctx.attempt(), ctx.subject());
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Ctx {
    env: Envelope,
}

impl From<&Envelope> for Ctx {
    /// The context of the delivery `env` (a cheap, allocation-free copy for
    /// deliveries without headers).
    fn from(env: &Envelope) -> Self {
        Ctx { env: env.clone() }
    }
}

impl Ctx {
    /// Subject the message arrived on.
    pub fn subject(&self) -> &Text {
        self.env.subject()
    }

    /// Message headers.
    pub fn headers(&self) -> &Headers {
        self.env.headers()
    }

    /// Ordering key, if the publisher set one.
    pub fn key(&self) -> Option<&Text> {
        self.env.key()
    }

    /// Reply subject, for requests.
    pub fn reply_to(&self) -> Option<&Text> {
        self.env.reply_to()
    }

    /// Correlation id, if any.
    pub fn correlation_id(&self) -> Option<&Text> {
        self.env.correlation_id()
    }

    /// Delivery attempt: 1 for the first delivery, +1 per redelivery.
    pub fn attempt(&self) -> u32 {
        self.env.attempt()
    }

    /// The raw payload (the body argument is its decoded form).
    pub fn payload(&self) -> &Bytes {
        self.env.payload()
    }
}
