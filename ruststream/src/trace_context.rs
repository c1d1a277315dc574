//! W3C trace context (`traceparent`, `tracestate`) on messages, through
//! `tracing-opentelemetry`: injected into every message the app sends from
//! its send span, extracted from every delivery as the parent of its process
//! span. Publish → consume → reply across services is then one trace.
//!
//! Always the W3C format, whatever global propagator the service installed:
//! both ends of a message must agree, and W3C is what every OpenTelemetry
//! SDK reads.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::message::Headers;

/// Writes `span`'s trace context into `headers` (replacing a context the
/// message already carried, e.g. a delivery forwarded as it is).
pub(crate) fn inject(span: &Span, headers: &mut Headers) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut Writer(headers));
}

/// Makes the trace context `headers` carry the parent of `span`, which must
/// not have been entered yet. No context, no parent: the span starts a trace.
pub(crate) fn extract(span: &Span, headers: &Headers) {
    if headers.get("traceparent").is_none() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Reader(headers));
    // Fails only without an OpenTelemetry layer, where there is no trace.
    let _ = span.set_parent(parent);
}

struct Writer<'a>(&'a mut Headers);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct Reader<'a>(&'a Headers);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name).collect()
    }
}
