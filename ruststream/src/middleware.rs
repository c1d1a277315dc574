//! Middleware around handlers: [`tower`] layers over a service that takes a
//! [`Request`] (a decoded delivery with its context) and answers the
//! handler's [`Outcome`].
//!
//! Middleware added with [`App::middleware`](crate::App::middleware) wraps
//! every subscriber, with
//! [`SubscriberConfig::middleware`](crate::subscriber::SubscriberConfig::middleware)
//! one subscriber; the first added runs outermost, the app's outside the
//! subscriber's. It runs after decode and around the handler, and sees what
//! the handler returned: one delivery still goes checks → accept layers →
//! decode → middleware and handler → reply → settlement (RT-7). Stock tower
//! layers work as they are, and [`from_fn`] turns an `async` closure into
//! one:
//!
//! ```
//! use std::time::Duration;
//! use ruststream::prelude::*;
//! use tower::limit::ConcurrencyLimitLayer;
//! use tower::timeout::TimeoutLayer;
//!
//! #[subscriber("reports", workers(8))]
//! async fn report(_job: Bytes) {}
//!
//! let app = App::new()
//!     .broker(MemoryBroker::new())
//!     // A handler that runs longer fails (retried up to its attempts).
//!     .middleware(TimeoutLayer::new(Duration::from_secs(30)))
//!     .subscriber(report.configure(|c| c.middleware(ConcurrencyLimitLayer::new(2))));
//! # drop(app);
//! ```
//!
//! A layer's error (a timeout, a refusal) is a handler error: the delivery
//! is retried up to its `max_attempts`, then dead-lettered — never acked.
//! A handler's panic reaches the layers as a failure. Without middleware
//! none of this runs: the handler is called directly, at no cost.
//! `threads(n)` subscribers, whose handler futures may be `!Send`, take no
//! middleware: the app's skips them (logged at start), and
//! `.middleware(..)` on one is a startup error.

use std::any::Any;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use crate::binding::erased::ErasedBroker;
use crate::host::AppHandle;
use crate::tasks::FollowUps;
use crate::{Envelope, HandlerError, Headers};

/// The error a [`HandlerService`] returns (re-exported for layer authors).
pub use crate::BoxError;
pub use crate::outcome::Outcome;
pub use crate::outgoing::OnPublish;

/// One decoded delivery on its way to the handler: what middleware sees and
/// may change (a header added here is what the handler's extractors read).
pub struct Request {
    pub(crate) handler: &'static str,
    pub(crate) envelope: Envelope,
    pub(crate) body: Box<dyn Any + Send>,
    pub(crate) app: AppHandle,
    pub(crate) broker: Arc<dyn ErasedBroker>,
    pub(crate) follow_ups: Arc<FollowUps>,
    /// The delivery's job permit, returned right before the handler (JQ-4
    /// step 5): a delivery a layer holds up still counts in the job queue.
    pub(crate) permit: Option<crate::ingress::JobPermit>,
}

impl Request {
    /// The name of the handler this request is for (for `#[subscriber]`,
    /// the path of the function).
    pub fn handler(&self) -> &'static str {
        self.handler
    }

    /// The delivery: subject, headers, key, attempt, payload.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The delivery's headers, to change before the handler reads them
    /// (its [`Header`](crate::extract::Header) and
    /// [`Headers`] arguments see the change).
    pub fn headers_mut(&mut self) -> &mut Headers {
        self.envelope.headers_mut()
    }

    /// The decoded body, if it is a `T` (the handler's body type).
    pub fn body<T: 'static>(&self) -> Option<&T> {
        self.body.downcast_ref()
    }

    /// The app: shared state, publishers.
    pub fn app(&self) -> &AppHandle {
        &self.app
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("envelope", &self.envelope)
            .finish_non_exhaustive()
    }
}

/// The service a layer wraps: a [`Request`] in, the handler's [`Outcome`]
/// out.
pub type HandlerService = BoxCloneSyncService<Request, Outcome, BoxError>;

/// A [`tower::Layer`] that can wrap handlers: its service takes a
/// [`Request`], answers an [`Outcome`], is `Clone + Send + Sync` and its
/// error converts into a [`BoxError`]. Implemented for every such layer
/// (`TimeoutLayer`, `ConcurrencyLimitLayer`, `ServiceBuilder` stacks, one's
/// own); nothing to implement by hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot wrap ruststream handlers",
    label = "not a tower layer over `ruststream::middleware::HandlerService`",
    note = "a middleware is a `tower::Layer<HandlerService>` whose service takes a `Request`, answers an `Outcome`, and is `Clone + Send + Sync`"
)]
pub trait Middleware: Send + Sync + 'static {
    /// Wraps `inner`, once per subscriber at start.
    fn wrap(&self, inner: HandlerService) -> HandlerService;
}

impl<L> Middleware for L
where
    L: Layer<HandlerService> + Send + Sync + 'static,
    L::Service: Service<Request, Response = Outcome> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Error: Into<BoxError>,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    fn wrap(&self, inner: HandlerService) -> HandlerService {
        BoxCloneSyncService::new(self.layer(inner).map_err(Into::into))
    }
}

/// A middleware as the app and subscriber configurations keep it.
#[derive(Clone)]
pub(crate) struct SharedMiddleware(pub(crate) Arc<dyn Middleware>);

impl fmt::Debug for SharedMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Middleware")
    }
}

/// A middleware written as an `async` function of the request and the rest
/// of the stack — the shortest way to time, log or enrich deliveries:
///
/// ```
/// use std::time::Instant;
/// use ruststream::prelude::*;
/// use ruststream::middleware::{self, Next, Outcome, Request};
///
/// #[subscriber("orders")]
/// async fn confirm(_order: Bytes) {}
///
/// let timing = middleware::from_fn(|request: Request, next: Next| async move {
///     let subject = request.envelope().subject().clone();
///     let started = Instant::now();
///     let outcome = next.run(request).await;
///     let ok = matches!(outcome, Outcome::Ack(_));
///     tracing::info!(%subject, ok, elapsed = ?started.elapsed(), "handled");
///     outcome
/// });
/// let app = App::new().broker(MemoryBroker::new()).middleware(timing).subscriber(confirm);
/// # drop(app);
/// ```
///
/// Returning without calling `next` settles the delivery with that outcome:
/// the handler does not run.
pub fn from_fn<F, Fut>(f: F) -> FromFn<F>
where
    F: Fn(Request, Next) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    FromFn(f)
}

/// The layer [`from_fn`] makes.
#[derive(Clone)]
pub struct FromFn<F>(F);

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromFn")
    }
}

impl<F: Clone> Layer<HandlerService> for FromFn<F> {
    type Service = FromFnService<F>;

    fn layer(&self, inner: HandlerService) -> FromFnService<F> {
        FromFnService {
            f: self.0.clone(),
            inner,
        }
    }
}

/// The service a [`FromFn`] layer wraps its inner stack in.
#[derive(Clone)]
pub struct FromFnService<F> {
    f: F,
    inner: HandlerService,
}

impl<F> fmt::Debug for FromFnService<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromFnService")
    }
}

impl<F, Fut> Service<Request> for FromFnService<F>
where
    F: Fn(Request, Next) -> Fut,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    type Response = Outcome;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Outcome, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // `Next::run` waits for the inner stack's readiness itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let next = Next(self.inner.clone());
        let outcome = (self.f)(request, next);
        Box::pin(async move { Ok(outcome.await) })
    }
}

/// The rest of the stack, down to the handler, as a [`from_fn`] middleware
/// sees it.
pub struct Next(HandlerService);

impl fmt::Debug for Next {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Next")
    }
}

impl Next {
    pub(crate) fn new(rest: HandlerService) -> Self {
        Next(rest)
    }

    /// Runs the rest of the stack and the handler. An inner layer's error
    /// (a timeout, a refusal) comes back as a failure to retry.
    pub async fn run(self, request: Request) -> Outcome {
        match self.0.oneshot(request).await {
            Ok(outcome) => outcome,
            Err(err) => Outcome::Failed(HandlerError::retry(err)),
        }
    }
}
