//! Execution modes: how a subscriber's deliveries are scheduled.

pub(crate) mod sequential;
pub(crate) mod stop;
