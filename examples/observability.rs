//! Observability, all of it on: logs and spans through `tracing`, the spans
//! exported to OpenTelemetry with trace context carried by the messages
//! (feature `opentelemetry`), and `/metrics`, `/health` and `/ready` served
//! by the app (feature `prometheus`).
//!
//! Run it with `cargo run --example observability`. It serves on
//! `RUSTSTREAM_METRICS_ADDR` (default `127.0.0.1:9464`), handles a few
//! orders (one of them malformed; each confirmed order is published on to a
//! second subscriber, in the same trace), reads its own `/ready` and
//! `/metrics` over HTTP, prints the `ruststream_` lines and the finished
//! spans with their trace ids, and exits 0. While it runs,
//! `curl http://127.0.0.1:9464/metrics` shows the same.
//!
//! The spans go to a printing exporter here; in production use the OTLP
//! one (`opentelemetry-otlp`) in its place, as the guide shows.

use std::net::SocketAddr;
use std::time::Duration;

use ruststream::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
}

#[subscriber("orders.created", dead_letter = "orders.dead")]
async fn confirm(order: Order, ctx: Ctx) -> Result<(), HandlerError> {
    // Inside the delivery's span: this line carries its fields.
    tracing::info!(order = order.id, "confirmed");
    // Carries the trace context: `ship` continues this trace.
    ctx.publish("orders.confirmed", &order).await?;
    Ok(())
}

#[subscriber("orders.confirmed")]
async fn ship(order: Order) {
    tracing::info!(order = order.id, "shipping");
}

/// Prints each finished span: trace, span and parent ids, name, outcome.
#[derive(Debug)]
struct PrintSpans;

impl opentelemetry_sdk::trace::SpanExporter for PrintSpans {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        for span in batch {
            let outcome = span
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "ruststream.outcome")
                .map(|kv| kv.value.to_string())
                .unwrap_or_default();
            println!(
                "span trace={} id={} parent={} {} {outcome}",
                span.span_context.trace_id(),
                span.span_context.span_id(),
                span.parent_span_id,
                span.name,
            );
        }
        Ok(())
    }
}

/// One GET, the way a scraper or a probe does it.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    // Logs and spans: nothing is recorded until a subscriber is installed,
    // and it must be installed before the app starts. The fmt layer prints
    // log lines (with the fields of the spans around them); the
    // OpenTelemetry layer exports the spans.
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(PrintSpans)
        .build();
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        ))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("orders-service")))
        .init();

    let addr: SocketAddr = std::env::var("RUSTSTREAM_METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9464".into())
        .parse()
        .map_err(|err| ruststream::Error::Config(format!("RUSTSTREAM_METRICS_ADDR: {err}")))?;
    let broker = MemoryBroker::new();
    let running = App::new()
        .name("orders-service")
        .broker(broker.clone())
        .subscriber(confirm)
        .subscriber(ship)
        .serve_metrics(addr)
        .start()
        .await?;
    let served = running.metrics_addr().expect("serving");
    println!("serving http://{served}/metrics, /health and /ready");

    let client = Publisher::new(broker.clone());
    for id in 1..=5 {
        client.publish("orders.created", &Order { id }).await?;
    }
    broker
        .publish_message("orders.created", Message::new("not an order"), None)
        .await?;

    let ready = get(served, "/ready")
        .await
        .map_err(|e| ruststream::Error::App(e.into()))?;
    println!("/ready: {}", ready.lines().next().unwrap_or_default());

    // Wait until the scrape shows all six deliveries settled.
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = get(served, "/metrics")
            .await
            .map_err(|e| ruststream::Error::App(e.into()))?;
        let settled =
            metrics.contains("outcome=\"acked\"") && metrics.contains("outcome=\"malformed\"");
        if settled
            && metrics
                .lines()
                .any(|l| l.contains("outcome=\"acked\"") && l.ends_with(" 5"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for line in metrics.lines().filter(|l| {
        l.starts_with("ruststream_handled_total")
            || l.starts_with("ruststream_publish_duration_seconds_count")
    }) {
        println!("{line}");
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("outcome=\"acked\"") && l.ends_with(" 5")),
        "five orders acked:\n{metrics}"
    );
    running.shutdown().await?;
    // Export what is still buffered (a batch exporter holds spans).
    provider
        .shutdown()
        .map_err(|err| ruststream::Error::App(err.into()))
}
