//! A broker with its type erased: what the app keeps of every registered
//! broker once its subscribers are bound (closing it, finding it again by
//! type for a `Publisher`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Broker, Requester};
use crate::{Envelope, Error, Message, Result};

/// A boxed `Send` future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A broker as the app sees it after registration, and as a handler's
/// `Ctx` sends through it.
pub(crate) trait ErasedBroker: Send + Sync {
    fn name(&self) -> &'static str;
    /// [`Broker::host`].
    #[cfg(feature = "asyncapi")]
    fn host(&self) -> Option<String>;
    fn close(&self) -> BoxFuture<'_, Result<()>>;
    /// For typed lookups ([`AppHandle::publisher`](crate::AppHandle::publisher)).
    fn as_any(&self) -> &dyn std::any::Any;
    /// A handle of its own (brokers are cheap to clone).
    fn clone_arc(&self) -> Arc<dyn ErasedBroker>;
    /// [`Broker::publish_message`].
    fn publish_boxed<'a>(
        &'a self,
        subject: &'a str,
        message: Message,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<()>>;
    /// [`Requester::send_request`], for brokers with a reply path.
    fn request_boxed<'a>(
        &'a self,
        subject: &'a str,
        message: Message,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Envelope>>;
}

impl<B: Broker> ErasedBroker for B {
    fn name(&self) -> &'static str {
        Broker::name(self)
    }

    #[cfg(feature = "asyncapi")]
    fn host(&self) -> Option<String> {
        Broker::host(self)
    }

    fn clone_arc(&self) -> Arc<dyn ErasedBroker> {
        Arc::new(self.clone())
    }

    fn publish_boxed<'a>(
        &'a self,
        subject: &'a str,
        message: Message,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.publish_message(subject, message, deadline))
    }

    fn request_boxed<'a>(
        &'a self,
        subject: &'a str,
        message: Message,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Envelope>> {
        match self.as_requester() {
            Some(requester) => requester.send_request_boxed(subject, message, timeout),
            None => Box::pin(std::future::ready(Err(Error::Config(format!(
                "the {} broker has no request/reply",
                Broker::name(self)
            ))))),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn close(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Broker::close(self))
    }
}

/// [`Requester`] without its type: what [`Broker::as_requester`] hands out.
pub trait DynRequester: Send + Sync {
    /// [`Requester::send_request`], boxed.
    fn send_request_boxed<'a>(
        &'a self,
        subject: &'a str,
        message: Message,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Envelope>>;
}

impl<R: Requester> DynRequester for R {
    fn send_request_boxed<'a>(
        &'a self,
        subject: &'a str,
        message: Message,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Envelope>> {
        Box::pin(self.send_request(subject, message, timeout))
    }
}
