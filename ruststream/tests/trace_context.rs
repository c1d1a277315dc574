//! W3C trace context across services (issue 22, feature `opentelemetry`):
//! a caller's request, the handler that answers it in one app, the message
//! that handler publishes and the second app that consumes it are one
//! OpenTelemetry trace, each span the child of the one that caused it —
//! across a real broker, NATS and Redis Streams. Spans go through
//! `tracing-opentelemetry` to the SDK's in-memory exporter.
//!
//! Needs the brokers on loopback (`scripts/test.sh` starts them; see
//! `../shared/services.md`).

#![cfg(all(feature = "opentelemetry", feature = "nats", feature = "redis"))]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::{unique, until};
use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use ruststream::nats::NatsBroker;
use ruststream::prelude::*;
use ruststream::redis::RedisBroker;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

const WAIT: Duration = Duration::from_secs(10);

/// The exporter every span of this test binary ends in (installed once:
/// apps run on several threads).
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("tests"));
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("no other tracing subscriber in this test binary");
            (exporter, provider)
        })
        .0
}

/// The finished span called `name`, waiting for it.
async fn span(name: &str) -> SpanData {
    let find = || {
        exporter()
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .find(|s| s.name == name)
    };
    until(10, &format!("the span `{name}`"), || find().is_some()).await;
    find().unwrap()
}

fn attribute(span: &SpanData, key: &str) -> String {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
        .unwrap_or_else(|| panic!("span `{}` has no attribute `{key}`", span.name))
}

/// Answers a quote and tells the audit service about it.
#[subscriber("trace.quote")]
async fn quote(quantity: u64, ctx: Ctx) -> Result<u64, HandlerError> {
    ctx.publish(&audit_subject(ctx.subject()), &quantity)
        .await?;
    Ok(quantity * 3)
}

/// The other service: records what was quoted.
#[subscriber("trace.audit")]
async fn audit(_quantity: u64) {}

fn audit_subject(quote_subject: &str) -> String {
    format!("{quote_subject}.audit")
}

/// Caller → `quote` in app "shop" → publish → `audit` in app "audit", all
/// on `broker`, checked span by span.
async fn one_trace<B: Broker + Requester>(broker: B) {
    let exporter = exporter();
    let quote_subject = unique("trace.quote");
    let audit_subject = audit_subject(&quote_subject);
    let (q, a) = (quote_subject.clone(), audit_subject.clone());
    let shop = App::new()
        .name("shop")
        .broker(broker.clone())
        .subscriber(quote.configure(move |c| c.on_subject(q)))
        .start()
        .await
        .unwrap();
    let auditor = App::new()
        .name("audit")
        .broker(broker.clone())
        .subscriber(audit.configure(move |c| c.on_subject(a)))
        .start()
        .await
        .unwrap();

    let client = Publisher::new(broker);
    // Named after this test's subject: both tests share the exporter.
    let checkout =
        tracing::info_span!("checkout", otel.name = %format!("checkout {quote_subject}"));
    let reply = async {
        let message = client.encode(&2u64).unwrap();
        client.request_message(&quote_subject, message, WAIT).await
    }
    .instrument(checkout)
    .await
    .unwrap();
    assert_eq!(reply.payload().as_ref(), b"6");

    let checkout = span(&format!("checkout {quote_subject}")).await;
    let request = span(&format!("request {quote_subject}")).await;
    let process = span(&format!("process {quote_subject}")).await;
    let publish = span(&format!("publish {audit_subject}")).await;
    let consumed = span(&format!("process {audit_subject}")).await;
    let trace: TraceId = checkout.span_context.trace_id();
    for span in [&request, &process, &publish, &consumed] {
        assert_eq!(
            span.span_context.trace_id(),
            trace,
            "`{}` is in the caller's trace",
            span.name
        );
    }
    let id = |s: &SpanData| s.span_context.span_id();
    assert_eq!(request.parent_span_id, id(&checkout));
    assert_eq!(
        process.parent_span_id,
        id(&request),
        "the handler's span continues the request's, across the broker"
    );
    assert!(process.parent_span_is_remote);
    assert_eq!(publish.parent_span_id, id(&process));
    assert_eq!(
        consumed.parent_span_id,
        id(&publish),
        "the second app's span continues the publish, across the broker"
    );
    let replies: Vec<SpanData> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name.starts_with("reply ") && s.parent_span_id == id(&process))
        .collect();
    assert_eq!(
        replies.len(),
        1,
        "the reply is a child of the handler's span"
    );
    // The reply carries the context of its own span.
    let traceparent = reply
        .headers()
        .get("traceparent")
        .expect("the reply has a traceparent");
    assert_eq!(
        traceparent,
        format!("00-{trace}-{}-01", id(&replies[0])),
        "W3C traceparent of the reply's span"
    );

    assert_eq!(request.span_kind, SpanKind::Producer);
    assert_eq!(process.span_kind, SpanKind::Consumer);
    assert_eq!(attribute(&process, "messaging.operation.type"), "process");
    assert_eq!(
        attribute(&process, "messaging.destination.name"),
        quote_subject
    );
    assert_eq!(attribute(&process, "ruststream.outcome"), "acked");
    assert_eq!(attribute(&publish, "messaging.operation.type"), "send");
    assert_ne!(id(&process), SpanId::INVALID);

    shop.shutdown().await.unwrap();
    auditor.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_consume_and_reply_are_one_trace_across_nats() {
    let url =
        std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let nats = NatsBroker::connect(&url).await.unwrap_or_else(|err| {
        panic!("NATS is not reachable at {url}: {err}; run scripts/test.sh, which starts it")
    });
    one_trace(nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_consume_and_reply_are_one_trace_across_redis_streams() {
    let url = std::env::var("RUSTSTREAM_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let redis = RedisBroker::connect(&url).await.unwrap_or_else(|err| {
        panic!("Redis is not reachable at {url}: {err}; run scripts/test.sh, which starts it")
    });
    one_trace(redis).await;
}
