//! Subscribers written by hand: the [`Subscriber`] trait that
//! `#[subscriber]` implements for you, its [`SubscriberConfig`], and what a
//! handler invocation sees ([`Scope`], [`Outcome`]). Reach for these to
//! build subscribers at run time; annotated functions need none of it.

use std::any::TypeId;
use std::future::Future;

use bytes::Bytes;

use std::sync::{Arc, OnceLock};

use crate::binding::erased::ErasedBroker;
use crate::ctx::CtxRuntime;
use crate::host::AppHandle;
use crate::tasks::FollowUps;
use crate::{BoxError, Codec, Ctx, Envelope, Text};

pub use crate::describe::MessageTypes;
#[cfg(feature = "asyncapi")]
pub use crate::describe::SchemaFn;
pub use crate::key::key_hash;
pub use crate::outcome::Outcome;
pub use config::{Batch, Mode, SubscriberConfig};

mod config;

/// What a handler invocation may look at: the delivery, the app, and the
/// broker that delivered it. Extractors
/// ([`FromDelivery`](crate::extract::FromDelivery)) read from it.
pub struct Scope<'a> {
    envelope: &'a Envelope,
    app: &'a AppHandle,
    broker: &'a dyn ErasedBroker,
    /// Created with the first [`Ctx`]: the follow-ups it may ask for.
    follow_ups: OnceLock<Arc<FollowUps>>,
}

impl<'a> Scope<'a> {
    #[inline]
    pub(crate) fn new(
        envelope: &'a Envelope,
        app: &'a AppHandle,
        broker: &'a dyn ErasedBroker,
    ) -> Self {
        Scope {
            envelope,
            app,
            broker,
            follow_ups: OnceLock::new(),
        }
    }

    /// A scope whose follow-ups are made already (the middleware path).
    pub(crate) fn with_follow_ups(
        envelope: &'a Envelope,
        app: &'a AppHandle,
        broker: &'a dyn ErasedBroker,
        follow_ups: Arc<FollowUps>,
    ) -> Self {
        Scope {
            envelope,
            app,
            broker,
            follow_ups: OnceLock::from(follow_ups),
        }
    }

    /// The delivery being handled.
    pub fn envelope(&self) -> &'a Envelope {
        self.envelope
    }

    /// The app.
    pub fn app(&self) -> &'a AppHandle {
        self.app
    }

    /// The handler context for this delivery.
    pub fn ctx<R: CtxRuntime>(&self) -> Ctx<R> {
        let follow_ups = self
            .follow_ups
            .get_or_init(|| Arc::new(FollowUps::new(self.app.clone())));
        Ctx::new(
            self.envelope,
            self.app,
            self.broker.clone_arc(),
            Arc::clone(follow_ups),
        )
    }

    /// The shared state of type `T` (see [`App::state`](crate::App::state)).
    ///
    /// # Panics
    /// If the app has no state of type `T`. `App::start` checks every type a
    /// subscriber lists in [`Subscriber::required_state`] (all of a
    /// `#[subscriber]`'s `State<T>` arguments), so only a hand-written
    /// subscriber that leaves one out gets here.
    pub fn state<T: Send + Sync + 'static>(&self) -> State<T> {
        match self.app.state::<T>() {
            Some(value) => State(value),
            None => panic!(
                "no shared state of type `{}`: register it with `App::state(..)`",
                std::any::type_name::<T>()
            ),
        }
    }

    /// The follow-ups a handler asked for, if it took a `Ctx`.
    #[inline]
    pub(crate) fn into_follow_ups(self) -> Option<Arc<FollowUps>> {
        self.follow_ups.into_inner()
    }
}

/// Typed shared state as a handler argument: `db: State<Pool>` gives the
/// value registered with [`App::state`](crate::App::state).
///
/// ```
/// use ruststream::prelude::*;
/// use ruststream::State;
///
/// struct Greeting {
///     word: String,
/// }
///
/// #[subscriber("names")]
/// async fn greet(name: String, greeting: State<Greeting>) -> String {
///     format!("{}, {name}", greeting.word)
/// }
///
/// let app = App::new()
///     .broker(MemoryBroker::new())
///     .state(Greeting { word: "hello".into() })
///     .subscriber(greet);
/// # drop(app);
/// ```
#[derive(Debug)]
pub struct State<T>(pub Arc<T>);

impl<T> State<T> {
    /// A state value, for calling a handler directly (in a unit test) the
    /// way the app would.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// struct Rate {
    ///     per_cent: f64,
    /// }
    ///
    /// #[subscriber("prices")]
    /// async fn convert(cents: u64, rate: State<Rate>) -> f64 {
    ///     cents as f64 * rate.per_cent
    /// }
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// assert_eq!(convert(100, State::new(Rate { per_cent: 0.5 })).await, 50.0);
    /// # });
    /// ```
    pub fn new(value: T) -> Self {
        State(Arc::new(value))
    }
}

impl<T> From<Arc<T>> for State<T> {
    fn from(value: Arc<T>) -> Self {
        State(value)
    }
}

impl<T> Clone for State<T> {
    fn clone(&self) -> Self {
        State(Arc::clone(&self.0))
    }
}

impl<T> std::ops::Deref for State<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A message handler with its configuration. `#[subscriber]` implements it for
/// a hidden companion type of the annotated function; implement it by hand to
/// build subscribers at run time.
///
/// The handler future may be `!Send`: such a subscriber runs only in
/// `threads(n)` mode. Every other mode needs [`SendSubscriber`] too.
pub trait Subscriber: Send + Sync + 'static {
    /// The decoded message body.
    type Body: Send + 'static;
    /// The payload format.
    type Codec: Codec;

    /// Subject and settings.
    fn config(&self) -> SubscriberConfig;

    /// Decodes a payload (a failure never reaches [`handle`](Self::handle)).
    fn decode(&self, payload: &Bytes) -> Result<Self::Body, BoxError>;

    /// The ordering key of a delivery for `by_key` modes, as a hash. The
    /// default is the delivery's own key; deliveries without one share a key.
    fn key(&self, body: &Self::Body, envelope: &Envelope) -> u64 {
        let _ = body;
        crate::key::key_hash(&envelope.key().map(Text::as_str))
    }

    /// Runs the handler on a decoded body.
    fn handle(&self, body: Self::Body, scope: &Scope<'_>) -> impl Future<Output = Outcome>;

    /// The shared state types the handler takes. [`App::start`](crate::App::start)
    /// refuses to start when one of them is not registered: a missing state
    /// is a configuration error, never a failed delivery. `#[subscriber]`
    /// lists every `State<T>` argument; the default lists none.
    fn required_state(&self) -> Vec<StateKey> {
        Vec::new()
    }

    /// The handler's name, for errors and logs: its type's path by default
    /// (for `#[subscriber]`, the path of the function).
    fn name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }

    /// The content type [`decode`](Self::decode) reads. A delivery whose
    /// `content-type` header names another is malformed: it never reaches
    /// the handler. `None` (the default) takes any. `#[subscriber]` answers
    /// its codec's, or `None` for a raw body (`Bytes`, `String`, `Vec<u8>`).
    fn content_type(&self) -> Option<&'static str> {
        None
    }

    /// The content type of the replies [`handle`](Self::handle) encodes,
    /// set on each reply's `content-type` header; `None` (the default) sets
    /// none. `#[subscriber]` answers its codec's, or `None` for a raw reply.
    fn reply_content_type(&self) -> Option<&'static str> {
        None
    }

    /// The types of the messages it takes and replies with, for documents
    /// (`App::asyncapi`, feature `asyncapi`).
    /// `#[subscriber]` names its body and reply types, with their JSON
    /// Schemas when they implement `schemars::JsonSchema`; the default
    /// names the body type and no reply.
    fn message_types(&self) -> MessageTypes {
        MessageTypes::of::<Self::Body, ()>()
    }
}

/// One shared state type, as [`Subscriber::required_state`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateKey {
    id: TypeId,
    name: &'static str,
}

impl StateKey {
    /// The key of `T`.
    pub fn of<T: Send + Sync + 'static>() -> Self {
        StateKey {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }

    /// The type's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn id(&self) -> TypeId {
        self.id
    }
}

/// A [`Subscriber`] whose handler future is `Send`: it can run in every mode.
pub trait SendSubscriber: Subscriber {
    /// [`Subscriber::handle`], as a `Send` future.
    fn handle_send(
        &self,
        body: Self::Body,
        scope: &Scope<'_>,
    ) -> impl Future<Output = Outcome> + Send;

    /// Runs the handler on a batch of decoded bodies, in arrival order
    /// (a subscriber configured with [`SubscriberConfig::batch`]). The
    /// outcome settles every record of the batch: success acks each,
    /// a failure retries each (up to its own `max_attempts`) or rejects
    /// each. Records that did not decode never reach it: they are
    /// dead-lettered one by one, and the rest of the batch goes on.
    /// `scope` reads the app (shared state); its envelope is the first
    /// record's.
    ///
    /// The default fails every batch, saying the subscriber has no batch
    /// handler: `#[subscriber(.., batch(..))]` implements it.
    fn handle_batch(
        &self,
        bodies: Vec<Self::Body>,
        scope: &Scope<'_>,
    ) -> impl Future<Output = Outcome> + Send {
        let _ = (bodies, scope);
        let name = self.name();
        async move {
            Outcome::Failed(crate::HandlerError::reject(format!(
                "`{name}` is configured with batch(..) but implements no \
                 `SendSubscriber::handle_batch`"
            )))
        }
    }
}
