//! Orders on NATS JetStream: a durable stream, a queue-group subscriber with
//! per-key order that publishes a follow-up and dead-letters invalid
//! orders, a request/reply service on core NATS, and a graceful shutdown.
//! `tests/nats_orders.rs` tests the same service with `TestApp`, no server.
//!
//! Needs a nats-server with JetStream on `RUSTSTREAM_NATS_URL` (default
//! `nats://127.0.0.1:4222`); `scripts/test.sh` starts one when it is down.
//! Run it with `cargo run --example nats_orders`. It exits 0 once every order
//! is confirmed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::nats::{NatsBroker, StreamSpec};
use ruststream::prelude::*;
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
pub struct Order {
    pub id: u64,
    pub customer: String,
}

static CONFIRMED: AtomicU32 = AtomicU32::new(0);
static ALL_CONFIRMED: Notify = Notify::const_new();
const ORDERS: u32 = 12;

fn customer(order: &Order) -> String {
    order.customer.clone()
}

/// A customer's orders in order; up to four customers at once. Acked on
/// JetStream only when the handler succeeds.
#[subscriber(
    "shop.orders.created",
    queue_group = "billing",
    workers(4, by_key = customer),
    dead_letter = "shop.orders.dead"
)]
async fn confirm(order: Order, ctx: Ctx) -> Result<(), HandlerError> {
    if order.customer.is_empty() {
        return Err(HandlerError::reject("an order needs a customer"));
    }
    // The follow-up goes through the broker that delivered the order.
    ctx.publish("shop.orders.confirmed", &order.id).await?;
    println!(
        "confirmed order {} for {} (delivery {})",
        order.id,
        order.customer,
        ctx.attempt()
    );
    if CONFIRMED.fetch_add(1, Ordering::SeqCst) + 1 == ORDERS {
        ALL_CONFIRMED.notify_one();
    }
    Ok(())
}

/// Request/reply over core NATS inboxes.
#[subscriber("shop.stock", queue_group = "stock")]
async fn stock(sku: String) -> u32 {
    sku.len() as u32 * 10
}

/// The service: orders on `orders` (JetStream in `main`), stock requests
/// on `nats` (core NATS in `main`).
pub fn service<J: Broker, N: Broker>(orders: J, nats: N) -> App<N> {
    App::new()
        .broker(orders)
        .subscriber(confirm)
        .broker(nats)
        .subscriber(stock)
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    let url =
        std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let nats = NatsBroker::connect(&url).await?;
    let stream = format!("SHOP_EXAMPLE_{}", std::process::id());
    let orders = nats
        .jetstream(StreamSpec::new(&stream, ["shop.orders.>"]).memory_storage())
        .await?;

    let running = service(orders.clone(), nats.clone()).start().await?;

    let out = running
        .publisher::<ruststream::nats::JetStream>()
        .expect("registered");
    for id in 0..ORDERS as u64 {
        let order = Order {
            id,
            customer: format!("customer-{}", id % 3),
        };
        out.publish("shop.orders.created", &order).await?; // stored when this returns
    }
    let client = running.publisher::<NatsBroker>().expect("registered");
    let units: u32 = client
        .request("shop.stock", &"blue-widget", Duration::from_secs(5))
        .await?;
    println!("stock of blue-widget: {units}");

    tokio::time::timeout(Duration::from_secs(30), ALL_CONFIRMED.notified())
        .await
        .map_err(|_| ruststream::Error::App("not every order was confirmed in 30 s".into()))?;
    running.shutdown().await?;
    orders.delete_stream().await?;
    println!("all {ORDERS} orders confirmed");
    Ok(())
}
