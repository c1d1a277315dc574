//! The JetStream orders service tested with `TestApp`: its follow-up
//! publish, its dead letter and its request/reply endpoint, on an
//! in-process broker. Nothing here connects to NATS: the test passes with
//! no server running.

#[path = "../nats_orders.rs"]
#[allow(dead_code)]
mod nats_orders;

use std::time::Duration;

use nats_orders::{Order, service};
use ruststream::MemoryBroker;
use ruststream::testing::TestApp;

#[tokio::test]
async fn the_orders_service_runs_without_a_server() {
    let test = TestApp::start(service(MemoryBroker::new(), MemoryBroker::new()))
        .await
        .unwrap();
    for id in 1..=3 {
        let order = Order {
            id,
            customer: format!("customer-{id}"),
        };
        test.publish("shop.orders.created", &order).await.unwrap();
    }
    let invalid = Order {
        id: 4,
        customer: String::new(),
    };
    test.publish("shop.orders.created", &invalid).await.unwrap();
    let units: u32 = test
        .request("shop.stock", &"blue-widget", Duration::from_secs(5))
        .await
        .unwrap();
    test.settle().await;

    let mut confirmed = test.published_as::<u64>("shop.orders.confirmed");
    confirmed.sort_unstable(); // four workers: per-customer order only
    assert_eq!(confirmed, [1, 2, 3]);
    let dead = test.dead_lettered("shop.orders.created");
    assert_eq!(dead.len(), 1, "{test:?}");
    assert_eq!(
        dead[0].reason,
        "handler failed at attempt 1: an order needs a customer"
    );
    // A raw `String` body: the JSON text, quotes included (13 bytes).
    assert_eq!(units, 130);
    assert_eq!(test.calls("confirm").len(), 4);
    test.shutdown().await.unwrap();
}
