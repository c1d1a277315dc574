//! Every metric the runtime emits, through the [`metrics`] facade. Install any
//! `metrics` recorder (Prometheus, StatsD, …) to export them.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `ruststream_malformed_total` | counter | `app`, `subject` | payloads that failed decode and never reached a handler |
//! | `ruststream_oversized_total` | counter | `app`, `subject` | messages over the subscriber's `max_message_size`, refused before decode |
//! | `ruststream_late_replies_total` | counter | `binding` | replies that arrived after their request ended (first terminal wins): `memory`, `redis` |
//! | `ruststream_connection_events_total` | counter | `binding`, `event` | connection events of a broker client: `disconnected`, `connected`, `slow_consumer`, `pull_failed`, … |
//! | `ruststream_handler_errors_total` | counter | `app`, `subject` | handler errors and panics |
//! | `ruststream_rejected_total` | counter | `app`, `subject` | deliveries rejected (dead-lettered or dropped) |
//! | `ruststream_attempts_exhausted_total` | counter | `app`, `subject` | deliveries past `max_attempts` that no earlier run settled (a crash loop), dead-lettered before the handler |
//! | `ruststream_unreadable_headers_total` | counter | `binding` | received headers (or fields) whose name or value is not valid UTF-8, dropped from the message; the message itself is handled |
//! | `ruststream_deadline_exceeded_total` | counter | `binding` | publishes and requests that failed with `DeadlineExceeded`, and fan-out copies a full subscription missed |
//! | `ruststream_settle_errors_total` | counter | `app`, `subject` | ack/nack/reject calls the broker refused |
//! | `ruststream_retry_lost_total` | counter | `app`, `subject` | `retry_after` republishes the broker refused |
//! | `ruststream_pressure_transitions_total` | counter | `app`, `to` | RUNNING/PAUSED transitions of the job queue |
//! | `ruststream_pressure_paused` | gauge | `app` | 1 while the job queue is PAUSED |
//! | `ruststream_aborted_total` | counter | | handlers aborted by the shutdown timeout (their deliveries stay unsettled) |
//! | `ruststream_jobs_in_use` | gauge | `app` | job permits in use: reserved by a receive loop or travelling with a queued job |
//! | `ruststream_job_waiters` | gauge | `app` | receive loops waiting for a job permit: the shared-cap wait |
//! | `ruststream_pressure_paused_seconds` | gauge | `app` | total time the job queue has spent PAUSED |
//! | `ruststream_structural_rejects_total` | counter | `app`, `subject` | requests an owner FIFO refused at its count or byte limit (`Error::StructuralLimit`) |
//! | `ruststream_handled_total` | counter | `app`, `subscriber`, `subject`, `outcome` | deliveries settled: `acked`, `retried`, `dead_lettered` (rejected), `malformed`, `refused` (a structural limit). `acked` reaches the recorder before each `/metrics` scrape, every second and at shutdown |
//! | `ruststream_handler_duration_seconds` | histogram | `app`, `subscriber`, `subject` | handler run time (with [`record_handler_timings`] or `App::serve_metrics`) |
//! | `ruststream_in_flight` | gauge | `app`, `subscriber`, `subject` | handlers running now (with [`record_handler_timings`] or `App::serve_metrics`) |
//! | `ruststream_publish_duration_seconds` | histogram | `app`, `binding`, `operation`, `outcome` | time a publish (`publish`) or a handler's reply (`reply`) took until the broker took it; `outcome` `ok` or `error` (with [`record_handler_timings`] or `App::serve_metrics`) |
//! | `ruststream_request_duration_seconds` | histogram | `app`, `binding`, `outcome` | time from sending a request to its reply: `ok`, `error` (a failure reply or a failed send) or `timeout` (with [`record_handler_timings`] or `App::serve_metrics`) |
//!
//! The subject-labelled counters of a binding (a Redis or NATS message
//! refused before any subscriber saw it) carry an empty `app`. Publishes and
//! requests are not labelled by subject: a service's subjects are often
//! made from data (`orders.{id}`, reply inboxes), and every label value is a
//! time series.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::Text;

/// Payloads that failed decode.
pub const MALFORMED: &str = "ruststream_malformed_total";
/// Messages over `max_message_size`.
pub const OVERSIZED: &str = "ruststream_oversized_total";
/// Replies that arrived after their request had ended.
pub const LATE_REPLIES: &str = "ruststream_late_replies_total";

pub(crate) fn oversized(app: &str, subject: &Text) {
    metrics::counter!(OVERSIZED, "app" => app.to_owned(), "subject" => subject.to_string())
        .increment(1);
}

pub(crate) fn late_reply(binding: &'static str) {
    metrics::counter!(LATE_REPLIES, "binding" => binding).increment(1);
}

/// Connection events of broker clients.
pub const CONNECTION_EVENTS: &str = "ruststream_connection_events_total";

#[cfg_attr(
    not(any(feature = "nats", feature = "redis", feature = "rabbitmq")),
    allow(dead_code)
)]
pub(crate) fn connection_event(binding: &'static str, event: &'static str) {
    metrics::counter!(CONNECTION_EVENTS, "binding" => binding, "event" => event).increment(1);
}

/// Handler errors and panics.
pub const HANDLER_ERRORS: &str = "ruststream_handler_errors_total";
/// Rejected deliveries.
pub const REJECTED: &str = "ruststream_rejected_total";
/// Deliveries past `max_attempts`, dead-lettered before the handler.
pub const ATTEMPTS_EXHAUSTED: &str = "ruststream_attempts_exhausted_total";
/// Received headers dropped because they are not valid UTF-8.
pub const UNREADABLE_HEADERS: &str = "ruststream_unreadable_headers_total";

pub(crate) fn exhausted(app: &str, subject: &Text) {
    metrics::counter!(ATTEMPTS_EXHAUSTED, "app" => app.to_owned(), "subject" => subject.to_string()).increment(1);
}

/// A received header (name `name`, on `subject`) left out of its message
/// because it is not valid UTF-8: counted every time, logged once per
/// binding — a producer that sends one usually sends many.
#[cfg_attr(not(any(feature = "redis", feature = "rabbitmq")), allow(dead_code))]
pub(crate) fn unreadable_header(binding: &'static str, subject: &str, name: &str) {
    static LOGGED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    metrics::counter!(UNREADABLE_HEADERS, "binding" => binding).increment(1);
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if !logged.contains(&binding) {
        logged.push(binding);
        tracing::warn!(
            binding,
            subject,
            header = name,
            "a received header value is not valid UTF-8 and was left out of the message \
             (logged once; counted in {UNREADABLE_HEADERS})"
        );
    }
}

/// Publishes and requests that ended in `DeadlineExceeded`.
pub const DEADLINE_EXCEEDED: &str = "ruststream_deadline_exceeded_total";
/// Settlement calls that failed.
pub const SETTLE_ERRORS: &str = "ruststream_settle_errors_total";

/// Pressure transitions (label `to` = `paused` | `running`).
pub const PRESSURE_TRANSITIONS: &str = "ruststream_pressure_transitions_total";
/// Current pressure state: 1 paused, 0 running.
pub const PRESSURE_PAUSED: &str = "ruststream_pressure_paused";

pub(crate) fn pressure_transition(app: &str, paused: bool) {
    let to = if paused { "paused" } else { "running" };
    metrics::counter!(PRESSURE_TRANSITIONS, "app" => app.to_owned(), "to" => to).increment(1);
    metrics::gauge!(PRESSURE_PAUSED, "app" => app.to_owned()).set(if paused { 1.0 } else { 0.0 });
}

/// Job permits in use.
pub const JOBS_IN_USE: &str = "ruststream_jobs_in_use";
/// Receive loops waiting for a job permit.
pub const JOB_WAITERS: &str = "ruststream_job_waiters";
/// Total seconds the job queue has been PAUSED.
pub const PRESSURE_PAUSED_SECONDS: &str = "ruststream_pressure_paused_seconds";
/// Requests refused by an owner FIFO's structural limit.
pub const STRUCTURAL_REJECTS: &str = "ruststream_structural_rejects_total";

/// The handle of [`JOBS_IN_USE`], registered once per job queue: a per-permit
/// update through the facade's key lookup cost more than the permit itself.
/// (Install the recorder before starting the app, as with every recorder.)
pub(crate) fn jobs_in_use(app: &str) -> metrics::Gauge {
    metrics::gauge!(JOBS_IN_USE, "app" => app.to_owned())
}

/// The handle of [`JOB_WAITERS`], registered once per job queue.
pub(crate) fn job_waiters(app: &str) -> metrics::Gauge {
    metrics::gauge!(JOB_WAITERS, "app" => app.to_owned())
}

pub(crate) fn paused_seconds(app: &str, total: std::time::Duration) {
    metrics::gauge!(PRESSURE_PAUSED_SECONDS, "app" => app.to_owned()).set(total.as_secs_f64());
}

pub(crate) fn structural_reject(app: &str, subject: &Text) {
    metrics::counter!(STRUCTURAL_REJECTS, "app" => app.to_owned(), "subject" => subject.to_string()).increment(1);
}

/// `retry_after` republishes that failed.
pub const RETRY_LOST: &str = "ruststream_retry_lost_total";
/// Handlers aborted by the shutdown timeout.
pub const ABORTED: &str = "ruststream_aborted_total";

pub(crate) fn retry_lost(app: &str, subject: &Text) {
    metrics::counter!(RETRY_LOST, "app" => app.to_owned(), "subject" => subject.to_string())
        .increment(1);
}

pub(crate) fn aborted(loops: u64) {
    metrics::counter!(ABORTED).increment(loops);
}

pub(crate) fn malformed(app: &str, subject: &Text) {
    metrics::counter!(MALFORMED, "app" => app.to_owned(), "subject" => subject.to_string())
        .increment(1);
}

pub(crate) fn handler_error(app: &str, subject: &Text) {
    metrics::counter!(HANDLER_ERRORS, "app" => app.to_owned(), "subject" => subject.to_string())
        .increment(1);
}

pub(crate) fn rejected(app: &str, subject: &Text) {
    metrics::counter!(REJECTED, "app" => app.to_owned(), "subject" => subject.to_string())
        .increment(1);
}

pub(crate) fn settle_error(app: &str, subject: &Text) {
    metrics::counter!(SETTLE_ERRORS, "app" => app.to_owned(), "subject" => subject.to_string())
        .increment(1);
}

pub(crate) fn deadline_exceeded(binding: &'static str) {
    metrics::counter!(DEADLINE_EXCEEDED, "binding" => binding).increment(1);
}

/// Deliveries settled, by `subscriber`, `subject` and `outcome`: `acked`,
/// `retried`, `dead_lettered`, `malformed`, `refused`.
pub const HANDLED: &str = "ruststream_handled_total";
/// Handler run time in seconds, by `subscriber` and `subject` (with
/// [`record_handler_timings`]).
pub const HANDLER_DURATION: &str = "ruststream_handler_duration_seconds";
/// Handlers running now, by `subscriber` and `subject` (with
/// [`record_handler_timings`]).
pub const IN_FLIGHT: &str = "ruststream_in_flight";

/// Publish and reply latency, by `app`, `binding`, `operation` and `outcome`.
pub const PUBLISH_DURATION: &str = "ruststream_publish_duration_seconds";
/// Request round-trip latency, by `app`, `binding` and `outcome`.
pub const REQUEST_DURATION: &str = "ruststream_request_duration_seconds";

/// One send observed by the app (`outcome`: `ok`, `error`, `timeout`).
pub(crate) fn sent(
    op: crate::spans::Op,
    binding: &'static str,
    app: &str,
    outcome: &'static str,
    took: std::time::Duration,
) {
    let app = app.to_owned();
    let histogram = match op {
        crate::spans::Op::Request => {
            metrics::histogram!(REQUEST_DURATION, "app" => app, "binding" => binding, "outcome" => outcome)
        }
        op => metrics::histogram!(
            PUBLISH_DURATION,
            "app" => app,
            "binding" => binding,
            "operation" => op.as_str(),
            "outcome" => outcome
        ),
    };
    histogram.record(took.as_secs_f64());
}

static TIMINGS: AtomicBool = AtomicBool::new(false);

/// Also records [`HANDLER_DURATION`] and [`IN_FLIGHT`] for subscribers
/// started from now on (not `!Send` handlers on `threads(n)`), and [`PUBLISH_DURATION`] and
/// [`REQUEST_DURATION`] for apps and publishers made from now on: two clock
/// reads and a histogram update per message, so it is off until asked for.
/// `App::serve_metrics` turns it on; call this when you install a recorder
/// of your own.
///
/// ```
/// ruststream::metrics::record_handler_timings();
/// ```
pub fn record_handler_timings() {
    TIMINGS.store(true, Ordering::Relaxed);
}

/// Whether subscribers starting now record timings.
pub(crate) fn timings_on() -> bool {
    TIMINGS.load(Ordering::Relaxed)
}

/// How one subscriber's deliveries ended, off the fast path.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Handled {
    Retried,
    DeadLettered,
    Malformed,
    Refused,
}

impl Handled {
    /// The `outcome` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Handled::Retried => "retried",
            Handled::DeadLettered => "dead_lettered",
            Handled::Malformed => "malformed",
            Handled::Refused => "refused",
        }
    }
}

/// One subscriber's handles, registered when it starts. Acks — the path
/// every delivery takes — are counted in an atomic and handed to the
/// recorder by [`UnitMetrics::sync`] (before each `/metrics` scrape, every
/// second, and at the end of the shutdown); the rarer outcomes go to the
/// recorder at once.
pub(crate) struct UnitMetrics {
    /// The `app` label, for the counters labelled by subject alone.
    app: Box<str>,
    acked_seen: AtomicU64,
    /// Whether one task alone counts this unit's acks (see
    /// [`new`](Self::new)).
    one_counter: bool,
    /// What the recorder has been told: only moves up, so concurrent syncs
    /// count each ack once.
    acked_synced: AtomicU64,
    acked: metrics::Counter,
    others: [metrics::Counter; 4],
    timings: Option<(metrics::Histogram, metrics::Gauge)>,
}

impl UnitMetrics {
    /// With `one_counter`, the caller promises that one task alone, one
    /// delivery after another, counts this unit's acks: the default loop
    /// with no middleware stack (a layer could hand the rest of a delivery
    /// to a task of its own).
    pub(crate) fn new(
        app: &str,
        subscriber: &'static str,
        subject: &Text,
        one_counter: bool,
    ) -> Self {
        let labels = |extra: Option<&'static str>| {
            let mut labels = vec![
                metrics::Label::new("app", app.to_owned()),
                metrics::Label::new("subscriber", subscriber),
                metrics::Label::new("subject", subject.to_string()),
            ];
            if let Some(outcome) = extra {
                labels.push(metrics::Label::new("outcome", outcome));
            }
            labels
        };
        let outcome = |outcome: &'static str| metrics::counter!(HANDLED, labels(Some(outcome)));
        let other = |how: Handled| outcome(how.as_str());
        let timings = timings_on().then(|| {
            (
                metrics::histogram!(HANDLER_DURATION, labels(None)),
                metrics::gauge!(IN_FLIGHT, labels(None)),
            )
        });
        UnitMetrics {
            app: app.into(),
            acked_seen: AtomicU64::new(0),
            one_counter,
            acked_synced: AtomicU64::new(0),
            acked: outcome("acked"),
            others: [
                other(Handled::Retried),
                other(Handled::DeadLettered),
                other(Handled::Malformed),
                other(Handled::Refused),
            ],
            timings,
        }
    }

    /// The app's name.
    pub(crate) fn app(&self) -> &str {
        &self.app
    }

    /// A delivery acked.
    #[inline]
    pub(crate) fn acked(&self) {
        if self.one_counter {
            // No other writer: a load and a store, not a locked add (a
            // full barrier on every delivery). Readers see it as atomic.
            let seen = self.acked_seen.load(Ordering::Relaxed);
            self.acked_seen.store(seen + 1, Ordering::Relaxed);
        } else {
            self.acked_seen.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A delivery that ended otherwise.
    #[cold]
    pub(crate) fn handled(&self, how: Handled) {
        self.others[how as usize].increment(1);
    }

    /// Hands the acks counted since the last sync to the recorder, as an
    /// increment (what every recorder understands).
    fn sync(&self) {
        let seen = self.acked_seen.load(Ordering::Relaxed);
        let mut synced = self.acked_synced.load(Ordering::Relaxed);
        while seen > synced {
            match self.acked_synced.compare_exchange_weak(
                synced,
                seen,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return self.acked.increment(seen - synced),
                Err(now) => synced = now,
            }
        }
    }

    /// A handler starts: the time, when timings are recorded.
    #[inline]
    pub(crate) fn started(&self) -> Option<std::time::Instant> {
        let (_, in_flight) = self.timings.as_ref()?;
        in_flight.increment(1.0);
        Some(std::time::Instant::now())
    }

    /// The handler that [`started`](Self::started) at `at` ended.
    #[inline]
    pub(crate) fn finished(&self, at: Option<std::time::Instant>) {
        if let Some(at) = at {
            self.record(at);
        }
    }

    #[cold]
    fn record(&self, at: std::time::Instant) {
        if let Some((duration, in_flight)) = &self.timings {
            duration.record(at.elapsed().as_secs_f64());
            in_flight.decrement(1.0);
        }
    }
}

/// A subscriber's loop ended: what it counted reaches the recorder.
impl Drop for UnitMetrics {
    fn drop(&mut self) {
        self.sync();
    }
}

/// Every subscriber's [`UnitMetrics`] of one app, to sync, and the app's
/// name (their `app` label).
pub(crate) struct Registry(
    std::sync::Mutex<Vec<std::sync::Weak<UnitMetrics>>>,
    Box<str>,
);

impl Registry {
    pub(crate) fn named(name: &str) -> Self {
        Registry(Default::default(), name.into())
    }

    pub(crate) fn app(&self) -> &str {
        &self.1
    }

    pub(crate) fn add(&self, unit: &std::sync::Arc<UnitMetrics>) {
        let mut units = self.0.lock().unwrap_or_else(|e| e.into_inner());
        units.push(std::sync::Arc::downgrade(unit));
    }

    pub(crate) fn sync(&self) {
        let mut units = self.0.lock().unwrap_or_else(|e| e.into_inner());
        units.retain(|unit| match unit.upgrade() {
            Some(unit) => {
                unit.sync();
                true
            }
            None => false,
        });
    }
}
