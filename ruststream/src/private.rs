//! Support for macro-generated code. Not a public API: it may change in any
//! release.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;

pub use bytes::Bytes;

pub use crate::__message_types as message_types;
#[cfg(feature = "asyncapi")]
pub use crate::describe::schema_kind;
pub use crate::key::key_hash;
pub use crate::subscriber::SubscriberConfig;
pub use crate::subscriber::{MessageTypes, Outcome};
pub use crate::{__outcome as outcome, Ctx, HandlerError};

/// What an extractor's error settles: marked, so the dead-letter reason
/// says the handler never ran.
pub fn extractor_failed(err: HandlerError) -> Outcome {
    Outcome::Failed(err.before_handler())
}

use crate::codec::{Decode, Encode};
use crate::{BoxError, Codec};

/// What a `#[subscriber]` function returns: its future, tagged with the
/// companion type that carries the subscriber's configuration, and with the
/// way it runs — [`Pooled`] (every mode; the future must be `Send`) or
/// [`Local`] (`threads(n)`; it may be `!Send`). `.await` it as the plain
/// future it wraps.
#[must_use = "a handler does nothing unless awaited"]
pub struct Handler<S, F, M = Pooled> {
    future: F,
    _subscriber: PhantomData<fn() -> (S, M)>,
}

/// [`Handler`] marker: runs in any mode.
pub enum Pooled {}

/// [`Handler`] marker: runs on dedicated threads only.
pub enum Local {}

impl<S, F, M> Handler<S, F, M> {
    /// Wraps the handler body's future.
    pub fn new(future: F) -> Self {
        Handler {
            future,
            _subscriber: PhantomData,
        }
    }
}

impl<S, F: Future, M> IntoFuture for Handler<S, F, M> {
    type Output = F::Output;
    type IntoFuture = F;
    fn into_future(self) -> F {
        self.future
    }
}

/// A `by_key = f` function: `fn(&Body) -> K` or `fn(&Body, &Envelope) -> K`,
/// `K: Hash`. `M` only tells the two forms apart.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot compute an ordering key",
    label = "expected `fn(&Body) -> impl Hash` or `fn(&Body, &Envelope) -> impl Hash`"
)]
pub trait KeyFn<B, M> {
    /// The key's hash.
    fn key_hash(&self, body: &B, envelope: &crate::Envelope) -> u64;
}

impl<B, K: std::hash::Hash, F: Fn(&B) -> K> KeyFn<B, (K,)> for F {
    fn key_hash(&self, body: &B, _: &crate::Envelope) -> u64 {
        key_hash(&self(body))
    }
}

impl<B, K: std::hash::Hash, F: Fn(&B, &crate::Envelope) -> K> KeyFn<B, (K, crate::Envelope)> for F {
    fn key_hash(&self, body: &B, envelope: &crate::Envelope) -> u64 {
        key_hash(&self(body, envelope))
    }
}

/// Requires a handler future to be `Send`, with advice when it is not.
#[diagnostic::on_unimplemented(
    message = "this handler's future is not `Send`",
    label = "it holds a `!Send` value across an `.await`",
    note = "a handler that keeps `!Send` state (`Rc`, `RefCell` guards, ...) across `.await` must run on dedicated threads: `#[subscriber(\"...\", threads(n))]`"
)]
pub trait SendHandlerFuture: Future + Send {}
impl<F: Future + Send> SendHandlerFuture for F {}

/// Identity, checking [`SendHandlerFuture`]. Named so that the compiler's
/// "future cannot be sent between threads safely" error, which names this
/// function, tells the fix: run the handler on `threads(n)`.
pub fn requires_send_handler_or_threads_n<F: SendHandlerFuture>(future: F) -> F {
    future
}

/// Selects how a body type is decoded (autoref specialization: raw types pass
/// through, everything else goes through the codec).
pub struct BodyKind<T>(PhantomData<fn() -> T>);

impl<T> BodyKind<T> {
    /// The selector.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        BodyKind(PhantomData)
    }
}

/// Raw bodies: the payload as it is, whatever its content type.
pub trait RawBody<T> {
    /// Decodes.
    fn decode_body<C: Codec>(&self, payload: &Bytes) -> Result<T, BoxError>;

    /// The content type the body is decoded from: any.
    #[inline]
    fn content_type<C>(&self) -> Option<&'static str> {
        None
    }
}

impl RawBody<Bytes> for &BodyKind<Bytes> {
    fn decode_body<C: Codec>(&self, payload: &Bytes) -> Result<Bytes, BoxError> {
        Ok(payload.clone())
    }
}

impl RawBody<Vec<u8>> for &BodyKind<Vec<u8>> {
    fn decode_body<C: Codec>(&self, payload: &Bytes) -> Result<Vec<u8>, BoxError> {
        Ok(payload.to_vec())
    }
}

impl RawBody<String> for &BodyKind<String> {
    fn decode_body<C: Codec>(&self, payload: &Bytes) -> Result<String, BoxError> {
        Ok(std::str::from_utf8(payload)?.to_owned())
    }
}

/// Codec bodies.
pub trait CodecBody<T> {
    /// Decodes.
    fn decode_body<C: Codec>(&self, payload: &Bytes) -> Result<T, BoxError>
    where
        T: MessageBody<C>;

    /// The content type the body is decoded from: the codec's.
    #[inline]
    fn content_type<C: Codec>(&self) -> Option<&'static str> {
        Some(C::CONTENT_TYPE)
    }
}

impl<T> CodecBody<T> for BodyKind<T> {
    #[inline]
    fn decode_body<C: Codec>(&self, payload: &Bytes) -> Result<T, BoxError>
    where
        T: MessageBody<C>,
    {
        T::decode_with(payload)
    }
}

/// Checks a body type with a readable error.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a message body",
    label = "the body argument must be decodable by the subscriber's codec (`{C}`)",
    note = "a subscriber's first argument is the message body: derive `serde::Deserialize` for it (`prost::Message` with `codec = ruststream::codec::Protobuf`), or take `Bytes`, `String` or `Vec<u8>` for the raw payload; extractors such as `Ctx` or `State<T>` come after the body"
)]
pub trait MessageBody<C>: Send + Sized + 'static {
    /// Decodes a payload with `C`.
    fn decode_with(payload: &Bytes) -> Result<Self, BoxError>;
}

impl<C: Decode<T>, T: Send + 'static> MessageBody<C> for T {
    #[inline]
    fn decode_with(payload: &Bytes) -> Result<T, BoxError> {
        C::decode(payload)
    }
}

/// Checks a reply type with a readable error.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be returned by a subscriber",
    label = "unsupported return type for the subscriber's codec (`{C}`)",
    note = "return `()`, a `serde::Serialize` value (the reply; a `prost::Message` with `codec = ruststream::codec::Protobuf`), `Bytes`/`String`/`Vec<u8>` (a raw reply), or `Result<_, E>` of those where `E: Into<HandlerError>`"
)]
pub trait Reply<C> {
    /// Encodes with `C`.
    fn encode_with(&self) -> Result<Bytes, BoxError>;
}

impl<C: Encode<T>, T> Reply<C> for T {
    #[inline]
    fn encode_with(&self) -> Result<Bytes, BoxError> {
        C::encode(self)
    }
}

/// Splits a handler's return value into success or failure (autoref:
/// `Result<_, E>` first, any other type is success).
pub struct ReturnKind<T>(PhantomData<fn() -> T>);

impl<T> ReturnKind<T> {
    /// The selector for the type of `value`.
    pub fn of(_: &T) -> Self {
        ReturnKind(PhantomData)
    }
}

/// `Result<T, E>` returns.
pub trait SplitResult<T, E> {
    /// Splits.
    fn split(&self, value: Result<T, E>) -> Result<T, HandlerError>;
}

impl<T, E: Into<HandlerError>> SplitResult<T, E> for &ReturnKind<Result<T, E>> {
    fn split(&self, value: Result<T, E>) -> Result<T, HandlerError> {
        value.map_err(Into::into)
    }
}

/// Plain returns.
pub trait SplitPlain<T> {
    /// Splits.
    fn split(&self, value: T) -> Result<T, HandlerError>;
}

impl<T> SplitPlain<T> for ReturnKind<T> {
    fn split(&self, value: T) -> Result<T, HandlerError> {
        Ok(value)
    }
}

/// Selects how a reply value is encoded.
pub struct ReplyKind<T>(PhantomData<fn() -> T>);

impl<T> ReplyKind<T> {
    /// The selector for the type of `value`.
    pub fn of(_: &T) -> Self {
        ReplyKind(PhantomData)
    }

    /// The selector for `T`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        ReplyKind(PhantomData)
    }
}

/// `()`: no reply; raw types: the bytes as they are.
pub trait RawReply<T> {
    /// Encodes.
    fn encode_reply<C: Codec>(&self, value: T) -> Result<Option<Bytes>, BoxError>;

    /// The reply's content type: none.
    fn content_type<C>(&self) -> Option<&'static str> {
        None
    }
}

impl RawReply<()> for &ReplyKind<()> {
    fn encode_reply<C: Codec>(&self, (): ()) -> Result<Option<Bytes>, BoxError> {
        Ok(None)
    }
}

impl RawReply<Bytes> for &ReplyKind<Bytes> {
    fn encode_reply<C: Codec>(&self, value: Bytes) -> Result<Option<Bytes>, BoxError> {
        Ok(Some(value))
    }
}

impl RawReply<Vec<u8>> for &ReplyKind<Vec<u8>> {
    fn encode_reply<C: Codec>(&self, value: Vec<u8>) -> Result<Option<Bytes>, BoxError> {
        Ok(Some(Bytes::from(value)))
    }
}

impl RawReply<String> for &ReplyKind<String> {
    fn encode_reply<C: Codec>(&self, value: String) -> Result<Option<Bytes>, BoxError> {
        Ok(Some(Bytes::from(value)))
    }
}

/// Serializable replies.
pub trait CodecReply<T> {
    /// Encodes.
    fn encode_reply<C: Codec>(&self, value: T) -> Result<Option<Bytes>, BoxError>
    where
        T: Reply<C>;

    /// The reply's content type: the codec's.
    fn content_type<C: Codec>(&self) -> Option<&'static str> {
        Some(C::CONTENT_TYPE)
    }
}

impl<T> CodecReply<T> for ReplyKind<T> {
    fn encode_reply<C: Codec>(&self, value: T) -> Result<Option<Bytes>, BoxError>
    where
        T: Reply<C>,
    {
        value.encode_with().map(Some)
    }
}

/// Turns a handler's return value into an [`Outcome`]; expanded where the
/// return type is concrete, so the autoref selectors above pick the right
/// encoding.
#[doc(hidden)]
#[macro_export]
macro_rules! __outcome {
    // A `Result` return: split through `HandlerResult`, whose message names
    // the fix when the error type is not a handler error.
    (result $codec:ty, $value:expr) => {{
        #[allow(unused_imports)]
        use $crate::__private::{CodecReply as _, RawReply as _};
        match $crate::__private::HandlerResult::split($value) {
            ::core::result::Result::Ok(__reply) => {
                match (&&$crate::__private::ReplyKind::of(&__reply)).encode_reply::<$codec>(__reply)
                {
                    ::core::result::Result::Ok(__bytes) => $crate::__private::Outcome::Ack(__bytes),
                    ::core::result::Result::Err(__err) => $crate::__private::Outcome::Failed(
                        $crate::__private::HandlerError::reject(__err),
                    ),
                }
            }
            ::core::result::Result::Err(__err) => $crate::__private::Outcome::Failed(__err),
        }
    }};
    ($codec:ty, $value:expr) => {{
        #[allow(unused_imports)]
        use $crate::__private::{
            CodecReply as _, RawReply as _, SplitPlain as _, SplitResult as _,
        };
        let __value = $value;
        match (&&$crate::__private::ReturnKind::of(&__value)).split(__value) {
            ::core::result::Result::Ok(__reply) => {
                match (&&$crate::__private::ReplyKind::of(&__reply)).encode_reply::<$codec>(__reply)
                {
                    ::core::result::Result::Ok(__bytes) => $crate::__private::Outcome::Ack(__bytes),
                    ::core::result::Result::Err(__err) => $crate::__private::Outcome::Failed(
                        $crate::__private::HandlerError::reject(__err),
                    ),
                }
            }
            ::core::result::Result::Err(__err) => $crate::__private::Outcome::Failed(__err),
        }
    }};
}

pub use crate::launch::{Launch, RuntimeConfig};

/// What `main` may return under `#[ruststream::app]`.
#[diagnostic::on_unimplemented(
    message = "`#[ruststream::app]` cannot return `{Self}`",
    label = "unsupported return type for `main`",
    note = "return `()`, `Result<(), E>` or `Result<App<B>, E>` with `E: Display`"
)]
pub trait MainOutput {
    /// Whether it is an `App` (the command line is then the app's).
    const RETURNS_APP: bool = false;

    /// Runs what is left to run and reports the exit code.
    fn finish(self, launch: Launch) -> impl Future<Output = std::process::ExitCode>;
}

impl MainOutput for () {
    async fn finish(self, _: Launch) -> std::process::ExitCode {
        std::process::ExitCode::SUCCESS
    }
}

impl<T: MainOutput, E: std::fmt::Display> MainOutput for Result<T, E> {
    const RETURNS_APP: bool = T::RETURNS_APP;

    async fn finish(self, launch: Launch) -> std::process::ExitCode {
        match self {
            Ok(value) => value.finish(launch).await,
            Err(err) => {
                eprintln!("Error: {err}");
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// An `App` returned by a `#[ruststream::app]` main runs until a signal or
/// a shutdown request, with the macro's shutdown timeout unless the app set
/// its own; with the `config` feature its settings apply first, and with
/// `cli` the command line may ask for `check` or `asyncapi` instead.
impl<B: crate::Broker> MainOutput for crate::App<B> {
    const RETURNS_APP: bool = true;

    async fn finish(self, launch: Launch) -> std::process::ExitCode {
        crate::launch::finish_app(self, launch).await
    }
}

/// Reads the command line and the settings (features `cli`, `config`),
/// builds the runtime and runs `main`'s body on it.
pub fn run_main<F, Fut>(config: RuntimeConfig, main: F) -> std::process::ExitCode
where
    F: FnOnce() -> Fut,
    Fut: Future,
    Fut::Output: MainOutput,
{
    let launch = match crate::launch::prepare(config, command_line::<Fut::Output>(), false) {
        Ok(launch) => launch,
        Err(code) => return code,
    };
    block_on(launch, |_| main())
}

/// [`run_main`] for a `main` that takes the [`Settings`](crate::settings::Settings).
#[cfg(feature = "config")]
pub fn run_main_with_settings<F, Fut>(config: RuntimeConfig, main: F) -> std::process::ExitCode
where
    F: FnOnce(crate::settings::Settings) -> Fut,
    Fut: Future,
    Fut::Output: MainOutput,
{
    let launch = match crate::launch::prepare(config, command_line::<Fut::Output>(), true) {
        Ok(launch) => launch,
        Err(code) => return code,
    };
    block_on(launch, |launch| {
        main(
            launch
                .settings
                .clone()
                .expect("loaded for a main that takes them"),
        )
    })
}

/// The command line when `main` returns the app (`None` otherwise): read
/// with the `cli` feature — `--help` and mistakes print and exit here — a
/// plain run without.
fn command_line<O: MainOutput>() -> Option<crate::launch::CommandLine> {
    if !O::RETURNS_APP {
        return None;
    }
    #[cfg(feature = "cli")]
    {
        let args = crate::cli::AppArgs::from_env();
        Some(crate::launch::CommandLine {
            task: args.task(),
            config: args.config,
        })
    }
    #[cfg(not(feature = "cli"))]
    Some(crate::launch::CommandLine {
        task: crate::launch::Task::Run,
        config: None,
    })
}

fn block_on<Fut>(launch: Launch, main: impl FnOnce(&Launch) -> Fut) -> std::process::ExitCode
where
    Fut: Future,
    Fut::Output: MainOutput,
{
    let config = launch.runtime;
    let mut builder = if config.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if let Some(n) = config.worker_threads {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("Error: cannot start the Tokio runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move { main(&launch).await.finish(launch).await })
}

/// A handler's error type, with advice when it is not one.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a handler's error",
    label = "the error type of the handler's `Result`",
    note = "return `Result<_, HandlerError>`, or an error type that implements `std::error::Error` (it converts into a retryable `HandlerError`); wrap others with `HandlerError::reject(..)` or `HandlerError::retry(..)`"
)]
pub trait IntoHandlerError {
    /// The conversion.
    fn into_handler_error(self) -> HandlerError;
}

impl IntoHandlerError for HandlerError {
    fn into_handler_error(self) -> HandlerError {
        self
    }
}

#[diagnostic::do_not_recommend]
impl<E: std::error::Error + Send + Sync + 'static> IntoHandlerError for E {
    fn into_handler_error(self) -> HandlerError {
        HandlerError::retry(self)
    }
}

/// A handler's `Result` return value.
pub trait HandlerResult<T> {
    /// Success, or the error as a [`HandlerError`].
    fn split(self) -> Result<T, HandlerError>;
}

impl<T, E: IntoHandlerError> HandlerResult<T> for Result<T, E> {
    fn split(self) -> Result<T, HandlerError> {
        self.map_err(IntoHandlerError::into_handler_error)
    }
}

/// The [`MessageTypes`](crate::subscriber::MessageTypes) of a `#[subscriber]`, expanded in its companion:
/// with the `asyncapi` feature it picks each type's schema.
#[cfg(feature = "asyncapi")]
#[doc(hidden)]
#[macro_export]
macro_rules! __message_types {
    ($body:ty, $reply:ty) => {{
        #[allow(unused_imports)]
        use $crate::__private::schema_kind::{HasSchema as _, NoSchema as _, RawSchema as _};
        $crate::__private::MessageTypes::of::<$body, $reply>().with_schemas(
            (&&&$crate::__private::schema_kind::SchemaKind::<$body>::new()).schema_fn(),
            (&&&$crate::__private::schema_kind::SchemaKind::<$reply>::new()).schema_fn(),
        )
    }};
}

/// The [`MessageTypes`](crate::subscriber::MessageTypes) of a `#[subscriber]`, expanded in its companion:
/// without the `asyncapi` feature, names only.
#[cfg(not(feature = "asyncapi"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __message_types {
    ($body:ty, $reply:ty) => {
        $crate::__private::MessageTypes::of::<$body, $reply>()
    };
}
