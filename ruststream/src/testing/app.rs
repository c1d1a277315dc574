//! [`TestApp`]: the real app on an in-process broker, driven and observed.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::task::JoinHandle;

use super::record::{Recorder, Sent};
use crate::codec::{Decode, Encode};
use crate::message::header;
use crate::middleware::{self, Next, OnPublish, Outcome, Request};
use crate::{
    App, Broker, Delivery, Envelope, Json, MemoryBroker, Message, Publisher, Result, RunningApp,
    SubscribeOptions, Subscription,
};

/// One delivery a handler (behind middleware) was called with, and how it
/// ended.
#[derive(Clone, Debug)]
pub struct Call {
    /// The handler's name (for `#[subscriber]`, the path of the function).
    pub handler: &'static str,
    /// The delivery.
    pub envelope: Envelope,
    /// `Ok(reply payload, if any)`, or the handler's error as text.
    pub outcome: std::result::Result<Option<Bytes>, String>,
}

impl Call {
    /// The body the handler was called with, decoded as JSON.
    ///
    /// # Panics
    ///
    /// When the payload is not a `T`, showing it.
    #[track_caller]
    pub fn body<T>(&self) -> T
    where
        Json: Decode<T>,
    {
        let payload = self.envelope.payload();
        Json::decode(payload).unwrap_or_else(|err| {
            panic!(
                "the call's payload is not a `{}`: {err}\npayload: {}",
                std::any::type_name::<T>(),
                String::from_utf8_lossy(payload)
            )
        })
    }
}

/// A message a subscriber gave up on, as its dead-letter subject got it.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The subject the message was first delivered on.
    pub subject: String,
    /// Why it was given up (the `ruststream-error` header).
    pub reason: String,
    /// The message as dead-lettered.
    pub envelope: Envelope,
}

/// The app under test: the same subscribers, hooks, state, middleware and
/// modes as `app`, every broker replaced by one in-process
/// [`MemoryBroker`] (queue groups, redelivery with attempts, dead letters,
/// request/reply and held retries, no network). Handlers that publish
/// through `ctx.publish` / `ctx.request` run unchanged; a
/// `ctx.publisher::<OtherBroker>()` finds no such broker here.
///
/// ```
/// use ruststream::prelude::*;
/// use ruststream::testing::TestApp;
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { id: u64 }
///
/// #[subscriber("orders", max_attempts = 2, dead_letter = "orders.dead")]
/// async fn confirm(order: Order, ctx: Ctx) -> Result<(), HandlerError> {
///     if order.id == 0 {
///         return Err(HandlerError::reject("no such order"));
///     }
///     ctx.publish("orders.confirmed", &order.id).await?;
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> ruststream::Result<()> {
/// // The service's own builder, with whatever brokers it registers.
/// let app = App::new().broker(MemoryBroker::new()).subscriber(confirm);
///
/// let test = TestApp::start(app).await?;
/// test.publish("orders", &Order { id: 7 }).await?;
/// test.publish("orders", &Order { id: 0 }).await?;
/// test.settle().await;
/// assert_eq!(test.published_as::<u64>("orders.confirmed"), [7]);
/// assert_eq!(test.dead_lettered("orders")[0].reason, "handler failed at attempt 1: no such order");
/// assert_eq!(test.calls("confirm").len(), 2);
/// test.shutdown().await
/// # }
/// ```
pub struct TestApp {
    broker: MemoryBroker,
    running: RunningApp,
    sent: Arc<Recorder>,
    calls: Arc<Mutex<Vec<Call>>>,
    dead: Arc<Mutex<Vec<DeadLetter>>>,
    watchers: Vec<JoinHandle<()>>,
}

impl TestApp {
    /// Rebinds `app` to an in-process broker and starts it.
    pub async fn start<B>(app: App<B>) -> Result<TestApp> {
        let broker = MemoryBroker::new();
        let (app, dead_letters) = app.on_memory(broker.clone());
        let sent = Arc::new(Recorder::default());
        let calls = Arc::new(Mutex::new(Vec::new()));
        let dead = Arc::new(Mutex::new(Vec::new()));
        let mut watchers = Vec::new();
        for subject in dead_letters {
            let subscription = broker.subscribe(SubscribeOptions::new(subject)).await?;
            watchers.push(tokio::spawn(watch_dead_letters(
                subscription,
                Arc::clone(&dead),
            )));
        }
        let recorder = Arc::clone(&sent);
        let record = Arc::clone(&calls);
        let running = app
            .on_publish(move |subject: &str, message: &mut Message| {
                recorder.on_publish(subject, message);
            })
            .middleware(middleware::from_fn(move |request: Request, next: Next| {
                let record = Arc::clone(&record);
                async move {
                    let handler = request.handler();
                    let envelope = request.envelope().clone();
                    let outcome = next.run(request).await;
                    let result = match &outcome {
                        Outcome::Ack(reply) => Ok(reply.clone()),
                        Outcome::Failed(err) => Err(err.to_string()),
                    };
                    lock(&record).push(Call {
                        handler,
                        envelope,
                        outcome: result,
                    });
                    outcome
                }
            }))
            .start()
            .await?;
        Ok(TestApp {
            broker,
            running,
            sent,
            calls,
            dead,
            watchers,
        })
    }

    /// The in-process broker the app runs on.
    pub fn broker(&self) -> &MemoryBroker {
        &self.broker
    }

    /// A publisher into the app (JSON; `with_codec` for another). What it
    /// sends is not counted as sent by the app.
    pub fn publisher(&self) -> Publisher<MemoryBroker> {
        Publisher::new(self.broker.clone())
    }

    /// Publishes `value`, JSON-encoded, to `subject`.
    pub async fn publish<T: Serialize + ?Sized>(&self, subject: &str, value: &T) -> Result<()> {
        self.publisher().publish(subject, value).await
    }

    /// Publishes a prepared message (headers, key) to `subject`.
    pub async fn send(&self, subject: &str, message: Message) -> Result<()> {
        self.publisher().send(subject, message).await
    }

    /// Sends `value` as a JSON request and decodes the reply; a failed
    /// reply is an error, as for [`Publisher::request`].
    pub async fn request<T, R>(&self, subject: &str, value: &T, timeout: Duration) -> Result<R>
    where
        T: ?Sized,
        Json: Encode<T> + Decode<R>,
    {
        self.publisher().request(subject, value, timeout).await
    }

    /// Returns once the app is quiet: no delivery queued or being handled,
    /// and nothing the app sends, handles or tracks changed for a few
    /// scheduler rounds — follow-up tasks and retries that are due have
    /// run. A `retry_after` whose delay has not passed is not waited for:
    /// under a paused clock (`#[tokio::test(start_paused = true)]`),
    /// `tokio::time::advance` makes it due, then `settle` again.
    ///
    /// # Panics
    ///
    /// When the app does not settle within 10,000 rounds (a handler that
    /// never ends), saying what it is still doing.
    pub async fn settle(&self) {
        const STABLE_ROUNDS: usize = 4;
        let mut last = None;
        let mut stable = 0;
        for _ in 0..10_000 {
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
            let now = self.activity();
            if now.idle() && last == Some(now) {
                stable += 1;
                if stable == STABLE_ROUNDS {
                    return;
                }
            } else {
                stable = 0;
            }
            last = Some(now);
        }
        panic!("the app did not settle: {:?}", self.activity());
    }

    fn activity(&self) -> Activity {
        Activity {
            queued: self.broker.queues().iter().map(|q| q.queued).sum(),
            in_hand: self.running.pressure().in_use,
            tracked: self.running.handle().tracked(),
            sent: lock(&self.sent.0).len(),
            calls: lock(&self.calls).len(),
            dead: lock(&self.dead).len(),
        }
    }

    /// What the app sent to `subject` (publishes, requests, replies), in
    /// order.
    pub fn published(&self, subject: &str) -> Vec<Message> {
        self.sent
            .all()
            .into_iter()
            .filter(|(s, _)| s == subject)
            .map(|(_, message)| message)
            .collect()
    }

    /// What the app sent to `subject`, decoded as JSON.
    ///
    /// # Panics
    ///
    /// When one does not decode as `T`, printing everything the app sent.
    #[track_caller]
    pub fn published_as<T>(&self, subject: &str) -> Vec<T>
    where
        Json: Decode<T>,
    {
        self.sent.decoded(subject)
    }

    /// The messages subscribers on `subject` gave up on (dead-lettered),
    /// with their reasons.
    pub fn dead_lettered(&self, subject: &str) -> Vec<DeadLetter> {
        lock(&self.dead)
            .iter()
            .filter(|letter| letter.subject == subject)
            .cloned()
            .collect()
    }

    /// The calls of the handler named `handler` — its function's name
    /// (`"confirm"`) or full path — in the order they ended. Handlers of
    /// `threads(n)` subscribers take no middleware and are not recorded.
    pub fn calls(&self, handler: &str) -> Vec<Call> {
        lock(&self.calls)
            .iter()
            .filter(|call| crate::text::names(call.handler, handler))
            .cloned()
            .collect()
    }

    /// The running app (its handle, pressure, publishers).
    pub fn running(&self) -> &RunningApp {
        &self.running
    }

    /// Shuts the app down gracefully, as in production.
    pub async fn shutdown(self) -> Result<()> {
        for watcher in &self.watchers {
            watcher.abort();
        }
        self.running.shutdown().await
    }
}

impl fmt::Debug for TestApp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestApp")
            .field("sent", &format_args!("{}", Sent(&self.sent.all())))
            .field("activity", &self.activity())
            .finish()
    }
}

/// What the app is doing, compared between rounds of `settle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Activity {
    queued: usize,
    in_hand: usize,
    tracked: usize,
    sent: usize,
    calls: usize,
    dead: usize,
}

impl Activity {
    fn idle(&self) -> bool {
        self.queued == 0 && self.in_hand == 0
    }
}

/// Collects dead letters as they arrive (acked at once: a test's copy).
async fn watch_dead_letters<S: Subscription>(
    mut subscription: S,
    dead: Arc<Mutex<Vec<DeadLetter>>>,
) {
    while let Some(delivery) = subscription.next().await {
        let envelope = delivery.envelope().clone();
        let headers = envelope.headers();
        let letter = DeadLetter {
            subject: headers
                .get(header::ORIGINAL_SUBJECT)
                .unwrap_or_default()
                .to_owned(),
            reason: headers.get(header::ERROR).unwrap_or_default().to_owned(),
            envelope: envelope.clone(),
        };
        lock(&dead).push(letter);
        let _ = delivery.ack().await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
