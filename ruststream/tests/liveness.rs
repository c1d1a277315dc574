//! Liveness and isolation on the public API: a full key never holds up the
//! other keys (RT-4, JQ-5, JQ-10, JQ-22), an idle subscription holds no job
//! permit so any permit cap lets every subscription progress (JQ-4), and
//! sources sharing permits take turns (JQ-7).

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{Gate, frame, queue, until, within};
use ruststream::Error;
use ruststream::ingress::JobQueueSettings;
use ruststream::prelude::*;
use ruststream::subscriber::{Subscriber, SubscriberConfig};
use tokio::sync::Notify;

// ------------------------------------------------ a full key blocks no other

static SLOW_GATE: Gate = Gate::new();
static SLOW_SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Key "slow" blocks until the gate opens; every other key answers at once.
#[subscriber("live.keys", workers(2, by_key), max_pending_per_key = 2)]
async fn keyed(n: u32, ctx: Ctx) -> u32 {
    if ctx.key().map(|k| k.as_str()) == Some("slow") {
        SLOW_GATE.pass().await;
        SLOW_SEEN.lock().unwrap().push(n);
    }
    n
}

async fn publish_keyed(broker: &MemoryBroker, subject: &str, key: &str, n: u32) {
    let message = Message::new(n.to_string()).with_key(key.to_owned());
    broker
        .publish_message(subject, message, None)
        .await
        .unwrap();
}

/// The reproduction: three one-way records of a blocked key with a
/// per-key limit of 2 (one running, one queued, one held), then a request
/// for another key answers within its 1 s timeout. The blocked key's
/// records are all handled afterwards, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_key_never_delays_the_other_keys() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(keyed)
        .start()
        .await
        .unwrap();
    for n in 1..=3 {
        publish_keyed(&broker, "live.keys", "slow", n).await;
    }
    until(5, "the slow key's records received", || {
        queue(&broker, "live.keys").queued == 0
    })
    .await;
    for n in 0..20 {
        let request = Message::new((100 + n).to_string()).with_key("fast");
        let reply = within(
            5,
            "a fast key's reply",
            broker.request_message("live.keys", request, Duration::from_secs(1)),
        )
        .await
        .unwrap_or_else(|err| panic!("the fast key was held up by the slow one: {err}"));
        assert_eq!(reply.payload(), (100 + n).to_string().as_bytes());
    }
    // Only the running record holds a permit-free turn; the queued one
    // holds its permit, the held one returned its own (JQ-5).
    assert_eq!(running.pressure().in_use, 1);
    SLOW_GATE.open();
    until(5, "the slow key's records", || {
        SLOW_SEEN.lock().unwrap().len() == 3
    })
    .await;
    assert_eq!(*SLOW_SEEN.lock().unwrap(), [1, 2, 3], "in order, none lost");
    let app = running.handle().clone();
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0, "every permit returned");
}

static BOUND_GATE: Gate = Gate::new();
static BOUND_SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

#[subscriber(
    "live.bound",
    workers(2, by_key),
    max_pending = 6,
    max_pending_per_key = 2
)]
async fn bounded(n: u32) {
    BOUND_GATE.pass().await;
    BOUND_SEEN.lock().unwrap().push(n);
}

/// Held records count against `max_pending`: a key that keeps receiving
/// while it is blocked fills the subscriber's pending budget, and then the
/// rest stays in the broker (bounded memory, no side backlog: JQ-8, JQ-21).
/// Nothing is lost or reordered once it drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_records_count_against_max_pending_and_the_rest_stays_in_the_broker() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(bounded)
        .start()
        .await
        .unwrap();
    for n in 1..=20 {
        publish_keyed(&broker, "live.bound", "k", n).await;
    }
    // One running + one queued + four held = max_pending; the loop then
    // waits for room, holding nothing and receiving nothing.
    until(5, "six records to leave the broker", || {
        queue(&broker, "live.bound").queued == 14
    })
    .await;
    assert_eq!(
        running.pressure().in_use,
        1,
        "only the queued record's permit"
    );
    assert_eq!(
        running.pressure().waiters,
        0,
        "the loop waits for room, not a permit"
    );
    BOUND_GATE.open();
    until(10, "all 20 handled", || {
        BOUND_SEEN.lock().unwrap().len() == 20
    })
    .await;
    assert_eq!(*BOUND_SEEN.lock().unwrap(), (1..=20).collect::<Vec<_>>());
    running.shutdown().await.unwrap();
}

// --------------------------------------------- any permit cap makes progress

static PROGRESS: [AtomicU32; 3] = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];
static PROGRESS_DONE: Notify = Notify::const_new();
const BACKLOG: u32 = 60;

/// A sequential subscriber to `live.progress.<i>`, counting its deliveries.
struct Counting(usize, String);

impl Subscriber for Counting {
    type Body = Bytes;
    type Codec = ruststream::Json;

    fn config(&self) -> SubscriberConfig {
        SubscriberConfig::new(self.1.clone())
    }

    fn decode(&self, payload: &Bytes) -> Result<Bytes, ruststream::BoxError> {
        Ok(payload.clone())
    }

    async fn handle(
        &self,
        _body: Bytes,
        _scope: &ruststream::subscriber::Scope<'_>,
    ) -> ruststream::subscriber::Outcome {
        if PROGRESS[self.0].fetch_add(1, Ordering::SeqCst) + 1 == BACKLOG {
            PROGRESS_DONE.notify_one();
        }
        ruststream::subscriber::Outcome::Ack(None)
    }
}

impl ruststream::subscriber::SendSubscriber for Counting {
    fn handle_send(
        &self,
        body: Bytes,
        scope: &ruststream::subscriber::Scope<'_>,
    ) -> impl Future<Output = ruststream::subscriber::Outcome> + Send {
        self.handle(body, scope)
    }
}

/// With one permit and three subscriptions — one idle forever, two with a
/// backlog — both backlogs drain: the idle one waits for records holding no
/// permit (JQ-4, JQ-7). `start()` accepts a cap below the number of loops.
async fn one_permit_three_subscriptions(tag: &str) {
    let broker = MemoryBroker::new();
    let subject = |i: usize| format!("live.progress.{tag}.{i}");
    let mut app = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(1));
    for i in 0..3 {
        app = app.subscriber(Counting(i, subject(i)));
    }
    let running = app.start().await.unwrap();
    for n in 0..BACKLOG {
        for i in [1, 2] {
            broker
                .publish_message(&subject(i), Message::new(n.to_string()), None)
                .await
                .unwrap();
        }
    }
    within(10, "both backlogs to drain", async {
        while PROGRESS[1].load(Ordering::SeqCst) < BACKLOG
            || PROGRESS[2].load(Ordering::SeqCst) < BACKLOG
        {
            PROGRESS_DONE.notified().await;
        }
    })
    .await;
    assert_eq!(PROGRESS[0].load(Ordering::SeqCst), 0);
    let app = running.handle().clone();
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0);
    for counter in &PROGRESS {
        counter.store(0, Ordering::SeqCst);
    }
}

/// One test runs both runtimes in turn: they share the counters.
#[test]
fn a_permit_cap_below_the_number_of_subscriptions_never_stalls_one() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(one_permit_three_subscriptions("current"));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(one_permit_three_subscriptions("multi"));
}

// ---------------------------------------------------- sources take turns

const TURNS_EACH: usize = 300;

/// Each turn: its source, and whether the other source was waiting for the
/// permit when the handler started.
type Turns = Arc<Mutex<Vec<(char, bool)>>>;

/// A sequential subscriber that logs its turns once a gate opens.
struct TurnTaker {
    source: char,
    subject: String,
    turns: Turns,
    gate: Arc<tokio::sync::Semaphore>,
    app: Arc<OnceLock<ruststream::AppHandle>>,
}

impl Subscriber for TurnTaker {
    type Body = Bytes;
    type Codec = ruststream::Json;

    fn config(&self) -> SubscriberConfig {
        SubscriberConfig::new(self.subject.clone())
    }

    fn decode(&self, payload: &Bytes) -> Result<Bytes, ruststream::BoxError> {
        Ok(payload.clone())
    }

    async fn handle(
        &self,
        _body: Bytes,
        _scope: &ruststream::subscriber::Scope<'_>,
    ) -> ruststream::subscriber::Outcome {
        self.gate.acquire().await.unwrap().forget();
        let waited = self.app.get().is_some_and(|app| app.pressure().waiters > 0);
        self.turns.lock().unwrap().push((self.source, waited));
        ruststream::subscriber::Outcome::Ack(None)
    }
}

impl ruststream::subscriber::SendSubscriber for TurnTaker {
    fn handle_send(
        &self,
        body: Bytes,
        scope: &ruststream::subscriber::Scope<'_>,
    ) -> impl Future<Output = ruststream::subscriber::Outcome> + Send {
        self.handle(body, scope)
    }
}

/// Two sequential subscribers sharing one permit, each with a backlog of
/// [`TURNS_EACH`]; both loops start from a held handler. Returns the turns.
async fn two_sources_with_one_permit(tag: &str) -> Vec<(char, bool)> {
    let broker = MemoryBroker::new();
    let turns = Turns::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let app_handle = Arc::new(OnceLock::new());
    let subject = |source: char| format!("live.turns.{tag}.{source}");
    let mut app = App::new()
        .broker(broker.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(1));
    for source in ['a', 'b'] {
        app = app.subscriber(TurnTaker {
            source,
            subject: subject(source),
            turns: Arc::clone(&turns),
            gate: Arc::clone(&gate),
            app: Arc::clone(&app_handle),
        });
    }
    let running = app.start().await.unwrap();
    app_handle.set(running.handle().clone()).unwrap();
    for _ in 0..TURNS_EACH {
        for source in ['a', 'b'] {
            broker
                .publish_message(&subject(source), Message::new("x"), None)
                .await
                .unwrap();
        }
    }
    until(
        5,
        "both loops in a held handler, backlogs behind them",
        || broker.queued_bytes() == 2 * (TURNS_EACH - 1) * frame(1),
    )
    .await;
    gate.add_permits(2 * TURNS_EACH);
    until(10, "every turn", || {
        turns.lock().unwrap().len() == 2 * TURNS_EACH
    })
    .await;
    running.shutdown().await.unwrap();
    turns.lock().unwrap().clone()
}

fn shown(turns: &[(char, bool)]) -> String {
    turns.iter().map(|(s, _)| *s).collect()
}

/// JQ-7 under load: on a 2-thread runtime a loop never overtakes a waiting
/// one. When a turn starts while the other source waits, the permit that
/// turn returned went to the waiting source, so the other source's turn is
/// among the next two (its handler may start a moment after this source's
/// next one). (A source whose task the OS or the runtime has not resumed
/// yet is not waiting: the other runs on meanwhile.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_never_overtakes_a_waiting_one() {
    let turns = two_sources_with_one_permit("multi").await;
    let mut waits = 0;
    for (i, &(source, other_waited)) in turns.iter().enumerate() {
        if !other_waited {
            continue;
        }
        waits += 1;
        let next_two = &turns[i + 1..(i + 3).min(turns.len())];
        let other_left = turns[i + 1..].iter().any(|&(s, _)| s != source);
        assert!(
            !other_left || next_two.iter().any(|&(s, _)| s != source),
            "turn {i} of `{source}` started while the other source waited, \
             and `{source}` took the next two turns as well: {}",
            shown(&turns)
        );
    }
    eprintln!("{waits} turns started with the other source waiting");
}

/// On one thread, a loop that took the last free permit lets the other run
/// before its next take: neither takes more than two turns in a row
/// (without that, each took its runtime budget of 128 turns in a row).
#[tokio::test]
async fn sources_on_one_thread_alternate() {
    let turns = two_sources_with_one_permit("current").await;
    let shown = shown(&turns);
    let both_left = &shown[..shown.rfind('a').min(shown.rfind('b')).unwrap()];
    let longest = both_left
        .as_bytes()
        .chunk_by(|a, b| a == b)
        .map(<[u8]>::len)
        .max()
        .unwrap_or(0);
    assert!(longest <= 2, "{longest} turns in a row: {shown}");
}

// ------------------------------------------------- plain errors, one meaning

static REFUSE_GATE: Gate = Gate::new();

#[subscriber("live.refuse", workers(1, by_key), max_pending_per_key = 1)]
async fn refusing(_n: u32) {
    REFUSE_GATE.pass().await;
}

/// A structural refusal reads once, in plain words; a refused request is an
/// `Err` from the broker's own `request_message` as from a `Publisher`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_an_error_that_says_why_once() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(refusing)
        .start()
        .await
        .unwrap();
    publish_keyed(&broker, "live.refuse", "k", 1).await;
    until(5, "the first record running", || {
        queue(&broker, "live.refuse").queued == 0
    })
    .await;
    let request = || Message::new("2").with_key("k");
    let timeout = Duration::from_secs(5);
    let err = broker
        .request_message("live.refuse", request(), timeout)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StructuralLimit(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "structural limit: the key's queue is at its count limit"
    );
    let typed = running
        .publisher::<MemoryBroker>()
        .unwrap()
        .request_message("live.refuse", request(), timeout)
        .await
        .unwrap_err();
    assert_eq!(typed.to_string(), err.to_string(), "one meaning everywhere");

    // Refused before its handler: a payload that is not a number.
    let malformed = broker
        .request_message("live.refuse", Message::new("two"), timeout)
        .await
        .unwrap_err();
    assert!(matches!(malformed, Error::Protocol(_)), "{malformed:?}");
    assert!(
        !malformed
            .to_string()
            .contains("protocol error: protocol error")
    );
    REFUSE_GATE.open();
    running.shutdown().await.unwrap();
}

// ---------------------------------------------- missing state fails startup

struct Pool;

static STATEFUL_CALLS: AtomicU32 = AtomicU32::new(0);

#[subscriber("live.stateful")]
async fn stateful(_n: u32, _pool: State<Pool>) {
    STATEFUL_CALLS.fetch_add(1, Ordering::SeqCst);
}

/// A handler's `State<T>` that was never registered is a startup error
/// naming the handler and the type; no delivery is spent on it.
#[tokio::test]
async fn a_missing_state_is_a_startup_error() {
    let broker = MemoryBroker::new();
    let err = App::new()
        .broker(broker.clone())
        .subscriber(stateful)
        .start()
        .await
        .unwrap_err();
    let Error::Config(text) = &err else {
        panic!("expected a configuration error, got {err:?}")
    };
    assert!(text.contains("live.stateful"), "{text}");
    assert!(text.contains("stateful"), "names the handler: {text}");
    assert!(
        text.contains("State<liveness::Pool>"),
        "names the type: {text}"
    );
    assert!(broker.queues().is_empty(), "nothing was subscribed");
    assert_eq!(STATEFUL_CALLS.load(Ordering::SeqCst), 0);

    // Registered, it starts and runs.
    let running = App::new()
        .broker(broker.clone())
        .state(Pool)
        .subscriber(stateful)
        .start()
        .await
        .unwrap();
    Publisher::new(broker.clone())
        .publish("live.stateful", &1)
        .await
        .unwrap();
    until(5, "the handler", || {
        STATEFUL_CALLS.load(Ordering::SeqCst) == 1
    })
    .await;
    running.shutdown().await.unwrap();
}
