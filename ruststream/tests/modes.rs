//! Execution modes: workers(n) (RT-3), workers(n, by_key) (RT-4, JQ-9/10),
//! threads(n) (RT-5) and Ctx<MainRuntime> (RT-6).

mod common;

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use common::{Gate, frame, until, within};
use ruststream::prelude::*;
use ruststream::{IntoSubscriber, MainRuntime, SubscribeOptions};
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct Item {
    key: u32,
    seq: u32,
}

// ---------------------------------------------------------------------------
// RT-3: workers(n)

static W_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static W_MAX: AtomicUsize = AtomicUsize::new(0);
static W_DONE: AtomicU32 = AtomicU32::new(0);
static W_ALL: Notify = Notify::const_new();
static W_GATE: Gate = Gate::new();
const W_N: u32 = 100;

#[subscriber("modes.workers", workers(4))]
async fn four_workers(_item: Bytes) {
    let now = W_IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    W_MAX.fetch_max(now, Ordering::SeqCst);
    W_GATE.pass().await;
    W_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    if W_DONE.fetch_add(1, Ordering::SeqCst) + 1 == W_N {
        W_ALL.notify_one();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt3_workers_reach_n_in_flight_and_never_exceed_it() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(four_workers)
        .start()
        .await
        .unwrap();
    for _ in 0..W_N {
        broker
            .publish_message("modes.workers", Message::new(vec![0u8; 10]), None)
            .await
            .unwrap();
    }
    until(10, "4 handlers in flight", || {
        W_IN_FLIGHT.load(Ordering::SeqCst) == 4
    })
    .await;
    // The loop does not poll while all four are busy: exactly 4 have left
    // the broker's queue.
    until(10, "the loop to settle", || {
        broker.queued_bytes() == (W_N as usize - 4) * frame(10)
    })
    .await;
    assert_eq!(W_MAX.load(Ordering::SeqCst), 4);

    W_GATE.open();
    within(10, "all handled", W_ALL.notified()).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        W_MAX.load(Ordering::SeqCst),
        4,
        "never more than n in flight"
    );
}

// ---------------------------------------------------------------------------
// RT-4: workers(n, by_key)

static K_LAST: Mutex<Option<HashMap<u32, u32>>> = Mutex::new(None);
static K_VIOLATIONS: AtomicU32 = AtomicU32::new(0);
static K_DONE: AtomicU32 = AtomicU32::new(0);
static K_ALL: Notify = Notify::const_new();
const K_KEYS: u32 = 100;
const K_PER_KEY: u32 = 100;

fn record_in_order(item: &Item) {
    let mut last = K_LAST.lock().unwrap();
    let last = last.get_or_insert_with(HashMap::new);
    let previous = last.insert(item.key, item.seq);
    if previous.is_some_and(|p| p + 1 != item.seq) || (previous.is_none() && item.seq != 0) {
        K_VIOLATIONS.fetch_add(1, Ordering::SeqCst);
    }
}

#[subscriber("modes.by_key", workers(4, by_key))]
async fn keyed(item: Item) {
    record_in_order(&item);
    // Give other workers a chance to interleave.
    tokio::task::yield_now().await;
    if K_DONE.fetch_add(1, Ordering::SeqCst) + 1 == K_KEYS * K_PER_KEY {
        K_ALL.notify_one();
    }
}

/// A deterministic shuffle of (key, seq) pairs that keeps each key's
/// sequence numbers in publish order.
fn shuffled_interleaving(keys: u32, per_key: u32) -> Vec<Item> {
    let mut next = vec![0u32; keys as usize];
    let mut out = Vec::with_capacity((keys * per_key) as usize);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    while out.len() < (keys * per_key) as usize {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = ((state >> 33) % u64::from(keys)) as u32;
        if next[key as usize] < per_key {
            out.push(Item {
                key,
                seq: next[key as usize],
            });
            next[key as usize] += 1;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt4_by_key_keeps_each_keys_order_over_10k_shuffled_deliveries() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(keyed)
        .start()
        .await
        .unwrap();
    for item in shuffled_interleaving(K_KEYS, K_PER_KEY) {
        let payload = ruststream::serde_json::to_vec(&item).unwrap();
        let message = Message::new(payload).with_key(format!("k{}", item.key));
        broker
            .publish_message("modes.by_key", message, None)
            .await
            .unwrap();
    }
    within(30, "10k keyed deliveries", K_ALL.notified()).await;
    running.shutdown().await.unwrap();
    assert_eq!(K_VIOLATIONS.load(Ordering::SeqCst), 0, "per-key order kept");
}

static SLOW_GATE: Gate = Gate::new();
static SLOW_STARTED: Notify = Notify::const_new();
static SLOW_OTHERS: AtomicU32 = AtomicU32::new(0);
static SLOW_OTHERS_DONE: Notify = Notify::const_new();
const SLOW_OTHERS_N: u32 = 1000;

fn tenant(item: &Item) -> u32 {
    item.key
}

#[subscriber("modes.slow_key", workers(4, by_key = tenant))]
async fn one_slow_key(item: Item) {
    if item.key == 0 {
        SLOW_STARTED.notify_one();
        SLOW_GATE.pass().await;
    } else if SLOW_OTHERS.fetch_add(1, Ordering::SeqCst) + 1 == SLOW_OTHERS_N {
        SLOW_OTHERS_DONE.notify_one();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt4_a_blocked_key_does_not_stop_other_keys() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(one_slow_key)
        .start()
        .await
        .unwrap();
    Publisher::new(broker.clone())
        .publish("modes.slow_key", &Item { key: 0, seq: 0 })
        .await
        .unwrap();
    within(
        5,
        "the slow key's handler to start",
        SLOW_STARTED.notified(),
    )
    .await;
    // Key 0 blocks; more of key 0 queue behind it, and every other key flows.
    Publisher::new(broker.clone())
        .publish("modes.slow_key", &Item { key: 0, seq: 1 })
        .await
        .unwrap();
    for seq in 0..SLOW_OTHERS_N {
        Publisher::new(broker.clone())
            .publish(
                "modes.slow_key",
                &Item {
                    key: 1 + seq % 50,
                    seq,
                },
            )
            .await
            .unwrap();
    }
    within(
        10,
        "other keys while key 0 is blocked",
        SLOW_OTHERS_DONE.notified(),
    )
    .await;
    SLOW_GATE.open();
    running.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// RT-5: threads(n)

static T_IN_HAND: AtomicUsize = AtomicUsize::new(0);
static T_WRONG_THREAD: AtomicBool = AtomicBool::new(false);
static T_GATE: Gate = Gate::new();
static T_DONE: AtomicU32 = AtomicU32::new(0);
static T_ALL: Notify = Notify::const_new();
static T_SPAWNED_ON: Mutex<Vec<tokio::runtime::Id>> = Mutex::new(Vec::new());
static T_HANDLER_ON: Mutex<Vec<tokio::runtime::Id>> = Mutex::new(Vec::new());
const T_N: u32 = 40;

#[subscriber("modes.threads", threads(2))]
async fn on_threads(_item: Bytes, ctx: Ctx<MainRuntime>) {
    // `!Send` state held across an await: fine on a dedicated thread.
    let local = Rc::new(std::cell::Cell::new(0u32));
    let name = std::thread::current().name().unwrap_or("").to_owned();
    if !name.starts_with("ruststream-thread-") {
        T_WRONG_THREAD.store(true, Ordering::SeqCst);
    }
    T_HANDLER_ON
        .lock()
        .unwrap()
        .push(tokio::runtime::Handle::current().id());
    T_IN_HAND.fetch_add(1, Ordering::SeqCst);
    T_GATE.pass().await;
    local.set(local.get() + 1);
    let spawned_on = ctx
        .run(async { tokio::runtime::Handle::current().id() })
        .await
        .unwrap();
    T_SPAWNED_ON.lock().unwrap().push(spawned_on);
    if T_DONE.fetch_add(1, Ordering::SeqCst) + 1 == T_N {
        T_ALL.notify_one();
    }
}

// Once both handlers are in hand, what left the broker is all that will
// while they block: a blocked thread claims nothing, and the feeder fills
// only the rings of idle threads (and each thread's claims, like the
// feeder's pushes, happen before it starts the handler it then holds). So
// the bound is checked without a quiet window to wait out.
#[tokio::test]
async fn rt5_threads_read_ahead_is_at_most_n_times_9_and_handlers_run_on_dedicated_threads() {
    let app_runtime = tokio::runtime::Handle::current().id();
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(on_threads)
        .start()
        .await
        .unwrap();
    for _ in 0..T_N {
        broker
            .publish_message("modes.threads", Message::new(vec![1u8; 10]), None)
            .await
            .unwrap();
    }
    // Both threads hold one delivery each, blocked.
    until(10, "2 handlers in hand", || {
        T_IN_HAND.load(Ordering::SeqCst) == 2
    })
    .await;
    let left_the_broker = T_N as usize - broker.queued_bytes() / frame(10);
    assert!(
        (2..=2 * 9).contains(&left_the_broker),
        "at most n x 9 deliveries left the broker, {left_the_broker} did"
    );
    // JQ-4: each one waiting holds its job permit; the two in hand gave
    // theirs back right before their handlers.
    let app = running.handle().clone();
    assert_eq!(app.pressure().in_use, left_the_broker - 2);

    T_GATE.open();
    within(10, "all handled", T_ALL.notified()).await;
    running.shutdown().await.unwrap();
    assert_eq!(app.pressure().in_use, 0, "every permit returned");
    assert!(
        !T_WRONG_THREAD.load(Ordering::SeqCst),
        "handlers run on dedicated threads"
    );
    let handler_runtimes = T_HANDLER_ON.lock().unwrap().clone();
    assert!(handler_runtimes.iter().all(|id| *id != app_runtime));
    let spawned = T_SPAWNED_ON.lock().unwrap().clone();
    assert_eq!(spawned.len(), T_N as usize);
    assert!(
        spawned.iter().all(|id| *id == app_runtime),
        "Ctx<MainRuntime>::run executes on the app runtime"
    );
}

// An idle dedicated thread parks on its ring while its runtime has no task;
// tasks spawned there (RT-11) still run while it waits for deliveries.

/// An app running `subscriber` alone, after `n` deliveries to `subject`.
async fn after_deliveries<M>(
    subscriber: impl IntoSubscriber<M>,
    subject: &str,
    n: usize,
) -> ruststream::RunningApp {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(subscriber)
        .start()
        .await
        .unwrap();
    for _ in 0..n {
        broker
            .publish_message(subject, Message::new(vec![1u8; 4]), None)
            .await
            .unwrap();
    }
    running
}

static TIMER_TASK_DONE: Notify = Notify::const_new();

#[subscriber("modes.threads_spawn", threads(1))]
async fn spawns_a_timer_task(_item: Bytes) {
    tokio::spawn(async {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        TIMER_TASK_DONE.notify_one();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt11_a_task_spawned_on_a_dedicated_thread_runs_while_the_thread_idles() {
    let running = after_deliveries(spawns_a_timer_task, "modes.threads_spawn", 1).await;
    // No further delivery comes: only the thread's own runtime can fire the
    // task's timers.
    within(
        10,
        "the spawned task's timers while its thread has no delivery",
        TIMER_TASK_DONE.notified(),
    )
    .await;
    running.shutdown().await.unwrap();
}

static THREAD_HANDLE: Mutex<Option<tokio::runtime::Handle>> = Mutex::new(None);
static THREAD_HANDLE_SET: Notify = Notify::const_new();

#[subscriber("modes.threads_handle", threads(1))]
async fn shares_its_runtime(_item: Bytes) {
    *THREAD_HANDLE.lock().unwrap() = Some(tokio::runtime::Handle::current());
    THREAD_HANDLE_SET.notify_one();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_spawned_onto_an_idle_dedicated_thread_from_outside_runs() {
    let running = after_deliveries(shares_its_runtime, "modes.threads_handle", 1).await;
    within(
        10,
        "the handler to share its runtime",
        THREAD_HANDLE_SET.notified(),
    )
    .await;
    let handle = THREAD_HANDLE.lock().unwrap().take().unwrap();
    // The thread has no delivery left and parks; the task's wake-up goes to
    // its runtime's driver, which the thread finds on its next recheck.
    let expected = handle.id();
    let ran_on = within(
        10,
        "a task spawned onto the idle thread's runtime",
        handle.spawn(async { tokio::runtime::Handle::current().id() }),
    )
    .await
    .unwrap();
    assert_eq!(ran_on, expected);
    running.shutdown().await.unwrap();
}

static SPREAD_IN_HAND: AtomicU32 = AtomicU32::new(0);
static SPREAD_GATE: Gate = Gate::new();

#[subscriber("modes.threads_spread", threads(4))]
async fn blocks_its_thread(_item: Bytes) {
    SPREAD_IN_HAND.fetch_add(1, Ordering::SeqCst);
    SPREAD_GATE.pass().await;
}

// The feeder takes the deliveries at hand in one step and shares them out
// over the rings: a handler that blocks its thread never keeps the
// deliveries behind it from idle threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt5_deliveries_at_hand_spread_over_idle_threads() {
    let running = after_deliveries(blocks_its_thread, "modes.threads_spread", 4).await;
    until(10, "one delivery in hand on each of the 4 threads", || {
        SPREAD_IN_HAND.load(Ordering::SeqCst) == 4
    })
    .await;
    SPREAD_GATE.open();
    running.shutdown().await.unwrap();
}

static BEHIND_FIRST: AtomicU32 = AtomicU32::new(0);
static BEHIND_IN_HAND: Notify = Notify::const_new();
static BEHIND_REST: Notify = Notify::const_new();
static BEHIND_GATE: Gate = Gate::new();
const BEHIND_N: u32 = 20;

#[subscriber("modes.threads_behind", threads(2))]
async fn first_one_blocks(item: Bytes) {
    if item[0] == 0 {
        BEHIND_IN_HAND.notify_one();
        BEHIND_GATE.pass().await;
    } else if BEHIND_FIRST.fetch_add(1, Ordering::SeqCst) + 1 == BEHIND_N {
        BEHIND_REST.notify_one();
    }
}

// A thread whose handler blocks holds nothing behind it: everything that
// comes while it is busy goes to the other thread (a feeder filling every
// ring with room would leave some in the blocked thread's ring).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt5_nothing_waits_behind_a_blocked_thread_while_another_is_free() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(first_one_blocks)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("modes.threads_behind", Message::new(vec![0u8]), None)
        .await
        .unwrap();
    within(10, "the first handler in hand", BEHIND_IN_HAND.notified()).await;
    for _ in 0..BEHIND_N {
        broker
            .publish_message("modes.threads_behind", Message::new(vec![1u8]), None)
            .await
            .unwrap();
    }
    within(
        10,
        "every later delivery handled while the first blocks",
        BEHIND_REST.notified(),
    )
    .await;
    BEHIND_GATE.open();
    running.shutdown().await.unwrap();
}

static IDLE_SEEN: Notify = Notify::const_new();

#[subscriber("modes.threads_idle", threads(3))]
async fn idles_after_one(_item: Bytes) {
    IDLE_SEEN.notify_one();
}

/// The states (`R` running or runnable, `S` asleep, ...) of this process's
/// dedicated threads, from `/proc/self/task/*/stat`.
#[cfg(target_os = "linux")]
fn dedicated_thread_states() -> Vec<char> {
    let mut states = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        // `comm` is cut to 15 bytes: "ruststream-thre".
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.starts_with("ruststream-thre") {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        // After "(comm)" comes the state letter.
        if let Some(state) = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
        {
            states.push(state);
        }
    }
    states
}

// An idle thread gives its CPU away a few times before it parks (ring.rs):
// that must end in sleep, never in a thread that keeps yielding while
// nothing arrives.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt5_idle_dedicated_threads_go_to_sleep() {
    let running = after_deliveries(idles_after_one, "modes.threads_idle", 1).await;
    within(10, "the one delivery to be handled", IDLE_SEEN.notified()).await;
    until(10, "all 3 idle dedicated threads asleep at once", || {
        let states = dedicated_thread_states();
        states.len() == 3 && states.iter().all(|state| *state == 'S')
    })
    .await;
    running.shutdown().await.unwrap();
}

static TK_VIOLATIONS: AtomicU32 = AtomicU32::new(0);
static TK_LAST: Mutex<Option<HashMap<u32, u32>>> = Mutex::new(None);
static TK_DONE: AtomicU32 = AtomicU32::new(0);
static TK_ALL: Notify = Notify::const_new();
const TK_KEYS: u32 = 16;
const TK_PER_KEY: u32 = 100;

#[subscriber("modes.threads_by_key", threads(3, by_key = tenant))]
async fn threads_keyed(item: Item) {
    {
        let mut last = TK_LAST.lock().unwrap();
        let last = last.get_or_insert_with(HashMap::new);
        let previous = last.insert(item.key, item.seq);
        if previous.map_or(item.seq != 0, |p| p + 1 != item.seq) {
            TK_VIOLATIONS.fetch_add(1, Ordering::SeqCst);
        }
    }
    tokio::task::yield_now().await;
    if TK_DONE.fetch_add(1, Ordering::SeqCst) + 1 == TK_KEYS * TK_PER_KEY {
        TK_ALL.notify_one();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt5_threads_by_key_keeps_each_keys_order() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(threads_keyed)
        .start()
        .await
        .unwrap();
    for item in shuffled_interleaving(TK_KEYS, TK_PER_KEY) {
        Publisher::new(broker.clone())
            .publish("modes.threads_by_key", &item)
            .await
            .unwrap();
    }
    within(30, "keyed deliveries on threads", TK_ALL.notified()).await;
    running.shutdown().await.unwrap();
    assert_eq!(TK_VIOLATIONS.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Builder equivalents: modes configured without the macro.

static B_DONE: Notify = Notify::const_new();

struct Counter;

impl ruststream::subscriber::Subscriber for Counter {
    type Body = u32;
    type Codec = ruststream::Json;

    fn config(&self) -> ruststream::subscriber::SubscriberConfig {
        ruststream::subscriber::SubscriberConfig::new("modes.builder").workers_by_key(3)
    }

    fn decode(&self, payload: &Bytes) -> Result<u32, ruststream::BoxError> {
        <ruststream::Json as ruststream::codec::Decode<_>>::decode(payload)
    }

    fn key(&self, body: &u32, _: &ruststream::Envelope) -> u64 {
        ruststream::subscriber::key_hash(&(body % 7))
    }

    async fn handle(
        &self,
        body: u32,
        _: &ruststream::subscriber::Scope<'_>,
    ) -> ruststream::subscriber::Outcome {
        if body == 99 {
            B_DONE.notify_one();
        }
        ruststream::subscriber::Outcome::Ack(None)
    }
}

impl ruststream::subscriber::SendSubscriber for Counter {
    fn handle_send(
        &self,
        body: u32,
        scope: &ruststream::subscriber::Scope<'_>,
    ) -> impl Future<Output = ruststream::subscriber::Outcome> + Send {
        ruststream::subscriber::Subscriber::handle(self, body, scope)
    }
}

#[tokio::test]
async fn modes_are_configurable_without_the_macro() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(Counter)
        .start()
        .await
        .unwrap();
    for i in 0..100u32 {
        Publisher::new(broker.clone())
            .publish("modes.builder", &i)
            .await
            .unwrap();
    }
    within(5, "builder-configured by-key subscriber", B_DONE.notified()).await;
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn zero_workers_from_the_builder_is_a_startup_error() {
    struct Zero;
    impl ruststream::subscriber::Subscriber for Zero {
        type Body = Bytes;
        type Codec = ruststream::Json;
        fn config(&self) -> ruststream::subscriber::SubscriberConfig {
            ruststream::subscriber::SubscriberConfig::new("modes.zero").workers(0)
        }
        fn decode(&self, payload: &Bytes) -> Result<Bytes, ruststream::BoxError> {
            Ok(payload.clone())
        }
        async fn handle(
            &self,
            _: Bytes,
            _: &ruststream::subscriber::Scope<'_>,
        ) -> ruststream::subscriber::Outcome {
            ruststream::subscriber::Outcome::Ack(None)
        }
    }
    impl ruststream::subscriber::SendSubscriber for Zero {
        fn handle_send(
            &self,
            body: Bytes,
            scope: &ruststream::subscriber::Scope<'_>,
        ) -> impl Future<Output = ruststream::subscriber::Outcome> + Send {
            ruststream::subscriber::Subscriber::handle(self, body, scope)
        }
    }
    let err = App::new()
        .broker(MemoryBroker::new())
        .subscriber(Zero)
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, ruststream::Error::Config(_)), "{err:?}");
}

// ---------------------------------------------------------------------------
// No lost wake-up: many tiny deliveries through each pooled mode must all
// arrive (a lost wake-up would hang here and fail at the timeout).

static STRESS_DONE: [AtomicU32; 3] = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];
static STRESS_ALL: [Notify; 3] = [
    Notify::const_new(),
    Notify::const_new(),
    Notify::const_new(),
];
const STRESS_N: u32 = 20_000;

fn stress_seen(mode: usize) {
    if STRESS_DONE[mode].fetch_add(1, Ordering::SeqCst) + 1 == STRESS_N {
        STRESS_ALL[mode].notify_one();
    }
}

#[subscriber("stress.workers", workers(3))]
async fn stress_workers(_b: Bytes) {
    stress_seen(0);
}

#[subscriber("stress.by_key", workers(3, by_key))]
async fn stress_by_key(_b: Bytes) {
    stress_seen(1);
}

#[subscriber("stress.threads", threads(3))]
async fn stress_threads(_b: Bytes) {
    stress_seen(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_wakeup_under_stress_in_any_pooled_mode() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(stress_workers)
        .subscriber(stress_by_key)
        .subscriber(stress_threads)
        .start()
        .await
        .unwrap();
    for i in 0..STRESS_N {
        for subject in ["stress.workers", "stress.by_key", "stress.threads"] {
            let message = Message::new(Bytes::new()).with_key(format!("k{}", i % 37));
            broker
                .publish_message(subject, message, None)
                .await
                .unwrap();
        }
    }
    for (mode, all) in STRESS_ALL.iter().enumerate() {
        within(
            60,
            &format!("every delivery in mode {mode}"),
            all.notified(),
        )
        .await;
    }
    running.shutdown().await.unwrap();
}

// by_key from a header: `fn(&Body, &Envelope) -> impl Hash`.

static H_LAST: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);
static H_VIOLATIONS: AtomicU32 = AtomicU32::new(0);
static H_DONE: AtomicU32 = AtomicU32::new(0);
static H_ALL: Notify = Notify::const_new();
const H_N: u32 = 2_000;

fn tenant_header(_body: &Item, env: &ruststream::Envelope) -> String {
    env.headers().get("tenant").unwrap_or("").to_owned()
}

#[subscriber("modes.header_key", workers(4, by_key = tenant_header))]
async fn by_header(item: Item, ctx: Ctx) {
    let tenant = ctx.headers().get("tenant").unwrap().to_owned();
    {
        let mut last = H_LAST.lock().unwrap();
        let previous = last
            .get_or_insert_with(HashMap::new)
            .insert(tenant, item.seq);
        if previous.is_some_and(|p| p >= item.seq) {
            H_VIOLATIONS.fetch_add(1, Ordering::SeqCst);
        }
    }
    tokio::task::yield_now().await;
    if H_DONE.fetch_add(1, Ordering::SeqCst) + 1 == H_N {
        H_ALL.notify_one();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rt4_by_key_can_read_the_key_from_a_header() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(by_header)
        .start()
        .await
        .unwrap();
    for seq in 0..H_N {
        let item = Item { key: 0, seq };
        let payload = ruststream::serde_json::to_vec(&item).unwrap();
        let message = Message::new(payload).with_header("tenant", format!("t{}", seq % 13));
        broker
            .publish_message("modes.header_key", message, None)
            .await
            .unwrap();
    }
    within(30, "header-keyed deliveries", H_ALL.notified()).await;
    running.shutdown().await.unwrap();
    assert_eq!(H_VIOLATIONS.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Cooperative scheduling: a loop with a backlog lets the other tasks of its
// runtime run (RT-2, RT-3).

const COOP_N: usize = 2_000;
static COOP_SEQ: AtomicUsize = AtomicUsize::new(0);
static COOP_WORKERS: AtomicUsize = AtomicUsize::new(0);

#[subscriber("modes.coop.seq", queue_group = "g")]
async fn coop_sequential(_payload: Bytes) {
    COOP_SEQ.fetch_add(1, Ordering::SeqCst);
}

#[subscriber("modes.coop.workers", queue_group = "g", workers(2))]
async fn coop_workers(_payload: Bytes) {
    COOP_WORKERS.fetch_add(1, Ordering::SeqCst);
}

/// Queues `COOP_N` messages before `subscriber`'s loop starts (a placeholder
/// member of its queue group holds them), then counts how often a task that
/// only yields runs while the loop works through the backlog on the same
/// current-thread runtime. A loop that never yielded would leave it one turn.
async fn turns_while_a_backlog_drains<M>(
    subject: &'static str,
    subscriber: impl IntoSubscriber<M>,
    handled: &'static AtomicUsize,
) -> usize {
    let broker = MemoryBroker::new();
    let placeholder = broker
        .subscribe(SubscribeOptions::new(subject).queue_group("g"))
        .await
        .unwrap();
    for _ in 0..COOP_N {
        broker
            .publish_message(subject, Message::new("x"), None)
            .await
            .unwrap();
    }
    let running = App::new()
        .broker(broker.clone())
        .subscriber(subscriber)
        .start()
        .await
        .unwrap();
    drop(placeholder);
    let turns = tokio::spawn(async move {
        let mut turns = 0;
        while handled.load(Ordering::SeqCst) < COOP_N {
            turns += 1;
            tokio::task::yield_now().await;
        }
        turns
    });
    let turns = within(10, "the backlog to drain", turns).await.unwrap();
    running.shutdown().await.unwrap();
    turns
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_with_a_backlog_lets_the_other_tasks_of_its_runtime_run() {
    // Budget: 128 deliveries in a row; the rest of the time goes to yields.
    let floor = COOP_N / 128 / 2;
    let turns = turns_while_a_backlog_drains("modes.coop.seq", coop_sequential, &COOP_SEQ).await;
    assert!(turns >= floor, "sequential: {turns} turns, want >= {floor}");
    let turns =
        turns_while_a_backlog_drains("modes.coop.workers", coop_workers, &COOP_WORKERS).await;
    assert!(turns >= floor, "workers(2): {turns} turns, want >= {floor}");
}
