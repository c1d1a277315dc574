//! The quickstart service tested the way a user would: `TestApp` runs its
//! real app — subscriber, dead letter, request/reply — on an in-process
//! broker; no server, no sleeps.

#[path = "../quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use std::time::Duration;

use quickstart::{Confirmed, Order, service};
use ruststream::MemoryBroker;
use ruststream::testing::TestApp;

fn order(id: u64, qty: u32) -> Order {
    Order {
        id,
        sku: "blue-widget".into(),
        qty,
    }
}

#[tokio::test]
async fn orders_are_confirmed_and_one_without_quantity_is_dead_lettered() {
    let test = TestApp::start(service(MemoryBroker::new())).await.unwrap();
    test.publish("orders.created", &order(1, 2)).await.unwrap();
    test.publish("orders.created", &order(2, 0)).await.unwrap();
    test.settle().await;

    let calls = test.calls("confirm");
    assert_eq!(calls.len(), 2);
    assert!(calls[0].outcome.is_ok());
    let dead = test.dead_lettered("orders.created");
    assert_eq!(dead.len(), 1, "{test:?}");
    assert_eq!(
        dead[0].reason,
        "handler failed at attempt 1: an order needs a quantity"
    );
    test.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_gets_the_confirmation_back() {
    let test = TestApp::start(service(MemoryBroker::new())).await.unwrap();
    let reply: Confirmed = test
        .request("orders.created", &order(99, 3), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((reply.id, reply.total_qty), (99, 3));
    // The reply is something the app sent.
    test.settle().await;
    let err = test
        .request::<_, Confirmed>("orders.created", &order(100, 0), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ruststream::Error::Handler(_)), "{err:?}");
    test.shutdown().await.unwrap();
}
