//! Orders on RabbitMQ: a durable work queue with per-customer order, an
//! audit fan-out, a rejected order dead-lettered, coalesced acks, and a
//! graceful shutdown.
//!
//! Needs RabbitMQ on `RUSTSTREAM_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`); `scripts/test.sh` starts it when
//! it is down. Run it with `cargo run --example rabbitmq_orders`. It exits 0
//! once every order is handled.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::rabbitmq::RabbitBroker;
use ruststream::{SubscribeOptions, header};
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
    customer: String,
    qty: u32,
}

static HANDLED: AtomicU32 = AtomicU32::new(0);
static AUDITED: AtomicU32 = AtomicU32::new(0);
static ALL_DONE: Notify = Notify::const_new();
const ORDERS: u32 = 10;

fn customer(order: &Order) -> String {
    order.customer.clone()
}

fn done() {
    // The audit also sees the dead letter: at least every order.
    if HANDLED.load(Ordering::SeqCst) == ORDERS && AUDITED.load(Ordering::SeqCst) >= ORDERS {
        ALL_DONE.notify_one();
    }
}

/// The work queue: one group shares the orders; a customer's orders run in
/// order.
#[subscriber(
    "example.orders.created",
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
    HANDLED.fetch_add(1, Ordering::SeqCst);
    done();
    outcome
}

/// Fan-out: every audit subscriber sees every order.
#[subscriber("example.orders.*")]
async fn audit(_order: Bytes) {
    AUDITED.fetch_add(1, Ordering::SeqCst);
    done();
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    let url = std::env::var("RUSTSTREAM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let rabbit = RabbitBroker::builder()
        .queue_expires(Duration::from_secs(300))
        .connect(&url)
        .await?;
    let mut dead = rabbit
        .subscribe(SubscribeOptions::new("example.orders.dead"))
        .await?;
    let running = App::new()
        .broker(rabbit.clone())
        .subscriber(fulfil)
        .subscriber(audit)
        .start()
        .await?;

    let out = Publisher::new(rabbit.clone());
    for id in 0..ORDERS as u64 {
        let order = Order {
            id,
            customer: format!("customer-{}", id % 3),
            qty: if id == 4 { 0 } else { 1 },
        };
        out.publish("example.orders.created", &order).await?; // confirmed when this returns
    }
    tokio::time::timeout(Duration::from_secs(30), ALL_DONE.notified())
        .await
        .map_err(|_| ruststream::Error::App("not every order was handled in 30 s".into()))?;
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
    rabbit.close().await?;
    println!("all {ORDERS} orders handled and audited");
    Ok(())
}
