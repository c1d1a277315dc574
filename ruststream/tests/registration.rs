//! Where a subscriber is bound, and how its settings are changed where it
//! is added: `subscriber_on::<B>`, `configure`.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use common::{until, within};
use ruststream::prelude::*;
use ruststream::{Error, SubscribeOptions};

static ON_SECOND: AtomicU32 = AtomicU32::new(0);

#[subscriber("reg.jobs")]
async fn counted(_job: Bytes) {
    ON_SECOND.fetch_add(1, Ordering::SeqCst);
}

/// A broker type of its own, to tell two registered brokers apart: a
/// second memory server behind a wrapper.
#[derive(Clone)]
struct Other(MemoryBroker);

impl Broker for Other {
    type Subscription = ruststream::binding::memory::MemorySubscription;

    fn name(&self) -> &'static str {
        "other"
    }

    async fn subscribe(&self, options: SubscribeOptions) -> ruststream::Result<Self::Subscription> {
        self.0.subscribe(options).await
    }

    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<tokio::time::Instant>,
    ) -> ruststream::Result<()> {
        self.0.publish_message(subject, message, deadline).await
    }

    async fn close(&self) -> ruststream::Result<()> {
        self.0.close().await
    }
}

/// `subscriber_on::<T>` binds to the registered broker of that type, not
/// to the one registered last.
#[tokio::test]
async fn subscriber_on_binds_to_the_broker_it_names() {
    let other = Other(MemoryBroker::new());
    let memory = MemoryBroker::new();
    let running = App::new()
        .broker(other.clone())
        .broker(memory.clone())
        .subscriber_on::<Other, _>(counted)
        .start()
        .await
        .unwrap();
    memory
        .publish_message("reg.jobs", Message::new("to the wrong broker"), None)
        .await
        .unwrap();
    other
        .publish_message("reg.jobs", Message::new("to the right one"), None)
        .await
        .unwrap();
    until(5, "the job on the named broker", || {
        ON_SECOND.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(
        memory.queues().is_empty(),
        "nothing subscribed on the broker registered last"
    );
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn subscriber_on_a_broker_the_app_lacks_is_a_startup_error() {
    let err = App::new()
        .broker(MemoryBroker::new())
        .subscriber_on::<Other, _>(counted)
        .start()
        .await
        .unwrap_err();
    let Error::Config(text) = &err else {
        panic!("expected a configuration error, got {err:?}")
    };
    assert!(text.contains("Other"), "{text}");
}

static TRIES: AtomicU32 = AtomicU32::new(0);

#[subscriber("reg.flaky", dead_letter = "reg.flaky.dead", max_attempts = 1)]
async fn flaky(_job: Bytes) -> Result<(), HandlerError> {
    TRIES.fetch_add(1, Ordering::SeqCst);
    Err(std::io::Error::other("not yet").into())
}

/// `configure` changes the macro's settings where the subscriber is added:
/// `max_attempts = 1` becomes 3.
#[tokio::test]
async fn configure_overrides_the_macro_settings() {
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("reg.flaky.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(flaky.configure(|c| c.max_attempts(3)))
        .start()
        .await
        .unwrap();
    broker
        .publish_message("reg.flaky", Message::new("job"), None)
        .await
        .unwrap();
    within(5, "the dead letter", dead.next()).await.unwrap();
    assert_eq!(TRIES.load(Ordering::SeqCst), 3, "three attempts, not one");
    running.shutdown().await.unwrap();
}
