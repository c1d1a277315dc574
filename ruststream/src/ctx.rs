//! [`Ctx`]: what a handler may know about the delivery it is handling, and
//! (with `Ctx<MainRuntime>`) a way to hand work to the application runtime.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::binding::erased::ErasedBroker;
use crate::host::AppHandle;
use crate::tasks::FollowUps;
use crate::{Envelope, Error, Headers, Json, Text};

mod sealed {
    pub trait Sealed {}
}

/// Which runtime a [`Ctx`] can hand work to: [`Here`] (nothing extra, the
/// default) or [`MainRuntime`].
pub trait CtxRuntime: sealed::Sealed + Send + Sync + 'static {
    #[doc(hidden)]
    type Handle: Clone + Send + Sync + 'static;
    #[doc(hidden)]
    fn handle(app: &AppHandle) -> Self::Handle;
}

/// The default [`Ctx`] runtime marker: delivery metadata only.
#[derive(Clone, Copy, Debug, Default)]
pub struct Here;

/// `Ctx<MainRuntime>` can [`spawn`](Ctx::spawn) and [`run`](Ctx::run) futures
/// on the application runtime, tracked by the app. Useful from
/// `threads(n)` handlers, whose own runtime ends with their thread: a plain
/// `tokio::spawn` there is not tracked and dies with the thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct MainRuntime;

impl sealed::Sealed for Here {}
impl sealed::Sealed for MainRuntime {}

impl CtxRuntime for Here {
    type Handle = ();
    fn handle(_: &AppHandle) {}
}

impl CtxRuntime for MainRuntime {
    type Handle = AppHandle;
    fn handle(app: &AppHandle) -> AppHandle {
        app.clone()
    }
}

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
pub struct Ctx<R: CtxRuntime = Here> {
    env: Envelope,
    runtime: R::Handle,
    /// The broker that delivered the message: what `publish` and `request`
    /// go through.
    broker: Arc<dyn ErasedBroker>,
    follow_ups: Arc<FollowUps>,
}

impl<R: CtxRuntime> Clone for Ctx<R> {
    fn clone(&self) -> Self {
        Ctx {
            env: self.env.clone(),
            runtime: self.runtime.clone(),
            broker: Arc::clone(&self.broker),
            follow_ups: Arc::clone(&self.follow_ups),
        }
    }
}

impl<R: CtxRuntime> fmt::Debug for Ctx<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx").field("envelope", &self.env).finish()
    }
}

impl<R: CtxRuntime> Ctx<R> {
    pub(crate) fn new(
        env: &Envelope,
        app: &AppHandle,
        broker: Arc<dyn ErasedBroker>,
        follow_ups: Arc<FollowUps>,
    ) -> Self {
        Ctx {
            env: env.clone(),
            runtime: R::handle(app),
            broker,
            follow_ups,
        }
    }

    /// Publishes `value`, JSON-encoded, to `subject` on the broker that
    /// delivered this message (its default publish deadline). For another
    /// codec, headers or a deadline, use a [`Publisher`](crate::Publisher).
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// #[subscriber("orders")]
    /// async fn confirm(id: u64, ctx: Ctx) -> Result<(), HandlerError> {
    ///     ctx.publish("orders.confirmed", &id).await?;
    ///     Ok(())
    /// }
    /// ```
    pub async fn publish<T: Serialize + ?Sized>(
        &self,
        subject: &str,
        value: &T,
    ) -> Result<(), Error> {
        let message = crate::codec::encode_message::<Json, T>(value)?;
        crate::outgoing::send!(
            self.outgoing(),
            Publish,
            self.broker.name(),
            subject,
            message,
            self.broker.publish_boxed(subject, message, None)
        )
    }

    /// Sends `value`, JSON-encoded, as a request on the broker that
    /// delivered this message and decodes the reply; a reply that reports a
    /// failure is an error (as for
    /// [`Requester::request_message`](crate::Requester::request_message)).
    pub async fn request<T, R2>(
        &self,
        subject: &str,
        value: &T,
        timeout: Duration,
    ) -> Result<R2, Error>
    where
        T: Serialize + ?Sized,
        R2: DeserializeOwned,
    {
        let message = crate::codec::encode_message::<Json, T>(value)?;
        let reply = crate::outgoing::send!(
            self.outgoing(),
            Request,
            self.broker.name(),
            subject,
            message,
            async {
                (self.broker.request_boxed(subject, message, timeout).await)
                    .and_then(crate::binding::reply_result)
            }
        )?;
        crate::codec::decode_reply::<Json, R2>(&reply)
    }

    fn outgoing(&self) -> &crate::outgoing::Outgoing {
        self.follow_ups.app.outgoing()
    }

    /// Runs `continuation` after this delivery is acked, as a task the app
    /// tracks: it starts at most once, only if the handler succeeds, and a
    /// graceful shutdown waits for it.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// #[subscriber("orders")]
    /// async fn confirm(id: u64, ctx: Ctx) {
    ///     ctx.and_after(async move { println!("order {id} acked; emailing") });
    /// }
    /// ```
    pub fn and_after(&self, continuation: impl Future<Output = ()> + Send + 'static) {
        self.follow_ups.and_after(Box::pin(continuation));
    }

    /// Asks for this message again after `delay`: the delivery is acked, and
    /// a tracked timer republishes it to its subject with the attempt count
    /// plus one. Past the subscriber's `max_attempts` it is rejected
    /// (dead-lettered) instead. A timer pending at shutdown publishes at once,
    /// with the remaining delay in a header the next consumer honours.
    /// Brokers that can hold the delay (RabbitMQ, JetStream) keep it
    /// instead of a timer, and the retry survives a crash
    /// ([`Delivery::retry_after`](crate::Delivery::retry_after)).
    pub fn retry_after(&self, delay: Duration) {
        self.follow_ups.retry_after(delay);
    }

    /// A [`Publisher`](crate::Publisher) on the app's first broker of type
    /// `B`, for sending from a handler.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// #[subscriber("orders")]
    /// async fn confirm(id: u64, ctx: Ctx) -> Result<(), HandlerError> {
    ///     let out = ctx.publisher::<MemoryBroker>().expect("registered");
    ///     out.publish("orders.confirmed", &id).await?;
    ///     Ok(())
    /// }
    /// ```
    pub fn publisher<B: crate::Broker>(&self) -> Option<crate::Publisher<B>> {
        self.follow_ups.app.publisher::<B>()
    }

    /// The shared state of type `T` registered with
    /// [`App::state`](crate::App::state).
    pub fn state<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.follow_ups.app.state::<T>()
    }

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

    /// Delivery attempt: 1 for the first delivery, +1 per redelivery or
    /// `retry_after`.
    pub fn attempt(&self) -> u32 {
        self.env.total_attempt()
    }

    /// The raw payload (the body argument is its decoded form).
    pub fn payload(&self) -> &Bytes {
        self.env.payload()
    }
}

impl Ctx<MainRuntime> {
    /// Runs `future` on the application runtime, tracked by the app: a
    /// graceful shutdown waits for it.
    ///
    /// ```
    /// use ruststream::prelude::*;
    /// use ruststream::MainRuntime;
    ///
    /// #[subscriber("thumbnails", threads(2))]
    /// async fn thumbnail(job: String, ctx: Ctx<MainRuntime>) {
    ///     ctx.spawn(async move { println!("indexing {job} on the app runtime") });
    /// }
    /// ```
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.spawn(future)
    }

    /// Runs `future` on the application runtime (tracked) and waits for its
    /// output: for `Send` work a `threads(n)` handler wants done on the shared
    /// runtime, such as I/O through clients created there.
    pub async fn run<F>(&self, future: F) -> Result<F::Output, Error>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn(future).await.map_err(|e| Error::App(e.into()))
    }
}
