//! The middleware path of a delivery: the handler as the innermost
//! [`tower::Service`], the subscriber's stack built once at start, and one
//! call through it. Without middleware none of this runs.

use std::any::Any;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;
use tower::util::BoxCloneSyncService;
use tracing::Instrument;

use super::{Caught, Unit, or_abort};
use crate::binding::erased::ErasedBroker;
use crate::binding::{Broker, Delivery};
use crate::host::AppHandle;
use crate::ingress::JobPermit;
use crate::middleware::{HandlerService, Next, Request, SharedMiddleware};
use crate::subscriber::{Outcome, Scope, SendSubscriber, Subscriber};
use crate::tasks::FollowUps;
use crate::{BoxError, Envelope};

/// The handler as the innermost service. Its panics are caught here, so the
/// layers around it see them as failures.
struct Handler<S>(Arc<S>);

impl<S> Clone for Handler<S> {
    fn clone(&self) -> Self {
        Handler(Arc::clone(&self.0))
    }
}

impl<S: SendSubscriber> Service<Request> for Handler<S> {
    type Response = Outcome;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Outcome, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let subscriber = Arc::clone(&self.0);
        Box::pin(async move {
            let Request {
                handler: _,
                envelope,
                body,
                app,
                broker,
                follow_ups,
                permit,
            } = request;
            // JQ-4 step 5: the permit returns right before the handler.
            drop(permit);
            let Ok(body) = body.downcast::<S::Body>() else {
                return Err("a middleware replaced the request's body with another type".into());
            };
            let scope = Scope::with_follow_ups(&envelope, &app, &*broker, follow_ups);
            let handler = pin!(subscriber.handle_send(*body, &scope));
            Ok(Caught(handler).await)
        })
    }
}

/// A subscriber's stack, outermost first in `layers`; `None` without layers
/// and without timings (the handler is called directly).
pub(crate) fn stack<S: SendSubscriber>(
    subscriber: &Arc<S>,
    layers: &[SharedMiddleware],
    timed: bool,
) -> Option<HandlerService> {
    if layers.is_empty() && !timed {
        return None;
    }
    let handler = BoxCloneSyncService::new(Handler(Arc::clone(subscriber)));
    Some(
        layers
            .iter()
            .rev()
            .fold(handler, |inner, layer| layer.0.wrap(inner)),
    )
}

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// `invoke!` with middleware: the delivery through the subscriber's
    /// stack, then its settlement, unless the shutdown timeout aborts first
    /// (the delivery is then dropped unsettled, never acked).
    pub(crate) async fn through_stack<D: Delivery>(
        &self,
        service: &HandlerService,
        delivery: D,
        body: Box<dyn Any + Send>,
        permit: Option<JobPermit>,
    ) {
        if self.traced {
            let span = self.span(delivery.envelope());
            return self
                .stacked(service, delivery, body, permit)
                .instrument(span)
                .await;
        }
        self.stacked(service, delivery, body, permit).await
    }

    async fn stacked<D: Delivery>(
        &self,
        service: &HandlerService,
        delivery: D,
        body: Box<dyn Any + Send>,
        permit: Option<JobPermit>,
    ) {
        let mut aborted = pin!(self.abort.cancelled());
        let started = self.metrics.started();
        let called = {
            let call = pin!(call(
                service,
                self.subscriber.name(),
                delivery.envelope(),
                body,
                permit,
                &self.app,
                &self.broker
            ));
            or_abort(call, aborted.as_mut()).await
        };
        self.metrics.finished(started);
        let Some((outcome, follow_ups)) = called else {
            return self.aborted();
        };
        let settle = pin!(self.settle_outcome(delivery, outcome, Some(follow_ups)));
        if or_abort(settle, aborted).await.is_none() {
            self.aborted();
        }
    }
}

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// `invoke!` for a traced `!Send` handler (which has no stack): the
    /// handler and its settlement in the delivery's span.
    pub(crate) async fn traced_local<D: Delivery>(&self, delivery: D, body: S::Body) {
        let span = self.span(delivery.envelope());
        async {
            let mut aborted = pin!(self.abort.cancelled());
            let scope = Scope::new(delivery.envelope(), &self.app, &self.broker);
            let outcome = {
                let handler = pin!(self.subscriber.handle(body, &scope));
                or_abort(Caught(handler), aborted.as_mut()).await
            };
            let Some(outcome) = outcome else {
                return self.aborted();
            };
            let follow_ups = scope.into_follow_ups();
            let settle = pin!(self.settle_outcome(delivery, outcome, follow_ups));
            if or_abort(settle, aborted).await.is_none() {
                self.aborted();
            }
        }
        .instrument(span)
        .await
    }
}

/// Runs a delivery through its stack: the outcome, and the follow-ups the
/// handler asked for. A layer's error (a timeout, a refusal) is a handler
/// error: retried up to the attempts, never acked.
async fn call(
    service: &HandlerService,
    handler: &'static str,
    envelope: &Envelope,
    body: Box<dyn Any + Send>,
    permit: Option<JobPermit>,
    app: &AppHandle,
    broker: &dyn ErasedBroker,
) -> (Outcome, Arc<FollowUps>) {
    let follow_ups = Arc::new(FollowUps::new(app.clone()));
    let request = Request {
        handler,
        envelope: envelope.clone(),
        body,
        app: app.clone(),
        broker: broker.clone_arc(),
        follow_ups: Arc::clone(&follow_ups),
        permit,
    };
    (Next::new(service.clone()).run(request).await, follow_ups)
}
