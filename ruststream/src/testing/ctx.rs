//! [`TestCtx`]: a delivery context for calling a handler directly.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::record::Recorder;
use crate::binding::erased::ErasedBroker;
use crate::codec::Decode;
use crate::host::AppHandle;
use crate::ingress::JobQueueSettings;
use crate::outgoing::{OnPublish, Outgoing};
use crate::tasks::FollowUps;
use crate::{Ctx, CtxRuntime, Envelope, Json, MainRuntime, MemoryBroker, Message, Text};

/// Builds a [`TestCtx`]: the delivery a handler under test sees.
///
/// ```
/// use ruststream::testing::TestCtx;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let test = TestCtx::new("orders.created")
///     .header("tenant", "acme")
///     .key("customer-7")
///     .attempt(2)
///     .correlation_id("req-1")
///     .state(String::from("shared"))
///     .build();
/// let ctx = test.ctx();
/// assert_eq!(ctx.headers().get("tenant"), Some("acme"));
/// assert_eq!(ctx.attempt(), 2);
/// assert_eq!(ctx.state::<String>().as_deref().map(String::as_str), Some("shared"));
/// # }
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct TestCtxBuilder {
    subject: Text,
    message: Message,
    attempt: u32,
    state: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl TestCtxBuilder {
    /// The payload the handler's `ctx.payload()` returns (the body argument
    /// is passed to the handler directly).
    pub fn payload(mut self, payload: impl Into<Bytes>) -> Self {
        self.message = self.message.with_payload(payload.into());
        self
    }

    /// A header.
    pub fn header(mut self, name: impl Into<Text>, value: impl Into<Text>) -> Self {
        self.message.headers_mut().insert(name, value);
        self
    }

    /// The ordering key.
    pub fn key(mut self, key: impl Into<Text>) -> Self {
        self.message = self.message.with_key(key);
        self
    }

    /// The correlation id.
    pub fn correlation_id(mut self, id: impl Into<Text>) -> Self {
        self.message = self.message.with_correlation_id(id);
        self
    }

    /// The delivery attempt (1 for a first delivery).
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Shared state, as [`App::state`](crate::App::state) registers it
    /// (what `ctx.state::<T>()` returns).
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(TypeId::of::<T>(), Arc::new(value));
        self
    }

    /// The context. Call it inside a tokio runtime (a `#[tokio::test]`).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn build(self) -> TestCtx {
        let recorder = Arc::new(Recorder::default());
        let hook: Arc<dyn OnPublish> = recorder.clone();
        let broker = MemoryBroker::new();
        let erased: Arc<dyn ErasedBroker> = Arc::new(broker.clone());
        let app = AppHandle::new(
            "app",
            self.state,
            None,
            &JobQueueSettings::default(),
            vec![Arc::clone(&erased)],
            Outgoing::new("app", vec![hook]),
        )
        .expect("the default job queue settings are valid");
        let envelope = Envelope::new(self.subject, self.message).with_attempt(self.attempt);
        TestCtx {
            follow_ups: Arc::new(FollowUps::new(app.clone())),
            envelope,
            app,
            broker: erased,
            recorder,
        }
    }
}

/// A delivery context for calling a handler directly, and what the handler
/// did with it: the messages it published (through `ctx.publish`,
/// `ctx.request` or a publisher from `ctx.publisher::<MemoryBroker>()`), the
/// retry it asked for, the follow-ups it scheduled. Nothing answers a
/// `ctx.request` here: it fails at once with
/// [`Error::NoResponders`](crate::Error::NoResponders).
pub struct TestCtx {
    envelope: Envelope,
    app: AppHandle,
    broker: Arc<dyn ErasedBroker>,
    follow_ups: Arc<FollowUps>,
    recorder: Arc<Recorder>,
}

impl TestCtx {
    /// A builder for a delivery on `subject` (attempt 1, empty payload, no
    /// headers, no state).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(subject: impl Into<Text>) -> TestCtxBuilder {
        TestCtxBuilder {
            subject: subject.into(),
            message: Message::new(Bytes::new()),
            attempt: 1,
            state: HashMap::new(),
        }
    }

    /// The [`Ctx`] to pass to the handler; every copy records into this
    /// `TestCtx`.
    pub fn ctx(&self) -> Ctx {
        self.ctx_on()
    }

    /// A `Ctx<MainRuntime>`, for handlers of `threads(n)` subscribers that
    /// spawn on the app's runtime (here: the test's).
    pub fn main_ctx(&self) -> Ctx<MainRuntime> {
        self.ctx_on()
    }

    fn ctx_on<R: CtxRuntime>(&self) -> Ctx<R> {
        Ctx::new(
            &self.envelope,
            &self.app,
            Arc::clone(&self.broker),
            Arc::clone(&self.follow_ups),
        )
    }

    /// Every message the handler sent, with its subject, in order.
    pub fn published(&self) -> Vec<(String, Message)> {
        self.recorder.all()
    }

    /// The messages sent to `subject`, decoded as JSON (what `ctx.publish`
    /// writes).
    ///
    /// # Panics
    ///
    /// When one does not decode as `T`, with what was sent there.
    #[track_caller]
    pub fn published_as<T>(&self, subject: &str) -> Vec<T>
    where
        Json: Decode<T>,
    {
        self.recorder.decoded(subject)
    }

    /// The delay of the `ctx.retry_after` the handler asked for.
    pub fn retry_requested(&self) -> Option<Duration> {
        self.follow_ups.retry_requested()
    }

    /// How many `ctx.and_after` continuations wait for the ack.
    pub fn and_after_count(&self) -> usize {
        self.follow_ups.pending()
    }

    /// Acks the delivery as the pipeline would after a successful handler:
    /// runs the `and_after` continuations to completion, in order.
    pub async fn ack(&self) {
        for continuation in self.follow_ups.take_pending() {
            continuation.await;
        }
    }
}

impl fmt::Debug for TestCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCtx")
            .field("envelope", &self.envelope)
            .field("published", &self.published().len())
            .finish()
    }
}
