//! The application job queue: one pool of job permits per
//! running app, shared by every subscription, and the pressure state derived
//! from it.
//!
//! * [`JobQueueSettings`]: profile, exact `max_queued_jobs`, pause/resume
//!   percents.
//! * [`JobQueue`]: FIFO permits — oldest waiting source first, one waiter per
//!   source — whose count in use drives RUNNING/PAUSED with
//!   hysteresis, applied to registered receive-flow switches outside
//!   every lock, never re-applied, never overwritten by a stale
//!   transition.
//!
//! The Core's byte HWM is a separate authority: nothing here reads or
//! sizes it.
//!
//! Every subscriber loop takes a permit before it takes a record from its
//! binding; the permit travels with the record (the worker that took it,
//! owner FIFO, thread ring) and returns right before the handler body starts, or after
//! a malformed or rejected record's bounded processing.
//!
//! Request/reply sources (queue-group subscribers unless configured
//! otherwise) register their binding's [`ReceiveFlow`] switch when they
//! start; PAUSED/RUNNING is applied to them only. Fair multi-source
//! receive lives where several connections meet: in the binding's
//! receive queue (the memory Core reads its per-peer lanes in rounds).

mod permit;
mod permits;
mod pressure;
mod settings;

pub use permit::JobPermit;
pub(crate) use permit::{BorrowedPermit, Permits};
pub use permits::{JobQueue, ReceiveFlow, SourceRegistration};
pub use pressure::{Pressure, PressureState, Thresholds};
pub use settings::{JobQueueProfile, JobQueueSettings};
