//! Accept layers: checks that run on every delivery before decode, such
//! as filters, authorization or deduplication. The first layer added runs
//! first; the first verdict other than `Accept` settles the delivery and the
//! handler never runs.

use crate::Envelope;

/// What an accept layer decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on to the next layer, then decode and the handler.
    Accept,
    /// Settle with `ack` without running the handler (e.g. a duplicate).
    /// A request's caller gets [`Error::Handler`](crate::Error::Handler)
    /// saying so at once, instead of waiting out its timeout.
    Skip,
    /// Settle with `nack`: redeliver later.
    Retry,
    /// Settle with `reject`: dead-letter with this reason. A request's
    /// caller gets [`Error::Handler`](crate::Error::Handler) with it.
    Reject(String),
}

/// A check on every delivery, before decode.
///
/// ```
/// use ruststream::{AcceptLayer, App, Envelope, MemoryBroker, Verdict};
///
/// struct RequireTenant;
///
/// impl AcceptLayer for RequireTenant {
///     fn accept(&self, env: &Envelope) -> Verdict {
///         match env.headers().get("tenant") {
///             Some(_) => Verdict::Accept,
///             None => Verdict::Reject("missing tenant header".into()),
///         }
///     }
/// }
///
/// let app = App::new().broker(MemoryBroker::new()).layer(RequireTenant);
/// # drop(app);
/// ```
pub trait AcceptLayer: Send + Sync + 'static {
    /// Decides on one delivery. Runs on the delivery's task: keep it short and
    /// non-blocking.
    fn accept(&self, env: &Envelope) -> Verdict;
}

impl<F> AcceptLayer for F
where
    F: Fn(&Envelope) -> Verdict + Send + Sync + 'static,
{
    fn accept(&self, env: &Envelope) -> Verdict {
        self(env)
    }
}
