//! The `tracing` spans of the runtime: one `process` span per delivery, one
//! `publish`, `request` or `reply` span per message sent. Their fields follow
//! OpenTelemetry's messaging semantic conventions, so an OpenTelemetry layer
//! (`tracing-opentelemetry`) exports them as they are.
//!
//! Whether spans are made is decided when a subscriber or a publisher is
//! made — is a tracing subscriber interested in `ruststream` spans at
//! `INFO`? — so a service without one pays nothing per message.

use tracing::Span;
use tracing::field::Empty;

use crate::{Envelope, Message};

/// The target of every runtime span.
pub(crate) const TARGET: &str = "ruststream";

/// Whether the installed tracing subscriber wants the runtime's spans.
pub(crate) fn enabled() -> bool {
    tracing::enabled!(kind: tracing::metadata::Kind::SPAN, target: TARGET, tracing::Level::INFO)
}

/// The span of one delivery, from the handler to its settlement (or of the
/// settlement alone, for a delivery refused before the handler). With the
/// `opentelemetry` feature its parent is the trace context the message
/// carries.
pub(crate) fn process(system: &'static str, subscriber: &'static str, env: &Envelope) -> Span {
    let subject = env.subject().as_str();
    let span = tracing::info_span!(
        target: TARGET,
        "process",
        otel.name = %format_args!("process {subject}"),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.operation = "process",
        messaging.operation.type = "process",
        messaging.destination.name = subject,
        messaging.message.conversation_id = env.correlation_id().map(|id| id.as_str()),
        messaging.message.body.size = env.payload().len(),
        ruststream.subscriber = subscriber,
        ruststream.attempt = env.total_attempt(),
        ruststream.outcome = Empty,
    );
    #[cfg(feature = "opentelemetry")]
    crate::trace_context::extract(&span, env.headers());
    span
}

/// The span of one batch of a batch handler (`batch(..)`), from the
/// handler to the settlement of its last record.
pub(crate) fn process_batch(
    system: &'static str,
    subscriber: &'static str,
    subject: &str,
    count: usize,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        "process",
        otel.name = %format_args!("process {subject}"),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.operation = "process",
        messaging.operation.type = "process",
        messaging.destination.name = subject,
        messaging.batch.message_count = count,
        ruststream.subscriber = subscriber,
        ruststream.outcome = Empty,
    )
}

/// What a sent message is, for its span and its latency metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A one-way publish.
    Publish,
    /// A request, waiting for its reply.
    Request,
    /// A handler's reply to a request.
    Reply,
}

impl Op {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Publish => "publish",
            Op::Request => "request",
            Op::Reply => "reply",
        }
    }
}

/// The span of one message sent, a child of the current span (the delivery
/// being handled, or the caller's own); with the `opentelemetry` feature the
/// message carries its trace context.
pub(crate) fn send(op: Op, system: &'static str, subject: &str, message: &mut Message) -> Span {
    let name = op.as_str();
    let span = tracing::info_span!(
        target: TARGET,
        "send",
        otel.name = %format_args!("{name} {subject}"),
        otel.kind = "producer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.operation = name,
        messaging.operation.type = "send",
        messaging.destination.name = subject,
        messaging.message.conversation_id = message.correlation_id().map(|id| id.as_str()),
        messaging.message.body.size = message.payload().len(),
        ruststream.outcome = Empty,
    );
    #[cfg(feature = "opentelemetry")]
    crate::trace_context::inject(&span, message.headers_mut());
    span
}

/// Records how the current span's delivery or send ended: `acked`,
/// `retried`, `dead_lettered`, … (and an error status for every outcome
/// but success).
pub(crate) fn outcome(span: &Span, outcome: &'static str) {
    span.record("ruststream.outcome", outcome);
    if !matches!(outcome, "acked" | "ok") {
        span.record("otel.status_code", "error");
    }
}
