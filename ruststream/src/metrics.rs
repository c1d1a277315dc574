//! Every metric the runtime emits, through the [`metrics`] facade. Install any
//! `metrics` recorder (Prometheus, StatsD, …) to export them.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `ruststream_malformed_total` | counter | `subject` | payloads that failed decode and never reached a handler (JQ-13) |
//! | `ruststream_handler_errors_total` | counter | `subject` | handler errors and panics |
//! | `ruststream_rejected_total` | counter | `subject` | deliveries rejected (dead-lettered or dropped) |
//! | `ruststream_deadline_exceeded_total` | counter | `binding` | publishes that failed with `DeadlineExceeded` (JQ-19) |
//! | `ruststream_settle_errors_total` | counter | `subject` | ack/nack/reject calls the broker refused |
//! | `ruststream_retry_lost_total` | counter | `subject` | `retry_after` republishes the broker refused |
//! | `ruststream_pressure_transitions_total` | counter | `to` | RUNNING/PAUSED transitions of the job queue (JQ-14) |
//! | `ruststream_pressure_paused` | gauge | | 1 while the job queue is PAUSED |
//! | `ruststream_aborted_total` | counter | | handlers aborted by the shutdown timeout (their deliveries stay unsettled) |

use crate::Text;

/// Payloads that failed decode (JQ-13).
pub const MALFORMED: &str = "ruststream_malformed_total";
/// Handler errors and panics.
pub const HANDLER_ERRORS: &str = "ruststream_handler_errors_total";
/// Rejected deliveries.
pub const REJECTED: &str = "ruststream_rejected_total";
/// Publishes that ended in `DeadlineExceeded`.
pub const DEADLINE_EXCEEDED: &str = "ruststream_deadline_exceeded_total";
/// Settlement calls that failed.
pub const SETTLE_ERRORS: &str = "ruststream_settle_errors_total";

/// Pressure transitions (label `to` = `paused` | `running`), JQ-14.
pub const PRESSURE_TRANSITIONS: &str = "ruststream_pressure_transitions_total";
/// Current pressure state: 1 paused, 0 running.
pub const PRESSURE_PAUSED: &str = "ruststream_pressure_paused";

pub(crate) fn pressure_transition(paused: bool) {
    let to = if paused { "paused" } else { "running" };
    metrics::counter!(PRESSURE_TRANSITIONS, "to" => to).increment(1);
    metrics::gauge!(PRESSURE_PAUSED).set(if paused { 1.0 } else { 0.0 });
}

/// `retry_after` republishes that failed.
pub const RETRY_LOST: &str = "ruststream_retry_lost_total";
/// Handlers aborted by the shutdown timeout.
pub const ABORTED: &str = "ruststream_aborted_total";

pub(crate) fn retry_lost(subject: &Text) {
    metrics::counter!(RETRY_LOST, "subject" => subject.to_string()).increment(1);
}

pub(crate) fn aborted(loops: u64) {
    metrics::counter!(ABORTED).increment(loops);
}

pub(crate) fn malformed(subject: &Text) {
    metrics::counter!(MALFORMED, "subject" => subject.to_string()).increment(1);
}

pub(crate) fn handler_error(subject: &Text) {
    metrics::counter!(HANDLER_ERRORS, "subject" => subject.to_string()).increment(1);
}

pub(crate) fn rejected(subject: &Text) {
    metrics::counter!(REJECTED, "subject" => subject.to_string()).increment(1);
}

pub(crate) fn settle_error(subject: &Text) {
    metrics::counter!(SETTLE_ERRORS, "subject" => subject.to_string()).increment(1);
}

pub(crate) fn deadline_exceeded(binding: &'static str) {
    metrics::counter!(DEADLINE_EXCEEDED, "binding" => binding).increment(1);
}
