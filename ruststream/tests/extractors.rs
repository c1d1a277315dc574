//! The handler surface: the body is the first argument, every other one is
//! an extractor chosen by its trait, not its name; extractors of one's own;
//! `ctx.publish` / `ctx.request` through the broker that delivered.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::within;
use ruststream::extract::{
    Attempt, CorrelationId, FromDelivery, Header, Key, Payload, ReplyTo, Subject,
};
use ruststream::prelude::*;
use ruststream::subscriber::Scope;
use ruststream::{Ctx as C, Headers, SubscribeOptions};

ruststream::header_name!(TraceId = "trace-id");

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
}

type Seen = Mutex<Vec<String>>;

static BUILT_INS: Seen = Mutex::new(Vec::new());

/// Every built-in extractor at once, the context under another name.
#[subscriber("ext.all")]
#[allow(clippy::too_many_arguments)]
async fn every_extractor(
    order: Order,
    subject: Subject,
    attempt: Attempt,
    key: Key,
    correlation: Option<CorrelationId>,
    reply_to: Option<ReplyTo>,
    headers: Headers,
    trace: Header<TraceId>,
    payload: Payload,
    ctx: C,
) {
    BUILT_INS.lock().unwrap().push(format!(
        "{} {} {} {} {:?} {} {} {} {} {}",
        order.id,
        subject.0,
        attempt.0,
        key.0,
        correlation.map(|c| c.0.to_string()),
        reply_to.is_some(),
        headers.get("trace-id").unwrap_or("-"),
        trace.value(),
        String::from_utf8_lossy(&payload.0),
        ctx.attempt(),
    ));
}

#[tokio::test]
async fn built_in_extractors_read_the_delivery() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(every_extractor)
        .start()
        .await
        .unwrap();
    let message = Message::new(r#"{"id":7}"#)
        .with_key("k-7")
        .with_correlation_id("c-1")
        .with_header("trace-id", "t-9");
    broker
        .publish_message("ext.all", message, None)
        .await
        .unwrap();
    within(5, "the handler", async {
        while BUILT_INS.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(
        BUILT_INS.lock().unwrap().as_slice(),
        [r#"7 ext.all 1 k-7 Some("c-1") false t-9 t-9 {"id":7} 1"#]
    );
}

/// A tenant id from a header: a message without it is dead-lettered with
/// the reason, and the handler never runs for it.
struct Tenant(String);

impl FromDelivery for Tenant {
    fn from_delivery(scope: &Scope<'_>) -> Result<Self, HandlerError> {
        scope
            .envelope()
            .headers()
            .get("tenant")
            .map(|t| Tenant(t.to_owned()))
            .ok_or_else(|| HandlerError::reject("a message needs a `tenant` header"))
    }
}

static TENANTS: Seen = Mutex::new(Vec::new());

#[subscriber("ext.tenant", dead_letter = "ext.tenant.dead")]
async fn per_tenant(order: Order, tenant: Tenant) {
    TENANTS
        .lock()
        .unwrap()
        .push(format!("{}:{}", tenant.0, order.id));
}

#[tokio::test]
async fn an_extractor_of_ones_own_rejects_with_its_reason() {
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("ext.tenant.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(per_tenant)
        .start()
        .await
        .unwrap();
    let out = Publisher::new(broker.clone());
    out.send(
        "ext.tenant",
        out.encode(&Order { id: 1 })
            .unwrap()
            .with_header("tenant", "acme"),
    )
    .await
    .unwrap();
    out.publish("ext.tenant", &Order { id: 2 }).await.unwrap();
    let rejected = within(5, "the dead letter", dead.next()).await.unwrap();
    assert_eq!(
        rejected.envelope().headers().get(ruststream::header::ERROR),
        Some("refused before the handler at attempt 1: a message needs a `tenant` header")
    );
    assert_eq!(rejected.envelope().payload(), r#"{"id":2}"#.as_bytes());
    running.shutdown().await.unwrap();
    assert_eq!(TENANTS.lock().unwrap().as_slice(), ["acme:1"]);
}

/// A body type of the user's own called `State` is a body, not shared
/// state: arguments are told apart by position and trait, not by name.
mod named_like_an_extractor {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    pub struct State {
        pub on: bool,
    }

    pub static SEEN: Mutex<Vec<bool>> = Mutex::new(Vec::new());

    #[subscriber("ext.named")]
    pub async fn switch(state: State) {
        SEEN.lock().unwrap().push(state.on);
    }
}

#[tokio::test]
async fn a_body_named_like_an_extractor_is_still_the_body() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(named_like_an_extractor::switch)
        .start()
        .await
        .unwrap();
    Publisher::new(broker.clone())
        .publish("ext.named", &named_like_an_extractor::State { on: true })
        .await
        .unwrap();
    within(5, "the handler", async {
        while named_like_an_extractor::SEEN.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(*named_like_an_extractor::SEEN.lock().unwrap(), [true]);
}

#[subscriber("ext.double")]
async fn double(n: u64) -> u64 {
    n * 2
}

/// Publishes and asks through the broker that delivered the message: with
/// two memory brokers registered, the second one's handler reaches the
/// second one's subscribers.
#[subscriber("ext.relay")]
async fn relay(n: u64, ctx: Ctx) -> Result<u64, HandlerError> {
    let doubled: u64 = ctx
        .request("ext.double", &n, Duration::from_secs(5))
        .await?;
    ctx.publish("ext.relayed", &doubled).await?;
    Ok(doubled)
}

#[tokio::test]
async fn ctx_publishes_and_requests_through_the_delivering_broker() {
    let first = MemoryBroker::new();
    let second = MemoryBroker::new();
    let mut relayed = second
        .subscribe(SubscribeOptions::new("ext.relayed"))
        .await
        .unwrap();
    let running = App::new()
        .broker(first.clone())
        .broker(second.clone())
        .subscriber(double)
        .subscriber(relay)
        .start()
        .await
        .unwrap();
    let reply: u64 = Publisher::new(second.clone())
        .request("ext.relay", &21u64, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply, 42);
    let published = within(5, "the relayed value", relayed.next())
        .await
        .unwrap();
    assert_eq!(published.envelope().payload(), "42".as_bytes());
    assert!(
        first
            .queues()
            .iter()
            .all(|q| q.subject.as_str() != "ext.relayed"),
        "nothing went to the other broker"
    );
    running.shutdown().await.unwrap();
}

struct Rate {
    per_cent: u64,
}

#[subscriber("ext.rate")]
async fn priced(cents: u64, rate: State<Rate>) -> u64 {
    cents * rate.per_cent
}

#[tokio::test]
async fn handlers_with_state_are_callable_in_tests() {
    assert_eq!(priced(3, State::new(Rate { per_cent: 7 })).await, 21);
    let shared = std::sync::Arc::new(Rate { per_cent: 5 });
    assert_eq!(priced(2, State::from(shared)).await, 10);
}
