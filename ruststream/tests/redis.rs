//! The Redis Streams binding against a real redis-server: the conformance
//! suite (request/reply included), a crashed consumer's pending entries
//! claimed by a live one, the dead-letter stream's content, an app-level
//! request with a handler error, and a server restart mid-stream on a server
//! of the test's own.
//!
//! Needs Redis on `RUSTSTREAM_REDIS_URL` (default `redis://127.0.0.1:6379`);
//! `scripts/test.sh` starts it when it is down. The tests fail — never skip —
//! when it is unreachable.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::blocked::Blocked;
use common::server::OwnServer;
use common::{unique, until, within};
use ruststream::conformance::{self, Capabilities, Harness};
use ruststream::redis::{RedisBroker, RedisBrokerBuilder};
use ruststream::{
    Broker, Delivery, Envelope, Message, Result, SubscribeOptions, Subscription, header,
};

const START: &str = "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save \"\" \
     --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log \
     (or run scripts/test.sh, which starts it)";

fn url() -> String {
    std::env::var("RUSTSTREAM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Quick settings so redelivery after a nack or a crash shows within a test.
fn quick() -> RedisBrokerBuilder {
    RedisBroker::builder()
        .claim_idle(Duration::from_millis(300))
        .block(Duration::from_millis(100))
}

async fn redis_at(url: &str) -> RedisBroker {
    match quick().connect(url).await {
        Ok(redis) => redis,
        Err(err) => panic!("Redis is not reachable at {url}: {err}\nstart it with: {START}"),
    }
}

/// Deletes every key starting with `prefix`.
async fn delete_keys(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    for key in keys {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query_async(&mut conn).await;
    }
}

struct Streams;

impl Harness for Streams {
    type Broker = RedisBroker;

    fn capabilities(&self) -> Capabilities {
        Capabilities::all().without_wildcards()
    }

    async fn connect(&self, _prefix: &str) -> Result<RedisBroker> {
        Ok(redis_at(&url()).await)
    }

    async fn cleanup(&self, prefix: &str) {
        delete_keys(&url(), prefix).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_conform() {
    let report = conformance::run(&Streams).await;
    report.assert_passed();
    assert_eq!(report.skipped, ["wildcards_match_one_and_many_tokens"]);
}

fn text(env: &Envelope) -> String {
    String::from_utf8_lossy(env.payload()).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_consumers_pending_entries_are_claimed_by_a_live_one() {
    let stream = unique("crash.");
    let redis = redis_at(&url()).await;
    let options = || SubscribeOptions::new(stream.as_str()).queue_group("workers");
    let mut crashed = redis.subscribe(options()).await.unwrap();
    for i in 0..3 {
        redis
            .publish_message(&stream, Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    // The consumer takes all three, settles none, and dies.
    let mut taken = Vec::new();
    for _ in 0..3 {
        let d = within(5, "an entry", crashed.next()).await.unwrap();
        taken.push(text(d.envelope()));
        std::mem::forget(d);
    }
    drop(crashed);
    let mut live = redis.subscribe(options()).await.unwrap();
    let mut claimed = Vec::new();
    for _ in 0..3 {
        let d = within(10, "a claimed entry", live.next()).await.unwrap();
        assert_eq!(
            d.envelope().attempt(),
            2,
            "the delivery count is the attempt"
        );
        claimed.push(text(d.envelope()));
        d.ack().await.unwrap();
    }
    claimed.sort();
    assert_eq!(claimed, taken);
    delete_keys(&url(), &stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_copies_the_entry_to_the_dead_letter_stream_with_the_reason() {
    let stream = unique("dlq.");
    let dead = format!("{stream}.dead");
    let redis = redis_at(&url()).await;
    let mut sub = redis
        .subscribe(
            SubscribeOptions::new(stream.as_str())
                .queue_group("w")
                .dead_letter(dead.as_str()),
        )
        .await
        .unwrap();
    let message = Message::new("poison")
        .with_header("x-tenant", "acme")
        .with_key("k1");
    redis.publish_message(&stream, message, None).await.unwrap();
    let d = within(5, "the entry", sub.next()).await.unwrap();
    d.reject("cannot parse").await.unwrap();

    // Read the dead-letter stream raw: the fields are what any Redis client sees.
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&dead)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(entries.ids.len(), 1);
    let entry = &entries.ids[0];
    let get = |field: &str| entry.get::<String>(field);
    assert_eq!(get("p").as_deref(), Some("poison"));
    assert_eq!(get("k").as_deref(), Some("k1"));
    assert_eq!(get("h:x-tenant").as_deref(), Some("acme"));
    assert_eq!(
        get(&format!("h:{}", header::ERROR)).as_deref(),
        Some("cannot parse")
    );
    assert_eq!(
        get(&format!("h:{}", header::ORIGINAL_SUBJECT)).as_deref(),
        Some(stream.as_str())
    );
    // Acked on the source: nothing pending.
    let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("w")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending.count(), 0);
    delete_keys(&url(), &stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_stream_loses_no_entry() {
    // An append-only file, so a restart keeps the stream.
    let mut server = OwnServer::redis().await;
    let redis = redis_at(&format!("redis://127.0.0.1:{}", server.port)).await;
    let mut sub = redis
        .subscribe(SubscribeOptions::new("restart.jobs").queue_group("workers"))
        .await
        .unwrap();
    for i in 0..20 {
        redis
            .publish_message("restart.jobs", Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    let mut acked = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let d = within(10, "an entry before the restart", sub.next())
            .await
            .unwrap();
        acked.insert(text(d.envelope()));
        d.ack().await.unwrap();
    }
    let in_hand = within(10, "the entry in hand", sub.next()).await.unwrap();
    let in_hand_text = text(in_hand.envelope());

    server.restart().await;
    drop(in_hand); // unsettled across the restart: claimed after claim_idle

    let mut seen = std::collections::BTreeSet::new();
    while acked.len() + seen.len() < 20 {
        let d = within(30, "the rest after the restart", sub.next())
            .await
            .unwrap();
        let t = text(d.envelope());
        // An ack the reconnecting connection loses leaves the entry pending:
        // it is claimed again and counted then.
        if d.ack().await.is_ok() && !acked.contains(&t) {
            seen.insert(t);
        }
    }
    assert!(
        seen.contains(&in_hand_text),
        "the unsettled entry came back"
    );
    let all: std::collections::BTreeSet<String> = acked.union(&seen).cloned().collect();
    assert_eq!(all.len(), 20, "no entry lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_receive_flow_issues_no_read() {
    let stream = unique("flow.");
    let redis = redis_at(&url()).await;
    let mut sub = redis
        .subscribe(
            SubscribeOptions::new(stream.as_str())
                .queue_group("svc")
                .receive_flow(true),
        )
        .await
        .unwrap();
    let flow = sub.receive_flow().expect("a request/reply source");
    flow.set_paused(true);
    redis
        .publish_message(&stream, Message::new("held"), None)
        .await
        .unwrap();
    let reader = tokio::spawn(async move {
        let d = sub.next().await.unwrap();
        let t = text(d.envelope());
        d.ack().await.unwrap();
        t
    });
    // Paused: the entry stays in the stream, never read by the group.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let groups: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(groups.groups[0].pending, 0, "nothing read while paused");
    assert!(!reader.is_finished());
    flow.set_paused(false);
    assert_eq!(
        within(5, "the entry after resume", reader).await.unwrap(),
        "held"
    );
    delete_keys(&url(), &stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_never_exceeds_the_permits_held() {
    const M: usize = 5;
    const IN_FLIGHT: usize = 2;
    const N: u32 = 200;
    let stream = unique("count.");
    // Reads could ask for 100 records; the permits say otherwise.
    let redis = quick().read_count(100).connect(&url()).await.unwrap();
    let blocked = Blocked::new(
        ruststream::subscriber::SubscriberConfig::new(stream.as_str())
            .queue_group("counted")
            .receive_flow(false)
            .workers_by_key(2),
    );
    let (gate, done) = (
        std::sync::Arc::clone(&blocked.gate),
        std::sync::Arc::clone(&blocked.done),
    );
    let running = ruststream::App::new()
        .broker(redis.clone())
        .job_queue(ruststream::ingress::JobQueueSettings::default().max_queued_jobs(M))
        .subscriber(blocked)
        .start()
        .await
        .unwrap();
    for i in 0..N {
        let message = Message::new(i.to_string()).with_key(format!("k{}", i % 2));
        redis.publish_message(&stream, message, None).await.unwrap();
    }
    until(10, "the app is saturated", || {
        let p = running.pressure();
        p.in_use == M && p.waiters == 1
    })
    .await;
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let groups: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Beyond one entry per permit held and the ones running, the loop waits
    // for one entry of its own read-ahead, taken without a permit.
    let delivered = groups.groups[0].pending;
    const READ_AHEAD: usize = 1;
    assert!(
        delivered <= M + IN_FLIGHT + READ_AHEAD,
        "Redis delivered {delivered} entries to an app that holds {M} permits and runs {IN_FLIGHT}"
    );
    gate.open();
    until(20, "every entry handled", || {
        done.load(Ordering::SeqCst) == N
    })
    .await;
    running.shutdown().await.unwrap();
    delete_keys(&url(), &stream).await;
}

#[ruststream::subscriber("rs_test.redis.double", queue_group = "math")]
async fn double(n: u64) -> Result<u64, ruststream::HandlerError> {
    if n == 0 {
        return Err(ruststream::HandlerError::reject("zero is not allowed"));
    }
    Ok(n * 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_serves_requests_over_redis() {
    let redis = redis_at(&url()).await;
    let running = ruststream::App::new()
        .broker(redis.clone())
        .subscriber(double)
        .start()
        .await
        .unwrap();
    let client = ruststream::Publisher::new(redis.clone());
    let four: u64 = client
        .request("rs_test.redis.double", &2u64, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(four, 4);
    let refused = client
        .request::<_, u64>("rs_test.redis.double", &0u64, Duration::from_secs(5))
        .await;
    assert!(
        matches!(refused, Err(ruststream::Error::Handler(_))),
        "{refused:?}"
    );
    running.shutdown().await.unwrap();
    delete_keys(&url(), "rs_test.redis.double").await;
}

/// What the batch handler below saw, in order.
#[derive(Clone, Default)]
struct Batches(std::sync::Arc<std::sync::Mutex<Vec<Vec<u32>>>>);

#[ruststream::subscriber("rs_test.redis.batch", queue_group = "batchers", batch(max = 50))]
async fn batched(
    numbers: Vec<u32>,
    seen: ruststream::State<Batches>,
) -> Result<(), ruststream::HandlerError> {
    let first_call = {
        let mut batches = seen.0.0.lock().unwrap();
        batches.push(numbers.clone());
        batches.len() == 1
    };
    if first_call {
        return Err(ruststream::HandlerError::retry("first batch fails"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handler_takes_a_backlog_in_batches_and_its_failed_batch_comes_back() {
    const N: u32 = 200;
    delete_keys(&url(), "rs_test.redis.batch").await;
    let redis = redis_at(&url()).await;
    // The group is made by the first subscription: start, stop (which
    // closes that app's connection), publish the backlog, start again.
    let seen = Batches::default();
    let app = |broker: RedisBroker| {
        ruststream::App::new()
            .broker(broker)
            .state(seen.clone())
            .subscriber(batched)
    };
    let first = app(redis_at(&url()).await).start().await.unwrap();
    first.shutdown().await.unwrap();
    for n in 0..N {
        redis
            .publish_message("rs_test.redis.batch", Message::new(n.to_string()), None)
            .await
            .unwrap();
    }
    let running = app(redis_at(&url()).await).start().await.unwrap();
    let handled = || {
        let batches = seen.0.lock().unwrap();
        let mut all: Vec<u32> = batches[1.min(batches.len())..].concat();
        all.sort_unstable();
        all.dedup();
        all.len() as u32
    };
    until(20, "every record handled by a successful batch", || {
        handled() == N
    })
    .await;
    running.shutdown().await.unwrap();
    let batches = seen.0.lock().unwrap().clone();
    assert!(batches.iter().all(|b| b.len() <= 50), "max 50 per batch");
    assert!(
        batches.iter().any(|b| b.len() > 1),
        "a backlog is handed over in batches: {:?}",
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    // The first batch failed: its records came back and were handled again.
    let retried = &batches[0];
    let later: Vec<u32> = batches[1..].concat();
    assert!(
        retried.iter().all(|n| later.contains(n)),
        "{retried:?} redelivered"
    );
    // Every entry was acked: nothing stays pending in the group.
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let groups: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg("rs_test.redis.batch")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(groups.groups[0].pending, 0, "every record acked");
    delete_keys(&url(), "rs_test.redis.batch").await;
}

/// A graceful stop with entries still unread or read ahead (RT-9): the
/// next app gets exactly the entries the first one did not handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_stream_acks_everything_it_handled() {
    let subject = unique("stop.mid");
    let config =
        ruststream::subscriber::SubscriberConfig::new(subject.as_str()).queue_group("stoppers");
    let publisher = redis_at(&url()).await;
    common::faults::stopped_mid_stream(|| async { redis_at(&url()).await }, &publisher, config, 60)
        .await;
    publisher.close().await.unwrap();
    delete_keys(&url(), &subject).await;
}

/// The same on `threads(4)`: dedicated threads claim what the last read
/// brought in place, and a graceful stop still acks everything they handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_stream_on_dedicated_threads_acks_everything_it_handled() {
    let subject = unique("stop.threads");
    let config = ruststream::subscriber::SubscriberConfig::new(subject.as_str())
        .queue_group("stoppers")
        .threads(4);
    let publisher = redis_at(&url()).await;
    common::faults::stopped_mid_stream(|| async { redis_at(&url()).await }, &publisher, config, 60)
        .await;
    publisher.close().await.unwrap();
    delete_keys(&url(), &subject).await;
}
