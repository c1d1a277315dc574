//! Orders on Redis Streams: a consumer group with per-key order, a failing
//! order dead-lettered to its own stream, and a graceful shutdown that sends
//! every buffered ack.
//!
//! Needs redis-server on `RUSTSTREAM_REDIS_URL` (default
//! `redis://127.0.0.1:6379`); `scripts/test.sh` starts one when it is down.
//! Run it with `cargo run --example redis_orders`. It exits 0 once every
//! order is handled.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::redis::RedisBroker;
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
    let url =
        std::env::var("RUSTSTREAM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redis = RedisBroker::connect(&url).await?;
    let mut dead = redis
        .subscribe(SubscribeOptions::new("example.orders.dead").queue_group("audit"))
        .await?;
    let running = App::new()
        .broker(redis.clone())
        .subscriber(fulfil)
        .start()
        .await?;

    let out = Publisher::new(redis.clone());
    for id in 0..ORDERS as u64 {
        let order = Order {
            id,
            customer: format!("customer-{}", id % 3),
            qty: if id == 7 { 0 } else { 1 },
        };
        out.publish("example.orders", &order).await?;
    }
    tokio::time::timeout(Duration::from_secs(30), ALL_HANDLED.notified())
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
    redis.close().await?;
    println!("all {ORDERS} orders handled");
    Ok(())
}
