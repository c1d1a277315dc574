//! Observability: logs through `tracing`, and `/metrics`, `/health` and
//! `/ready` served by the app (feature `prometheus`).
//!
//! Run it with `cargo run --example observability`. It serves on
//! `RUSTSTREAM_METRICS_ADDR` (default `127.0.0.1:9464`), handles a few
//! orders (one of them malformed), reads its own `/ready` and `/metrics`
//! over HTTP, prints the `ruststream_` lines, and exits 0. While it runs,
//! `curl http://127.0.0.1:9464/metrics` shows the same.

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
async fn confirm(order: Order) {
    tracing::info!(order = order.id, "confirmed");
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
    // Logs: nothing is printed until a subscriber is installed.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
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
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("ruststream_handled_total"))
    {
        println!("{line}");
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("outcome=\"acked\"") && l.ends_with(" 5")),
        "five orders acked:\n{metrics}"
    );
    running.shutdown().await
}
