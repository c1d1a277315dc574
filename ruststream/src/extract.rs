//! Extractors: what a handler asks for beside its message body.
//!
//! A `#[subscriber]` function's first argument is the body, decoded by the
//! subscriber's codec; every further argument is an extractor, a type that
//! implements [`FromDelivery`]. The built-in ones read the delivery
//! ([`Subject`], [`Attempt`], [`Key`], [`CorrelationId`], [`ReplyTo`],
//! [`Headers`], a single [`Header`], the raw [`Payload`])
//! or the app ([`State`], [`Ctx`]). Your own
//! types work the same way:
//!
//! ```
//! use ruststream::prelude::*;
//! use ruststream::extract::FromDelivery;
//! use ruststream::subscriber::Scope;
//!
//! /// The tenant a message belongs to, from its `tenant` header.
//! struct Tenant(String);
//!
//! impl FromDelivery for Tenant {
//!     fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
//!         match scope.envelope().headers().get("tenant") {
//!             Some(id) => Ok(Tenant(id.to_owned())),
//!             // No retry can add a header: dead-letter it, with the reason.
//!             None => Err(HandlerError::reject("a message needs a `tenant` header")),
//!         }
//!     }
//! }
//!
//! #[subscriber("invoices")]
//! async fn invoice(amount: u64, tenant: Tenant) {
//!     println!("{} cents for {}", amount, tenant.0);
//! }
//! # fn main() {}
//! ```
//!
//! An extractor that fails stops the delivery before the handler: its
//! error settles it like a handler's would (a `reject` dead-letters it
//! with the reason, a `retry` redelivers it). `Option<E>` of any extractor
//! is `None` instead of failing.

use std::marker::PhantomData;

use bytes::Bytes;

use crate::ctx::CtxRuntime;
use crate::subscriber::{Scope, StateKey};
use crate::{HandlerError, Text};

/// Every extractor in one place: the ones that live at the crate root too.
pub use crate::{Ctx, Headers, State};

/// A handler argument taken from the delivery or the app, not decoded from
/// the payload.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an extractor",
    label = "a handler argument after the body must be an extractor",
    note = "a subscriber's first argument is the message body; the others are extractors: `Ctx`, `State<T>`, `Headers`, `Header<N>`, `Subject`, `Attempt`, `Key`, `CorrelationId`, `ReplyTo`, `Payload`, `Option<..>` of them, or a type of yours that implements `ruststream::extract::FromDelivery`"
)]
pub trait FromDelivery: Sized {
    /// Takes the value from the delivery in hand. An error settles the
    /// delivery without running the handler.
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError>;

    /// Shared state this extractor needs the app to hold: `App::start`
    /// fails with a configuration error when it is missing. `None` (the
    /// default) for extractors that need none.
    fn required_state() -> Option<StateKey> {
        None
    }
}

/// An extractor a batch handler (`#[subscriber(.., batch(..))]`) may
/// take: one that reads the app, not a single delivery. [`State<T>`]
/// is one; implement it for an extractor of yours that reads only
/// [`Scope::app`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be taken by a batch handler",
    label = "a batch handler's arguments after the records must read the app, not one delivery",
    note = "a batch handler takes its records (`Vec<T>`) and `State<T>` arguments, or a type of yours that implements `ruststream::extract::FromBatch`"
)]
pub trait FromBatch: FromDelivery {
    /// Takes the value for a batch. The default is
    /// [`from_delivery`](FromDelivery::from_delivery) on a scope whose
    /// envelope is the batch's first record.
    fn from_batch(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        Self::from_delivery(scope)
    }
}

impl<T: Send + Sync + 'static> FromBatch for State<T> {}

impl<E: FromDelivery> FromDelivery for Option<E> {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        Ok(E::from_delivery(scope).ok())
    }
}

impl<R: CtxRuntime> FromDelivery for Ctx<R> {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        Ok(scope.ctx())
    }
}

impl<T: Send + Sync + 'static> FromDelivery for State<T> {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        match scope.app().state::<T>() {
            Some(value) => Ok(State(value)),
            None => Err(HandlerError::reject(format!(
                "no shared state of type `{}`: register it with `App::state(..)`",
                std::any::type_name::<T>()
            ))),
        }
    }

    fn required_state() -> Option<StateKey> {
        Some(StateKey::of::<T>())
    }
}

impl FromDelivery for Headers {
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        Ok(scope.envelope().headers().clone())
    }
}

/// The subject the message arrived on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject(pub Text);

impl FromDelivery for Subject {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        Ok(Subject(scope.envelope().subject().clone()))
    }
}

/// The delivery attempt: 1 for the first delivery, one more per redelivery
/// or `retry_after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt(pub u32);

impl FromDelivery for Attempt {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        Ok(Attempt(scope.envelope().total_attempt()))
    }
}

/// The ordering key the publisher set. A message without one is rejected;
/// take `Option<Key>` when keys are optional.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key(pub Text);

impl FromDelivery for Key {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        scope
            .envelope()
            .key()
            .map(|key| Key(key.clone()))
            .ok_or_else(|| HandlerError::reject("the message has no key"))
    }
}

/// The correlation id the publisher set. A message without one is
/// rejected; take `Option<CorrelationId>` when it is optional.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorrelationId(pub Text);

impl FromDelivery for CorrelationId {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        scope
            .envelope()
            .correlation_id()
            .map(|id| CorrelationId(id.clone()))
            .ok_or_else(|| HandlerError::reject("the message has no correlation id"))
    }
}

/// Where a request wants its reply. A one-way message is rejected; take
/// `Option<ReplyTo>` in a handler that serves both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyTo(pub Text);

impl FromDelivery for ReplyTo {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        scope
            .envelope()
            .reply_to()
            .map(|to| ReplyTo(to.clone()))
            .ok_or_else(|| HandlerError::reject("the message is not a request"))
    }
}

/// The raw payload, beside a typed body (a `Bytes` *body* is the raw
/// payload already).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload(pub Bytes);

impl FromDelivery for Payload {
    #[inline]
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        Ok(Payload(scope.envelope().payload().clone()))
    }
}

/// The name of a header, for [`Header`]: declare one with
/// [`header_name!`](crate::header_name).
pub trait HeaderName {
    /// The header's name.
    const NAME: &'static str;
}

/// One header's value, by name. A message without it is rejected; take
/// `Option<Header<N>>` when it is optional.
///
/// ```
/// use ruststream::prelude::*;
/// use ruststream::extract::Header;
///
/// ruststream::header_name!(TraceId = "trace-id");
///
/// #[subscriber("audit")]
/// async fn audit(line: String, trace: Option<Header<TraceId>>) {
///     let trace = trace.as_ref().map_or("-", |t| t.value());
///     println!("[{trace}] {line}");
/// }
/// # fn main() {}
/// ```
pub struct Header<N: HeaderName> {
    value: String,
    _name: PhantomData<fn() -> N>,
}

impl<N: HeaderName> Header<N> {
    /// The header's value.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The value, owned.
    pub fn into_value(self) -> String {
        self.value
    }
}

impl<N: HeaderName> std::fmt::Debug for Header<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Header")
            .field(&N::NAME)
            .field(&self.value)
            .finish()
    }
}

impl<N: HeaderName> FromDelivery for Header<N> {
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        match scope.envelope().headers().get(N::NAME) {
            Some(value) => Ok(Header {
                value: value.to_owned(),
                _name: PhantomData,
            }),
            None => Err(HandlerError::reject(format!(
                "the message has no `{}` header",
                N::NAME
            ))),
        }
    }
}

/// Declares a header name for [`Header`]:
/// `header_name!(TraceId = "trace-id");` makes a type `TraceId`, and a
/// handler argument `trace: Header<TraceId>` reads that header.
#[macro_export]
macro_rules! header_name {
    ($(#[$attr:meta])* $vis:vis $name:ident = $header:literal) => {
        $(#[$attr])*
        #[doc = concat!("The `", $header, "` header (see `ruststream::extract::Header`).")]
        $vis struct $name;

        impl $crate::extract::HeaderName for $name {
            const NAME: &'static str = $header;
        }
    };
}
