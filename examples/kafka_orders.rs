//! Orders on Kafka: a consumer group with per-customer order (the customer
//! is the record key), a failing order dead-lettered to its own topic, and
//! a graceful shutdown that commits every settled offset.
//!
//! Uses the cluster at `RUSTSTREAM_KAFKA_BOOTSTRAP` (`host:port`); without
//! it, librdkafka's mock cluster runs inside this process, so the example
//! needs no Kafka installation. Run it with
//! `cargo run --example kafka_orders`. It exits 0 once every order is
//! handled.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::kafka::KafkaBroker;
use ruststream::kafka::rdkafka::mocking::MockCluster;
use ruststream::prelude::*;
use ruststream::{SubscribeOptions, header};
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
    customer: String,
    qty: u32,
}

static HANDLED: AtomicU32 = AtomicU32::new(0);
static ALL_HANDLED: Notify = Notify::const_new();
const ORDERS: u32 = 10;

fn customer(order: &Order) -> String {
    order.customer.clone()
}

#[subscriber(
    "example.orders",
    queue_group = "fulfilment",
    dead_letter = "example.orders.dead",
    workers(4, by_key = customer)
)]
async fn fulfil(order: Order) -> Result<(), HandlerError> {
    let outcome = if order.qty == 0 {
        Err(HandlerError::reject("an order needs a quantity"))
    } else {
        println!("fulfilled order {} for {}", order.id, order.customer);
        Ok(())
    };
    if HANDLED.fetch_add(1, Ordering::SeqCst) + 1 == ORDERS {
        ALL_HANDLED.notify_one();
    }
    outcome
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    let mock;
    let bootstrap = match std::env::var("RUSTSTREAM_KAFKA_BOOTSTRAP") {
        Ok(bootstrap) => bootstrap,
        Err(_) => {
            mock = MockCluster::new(1).map_err(|e| ruststream::Error::App(e.into()))?;
            mock.bootstrap_servers()
        }
    };
    let kafka = KafkaBroker::builder()
        .client_id("kafka-orders-example")
        .connect(&bootstrap)
        .await?;
    let mut dead = kafka
        .subscribe(SubscribeOptions::new("example.orders.dead"))
        .await?;
    let running = App::new()
        .broker(kafka.clone())
        .subscriber(fulfil)
        .start()
        .await?;

    let out = Publisher::new(kafka.clone());
    for id in 0..ORDERS as u64 {
        let order = Order {
            id,
            customer: format!("customer-{}", id % 3),
            qty: if id == 7 { 0 } else { 1 },
        };
        // The key picks the partition: one customer's orders stay in order.
        let message = out.encode(&order)?.with_key(order.customer.clone());
        out.send("example.orders", message).await?;
    }
    tokio::time::timeout(Duration::from_secs(60), ALL_HANDLED.notified())
        .await
        .map_err(|_| ruststream::Error::App("not every order was handled in 60 s".into()))?;

    let rejected = tokio::time::timeout(Duration::from_secs(10), dead.next())
        .await
        .map_err(|_| ruststream::Error::App("no dead letter in 10 s".into()))?
        .expect("open");
    println!(
        "dead-lettered: {} ({})",
        String::from_utf8_lossy(rejected.envelope().payload()),
        rejected
            .envelope()
            .headers()
            .get(header::ERROR)
            .unwrap_or("?")
    );
    rejected.ack().await?;
    running.shutdown().await?;
    kafka.close().await?;
    println!("all {ORDERS} orders handled");
    Ok(())
}
