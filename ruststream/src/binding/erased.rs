//! A broker with its type erased: what the app keeps of every registered
//! broker once its subscribers are bound (closing it, finding it again by
//! type for a `Publisher`).

use std::future::Future;
use std::pin::Pin;

use super::Broker;
use crate::Result;

/// A boxed `Send` future.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A broker as the app sees it after registration.
pub(crate) trait ErasedBroker: Send + Sync {
    fn name(&self) -> &'static str;
    fn close(&self) -> BoxFuture<'_, Result<()>>;
    /// For typed lookups ([`AppHandle::publisher`](crate::AppHandle::publisher)).
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<B: Broker> ErasedBroker for B {
    fn name(&self) -> &'static str {
        Broker::name(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn close(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Broker::close(self))
    }
}
