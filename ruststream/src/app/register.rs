//! Type erasure at registration: each subscriber becomes a [`StartUnit`] whose
//! loop is compiled for its concrete broker and handler; brokers become
//! [`ErasedBroker`]s for closing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::Result;
use crate::accept::AcceptLayer;
use crate::binding::Broker;
use crate::exec;
use crate::exec::stop::Stop;
use crate::pipeline::Unit;
use crate::subscriber::Subscriber;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A broker as the app sees it after registration.
pub(crate) trait ErasedBroker: Send + Sync {
    fn name(&self) -> &'static str;
    fn close(&self) -> BoxFuture<'_, Result<()>>;
}

impl<B: Broker> ErasedBroker for B {
    fn name(&self) -> &'static str {
        Broker::name(self)
    }

    fn close(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Broker::close(self))
    }
}

/// A subscriber bound to its broker, ready to subscribe and spawn its loop.
pub(crate) trait StartUnit: Send {
    fn subject(&self) -> &str;
    fn start(
        self: Box<Self>,
        layers: Arc<[Arc<dyn AcceptLayer>]>,
        stop: Stop,
    ) -> BoxFuture<'static, Result<JoinHandle<()>>>;
}

struct Pending<B, S> {
    broker: B,
    subscriber: S,
    config: crate::SubscriberConfig,
}

pub(crate) fn unit<B: Broker, S: Subscriber>(broker: B, subscriber: S) -> Box<dyn StartUnit> {
    let config = subscriber.config();
    Box::new(Pending {
        broker,
        subscriber,
        config,
    })
}

impl<B: Broker, S: Subscriber> StartUnit for Pending<B, S> {
    fn subject(&self) -> &str {
        &self.config.subject
    }

    fn start(
        self: Box<Self>,
        layers: Arc<[Arc<dyn AcceptLayer>]>,
        stop: Stop,
    ) -> BoxFuture<'static, Result<JoinHandle<()>>> {
        Box::pin(async move {
            let subscription = self
                .broker
                .subscribe(self.config.subscribe_options())
                .await?;
            let unit = Unit {
                broker: self.broker,
                subscriber: self.subscriber,
                config: self.config,
                layers,
            };
            Ok(tokio::spawn(exec::sequential::run(
                unit,
                subscription,
                stop,
            )))
        })
    }
}

/// What [`App::subscriber`](crate::App::subscriber) accepts: a `#[subscriber]`
/// function or a [`Subscriber`] value. `M` only tells the two apart.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a subscriber",
    label = "expected a function annotated with `#[subscriber(...)]` or a `Subscriber` value",
    note = "annotate the handler with `#[subscriber(\"subject\")]` and pass the function itself: `.subscriber(my_handler)`"
)]
pub trait IntoSubscriber<M> {
    /// The subscriber it becomes.
    type Subscriber: Subscriber;
    /// Converts.
    fn into_subscriber(self) -> Self::Subscriber;
}

#[doc(hidden)]
pub enum Direct {}

impl<S: Subscriber> IntoSubscriber<Direct> for S {
    type Subscriber = S;
    fn into_subscriber(self) -> S {
        self
    }
}

macro_rules! handler_fn {
    ($($arg:ident),+) => {
        impl<F, S, Fut, $($arg),+> IntoSubscriber<fn($($arg),+)> for F
        where
            F: Fn($($arg),+) -> crate::__private::Handler<S, Fut>,
            S: Subscriber + Default,
        {
            type Subscriber = S;
            fn into_subscriber(self) -> S {
                S::default()
            }
        }
    };
}

handler_fn!(A1);
handler_fn!(A1, A2);
handler_fn!(A1, A2, A3);
handler_fn!(A1, A2, A3, A4);
