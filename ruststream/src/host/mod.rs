//! The host context: what every layer above the bindings needs of the
//! running app, and nothing of how it is built or run. [`AppHandle`]
//! carries the runtime, the shared state, the follow-up task tracker, the
//! job queue, the registered brokers and the app-wide signals; [`Stop`] is
//! the signal the receive loops look at on every delivery.
//!
//! It sits below the loops (`exec`), the delivery pipeline and the app
//! builder, and above the bindings and the job queue, so each of those
//! reads it without reaching up into `app`.

mod abort;
mod handle;
mod stop;

pub(crate) use abort::Abort;
pub use handle::AppHandle;
pub(crate) use handle::{AfterAck, StateMap};
pub(crate) use stop::Stop;
