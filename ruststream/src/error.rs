//! The error model: one public [`Error`] for every fallible runtime call, and
//! [`HandlerError`] for what a handler returns.

use std::fmt;
use std::time::Duration;

/// Boxed error source carried by [`Error`] and [`HandlerError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a runtime call can fail with. Variants separate *why* it failed so
/// callers can react: retry after a deadline, fix a structural limit, report a
/// protocol error to a peer, or stop because the app is closing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation did not complete before its deadline: a publish
    /// waited for queue space that did not free up in time, or every waiter slot
    /// was taken; or a request found the service's queue full or paused (a
    /// request does not wait for space).
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(&'static str),
    /// A request got no reply within its timeout.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// A request was published to a subject nobody subscribes to.
    #[error("no subscriber for request subject `{0}`")]
    NoResponders(String),
    /// A fixed structural limit refused the operation (a message larger than a
    /// queue can ever hold, an owner FIFO at its count or byte limit).
    #[error("structural limit: {0}")]
    StructuralLimit(String),
    /// The peer could not decode what was sent: a request answered with
    /// `ProtocolError`, or a malformed payload.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The remote handler failed and the request was given up.
    #[error("handler error: {0}")]
    Handler(String),
    /// The broker or app is closed or shutting down.
    #[error("closed: {0}")]
    Closed(&'static str),
    /// Invalid configuration, reported at startup.
    #[error("configuration: {0}")]
    Config(String),
    /// Encoding a value failed.
    #[error("encode: {0}")]
    Encode(#[source] BoxError),
    /// Decoding a payload failed.
    #[error("decode: {0}")]
    Decode(#[source] BoxError),
    /// The transport failed (connection lost, broker refused).
    #[error("transport: {0}")]
    Transport(#[source] BoxError),
    /// A lifecycle hook or the app's own setup failed.
    #[error("{0}")]
    App(#[source] BoxError),
}

impl Error {
    /// True for [`Error::DeadlineExceeded`].
    pub fn is_deadline(&self) -> bool {
        matches!(self, Error::DeadlineExceeded(_))
    }
}

/// What a handler returns on failure. It decides the settlement:
///
/// * [`HandlerError::retry`] (also what `?` on any `std::error::Error` gives):
///   nack, so the message is redelivered with attempt + 1, until the
///   subscriber's `max_attempts`; then it is rejected (dead-lettered).
/// * [`HandlerError::reject`]: never redeliver; dead-letter at once.
///
/// ```
/// use ruststream::HandlerError;
///
/// fn parse(s: &str) -> Result<u32, HandlerError> {
///     let n: u32 = s.parse()?; // a ParseIntError: retried
///     if n == 0 {
///         return Err(HandlerError::reject("zero is never valid"));
///     }
///     Ok(n)
/// }
/// assert!(parse("x").unwrap_err().is_retry());
/// assert!(!parse("0").unwrap_err().is_retry());
/// ```
pub struct HandlerError {
    source: BoxError,
    retry: bool,
    /// Raised by an extractor: the handler never ran.
    before_handler: bool,
}

impl HandlerError {
    /// A failure worth another attempt (the message is nacked).
    pub fn retry(err: impl Into<BoxError>) -> Self {
        HandlerError {
            source: err.into(),
            retry: true,
            before_handler: false,
        }
    }

    /// A failure no retry can fix (the message is rejected / dead-lettered).
    pub fn reject(err: impl Into<BoxError>) -> Self {
        HandlerError {
            source: err.into(),
            retry: false,
            before_handler: false,
        }
    }

    /// Whether the message should be redelivered.
    pub fn is_retry(&self) -> bool {
        self.retry
    }

    /// The underlying error.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// Marks an extractor's error: the handler never ran.
    pub(crate) fn before_handler(mut self) -> Self {
        self.before_handler = true;
        self
    }

    pub(crate) fn is_before_handler(&self) -> bool {
        self.before_handler
    }

    pub(crate) fn panic(message: String) -> Self {
        HandlerError::retry(format!("handler panicked: {message}"))
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(err: E) -> Self {
        HandlerError::retry(err)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("retry", &self.retry)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}
