//! Faults on Redis Streams, each on a redis-server of the test's own (a free
//! loopback port, append-only file with `appendfsync always`, stopped by
//! its pid): the server killed and restarted mid-stream, the app process
//! killed with entries in flight, a crashed consumer's backlog taken over
//! at read speed, poison written with a raw client, and a handler that
//! aborts its process every time (a crash loop).
//!
//! JQ-13: no garbage reaches a handler; every poison entry ends in the
//! dead-letter stream with its reason, and the entries around it are
//! handled.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::faults::{self, AppProcess, AppSpec, job};
use common::server::OwnServer;
use common::{counter, install_metrics, within};
use redis::Value;
use ruststream::redis::RedisBroker;
use ruststream::{Broker, Message, SubscriberConfig, header, metrics};
use tokio::sync::mpsc::unbounded_channel;

const CLAIM_IDLE: Duration = Duration::from_millis(500);

/// A redis-server of the test's own whose stream survives `kill -9`.
async fn own_redis() -> OwnServer {
    OwnServer::start(
        "redis-server",
        &[
            "--bind",
            "127.0.0.1",
            "--port",
            "{port}",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--dir",
        ],
    )
    .await
}

fn url(server: &OwnServer) -> String {
    format!("redis://127.0.0.1:{}", server.port)
}

async fn broker(url: &str) -> RedisBroker {
    RedisBroker::builder()
        .claim_idle(CLAIM_IDLE)
        .block(Duration::from_millis(100))
        .connect(url)
        .await
        .unwrap()
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The app the tests run as a process of their own (see `common::faults`).
#[test]
#[ignore = "the app process of the fault tests, run by them"]
fn app_process() {
    if let Some(spec) = AppSpec::from_env() {
        spec.serve(|| broker(&spec.url));
    }
}

/// A `kill -9` of the server mid-stream, publishes going on: every job
/// whose publish succeeded is handled at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_and_restarted_mid_stream_loses_no_job() {
    const N: usize = 200;
    let mut server = own_redis().await;
    let redis = broker(&url(&server)).await;
    let (seen_tx, mut seen) = unbounded_channel();
    let running = faults::start_app(
        redis.clone(),
        SubscriberConfig::new("jobs").queue_group("workers"),
        seen_tx,
    )
    .await;
    let publisher = tokio::spawn({
        let redis = redis.clone();
        async move {
            for i in 0..N {
                // A publish that fails is sent again: it may have been
                // stored before the failure, and then counts twice.
                while redis
                    .publish_message("jobs", Message::new(job(&i.to_string())), None)
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    while runs.len() < N / 4 {
        let (id, _) = within(10, "jobs before the kill", seen.recv())
            .await
            .unwrap();
        *runs.entry(id).or_default() += 1;
    }
    server.restart().await;
    within(60, "every publish", publisher).await.unwrap();
    while runs.len() < N {
        let (id, _) = within(30, "every job after the restart", seen.recv())
            .await
            .unwrap();
        *runs.entry(id).or_default() += 1;
    }
    let duplicates: usize = runs.values().map(|n| n - 1).sum();
    eprintln!("redis kill -9 mid-stream: {N} jobs handled, {duplicates} handled twice or more");
    running.shutdown().await.unwrap();
}

/// The app process is killed with a job in its handler and more read
/// ahead; the next instance claims them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_killed_with_jobs_in_flight_leaves_them_to_the_next_instance() {
    const N: usize = 20;
    let server = own_redis().await;
    let url = url(&server);
    let redis = broker(&url).await;
    // The jobs wait in the stream, so the first read takes them all.
    create_group(&url, "inflight").await;
    for i in 0..N {
        redis
            .publish_message("inflight", Message::new(job(&i.to_string())), None)
            .await
            .unwrap();
    }
    let mut spec = AppSpec::new(&url, "inflight", "workers");
    spec.hold = true;
    let mut first = AppProcess::start(&spec).await;
    first.expect("handling 0 1", 10).await;
    let in_flight = pending(&url, "inflight", "workers").await;
    assert!(in_flight > 1, "jobs read ahead are in flight: {in_flight}");
    first.kill().await;

    spec.hold = false;
    let mut second = AppProcess::start(&spec).await;
    let mut handled = BTreeSet::new();
    while handled.len() < N {
        let line = second.expect("handled ", 30).await;
        handled.insert(line["handled ".len()..].to_owned());
    }
    eprintln!("{in_flight} jobs were in flight when the first app was killed");
    second.kill().await;
}

/// The `workers` group on `stream`, reading from the stream's end.
async fn create_group(url: &str, stream: &str) {
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("workers")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut raw(url).await)
        .await
        .unwrap();
}

/// Entries of the group not yet acked.
async fn pending(url: &str, stream: &str, group: &str) -> usize {
    let reply: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(&mut raw(url).await)
        .await
        .unwrap();
    reply.count()
}

/// Hole 5: a consumer that crashed holding 1,000 entries. Claims continue
/// page after page at once, so the takeover takes well under the ~16 s that
/// one 32-entry page per `claim_idle / 2` would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_consumers_backlog_is_taken_over_at_read_speed() {
    const N: usize = 1000;
    let server = own_redis().await;
    let url = url(&server);
    create_group(&url, "backlog").await;
    let mut conn = raw(&url).await;
    let mut pipe = redis::pipe();
    for i in 0..N {
        pipe.cmd("XADD")
            .arg("backlog")
            .arg("*")
            .arg("p")
            .arg(job(&i.to_string()))
            .ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    // The consumer that crashed: it read everything and settled nothing.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("gone")
        .arg("COUNT")
        .arg(N)
        .arg("STREAMS")
        .arg("backlog")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let (seen_tx, mut seen) = unbounded_channel();
    let running = faults::start_app(
        broker(&url).await,
        SubscriberConfig::new("backlog").queue_group("workers"),
        seen_tx,
    )
    .await;
    let started = std::time::Instant::now();
    let runs = faults::handled(&mut seen, N, 10).await;
    let took = started.elapsed();
    assert_eq!(runs.len(), N, "every entry taken over once");
    assert!(runs.values().all(|attempts| attempts == &[2]));
    eprintln!("1,000 pending entries taken over in {took:?} (claim_idle {CLAIM_IDLE:?})");
    assert!(
        took < Duration::from_secs(5),
        "the takeover took {took:?}: claims do not continue"
    );
    running.shutdown().await.unwrap();
}

/// Poison written with a raw client between good entries, all read in one
/// `XREADGROUP`: no garbage reaches the handler, each poison entry is
/// dead-lettered with its reason, and the good entries are handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entries_are_dead_lettered_and_their_neighbours_handled() {
    install_metrics();
    let server = own_redis().await;
    let url = url(&server);
    // The group exists before the entries, so one read takes them all.
    create_group(&url, "poison").await;
    let mut conn = raw(&url).await;
    let xadd = |fields: Vec<(Vec<u8>, Vec<u8>)>| {
        let mut cmd = redis::cmd("XADD");
        cmd.arg("poison").arg("*");
        for (name, value) in fields {
            cmd.arg(name).arg(value);
        }
        cmd
    };
    let p = |payload: &[u8]| (b"p".to_vec(), payload.to_vec());
    let many_headers: Vec<(Vec<u8>, Vec<u8>)> = std::iter::once(p(&job("many-headers")))
        .chain((0..5000).map(|i| (format!("h:x-{i}").into_bytes(), b"0123456789".to_vec())))
        .collect();
    let entries = vec![
        vec![p(&job("good-1"))],
        vec![p(b"{not json")],
        vec![p(br#"{"name":"wrong shape"}"#)],
        vec![p(b"")],
        vec![p(&[b'x'; 70_000])],
        vec![
            p(&job("bad-value")),
            (b"h:x-bad".to_vec(), b"\xff\xfe".to_vec()),
        ],
        vec![(b"h:\xff\xfe".to_vec(), b"v".to_vec()), p(&job("bad-name"))],
        many_headers,
        vec![p(&job("good-2"))],
    ];
    let mut pipe = redis::pipe();
    for fields in entries {
        pipe.add_command(xadd(fields)).ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();

    let (seen_tx, mut seen) = unbounded_channel();
    let config = SubscriberConfig::new("poison")
        .queue_group("workers")
        .dead_letter("poison.dead")
        .max_message_size(64 * 1024);
    let running = faults::start_app(broker(&url).await, config, seen_tx).await;
    let runs = faults::handled(&mut seen, 3, 10).await;
    let handled: Vec<&str> = runs.keys().map(String::as_str).collect();
    assert_eq!(handled, ["bad-value", "good-1", "good-2"]);
    assert!(
        counter(metrics::UNREADABLE_HEADERS, "binding", "redis") >= 1,
        "the unreadable header value is counted"
    );

    let mut expected = vec![
        faults::Poison {
            name: "invalid JSON",
            reason: "key must be a string",
        },
        faults::Poison {
            name: "wrong shape",
            reason: "unknown field `name`",
        },
        faults::Poison {
            name: "empty body",
            reason: "EOF while parsing",
        },
        faults::Poison {
            name: "oversize body",
            reason: "exceeds max_message_size",
        },
        faults::Poison {
            name: "field name not UTF-8",
            reason: "is not valid UTF-8",
        },
        faults::Poison {
            name: "5,000 headers",
            reason: "exceeds max_message_size",
        },
    ];
    let dead = within(10, "six dead letters", async {
        loop {
            let dead = dead_letters(&url).await;
            if dead.len() >= 6 {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(dead.len(), 6, "one dead letter per poison entry");
    for fields in &dead {
        let get = |name: &str| {
            let name = format!("h:{name}");
            fields
                .iter()
                .find(|(n, _)| n == name.as_bytes())
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let env = ruststream::Envelope::new(
            "poison".into(),
            Message::new(Vec::new()).with_header(header::ERROR, get(header::ERROR).unwrap()),
        );
        assert_eq!(get(header::ORIGINAL_SUBJECT).as_deref(), Some("poison"));
        faults::dead_lettered(&mut expected, &env);
        if get(header::ERROR).unwrap().contains("UTF-8") {
            let id = get(header::ORIGINAL_ID).expect("the entry's id");
            assert!(
                get(header::ERROR).unwrap().contains(&id),
                "the reason names the entry"
            );
        }
    }
    assert_eq!(
        pending(&url, "poison", "workers").await,
        0,
        "nothing stranded"
    );
    running.shutdown().await.unwrap();
}

/// The dead-letter stream's entries, fields as bytes.
async fn dead_letters(url: &str) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let reply: Value = redis::cmd("XRANGE")
        .arg("poison.dead")
        .arg("-")
        .arg("+")
        .query_async(&mut raw(url).await)
        .await
        .unwrap();
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => b.clone(),
        _ => Vec::new(),
    };
    entries
        .iter()
        .filter_map(|entry| match entry {
            Value::Array(parts) => match parts.get(1) {
                Some(Value::Array(flat)) => Some(
                    flat.chunks(2)
                        .map(|pair| (bytes(&pair[0]), bytes(&pair[1])))
                        .collect(),
                ),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// A job whose handler aborts the process every time: each instance dies
/// on it, the next claims it with the delivery count one higher, and the
/// one that gets it past `max_attempts` dead-letters it before the handler
/// ("attempts exhausted"). The jobs around it are handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_ends_in_the_dead_letter_after_max_attempts() {
    let server = own_redis().await;
    let url = url(&server);
    let redis = broker(&url).await;
    let mut spec = AppSpec::new(&url, "crashes", "workers");
    spec.dead_letter = Some("crashes.dead".to_owned());
    spec.max_attempts = 3;
    let mut app = AppProcess::start(&spec).await;
    for id in ["good-a", "crash-1", "good-b"] {
        redis
            .publish_message("crashes", Message::new(job(id)), None)
            .await
            .unwrap();
    }
    let mut crashes = 0;
    let mut handled = BTreeSet::new();
    // Each instance handles what it can, until it dies on the crash job or
    // the crash job reaches the dead letter.
    let dead = loop {
        let line = tokio::select! {
            line = app.expect("handl", 20) => line,
            dead = xrange_when_there(&url, "crashes.dead") => break dead,
        };
        match line.strip_prefix("handled ") {
            Some(id) => {
                handled.insert(id.to_owned());
            }
            None if line.starts_with("handling crash-1") => {
                crashes += 1;
                assert!(
                    app.aborted(10).await,
                    "{line}: the handler aborted the process"
                );
                assert!(crashes <= 3, "the crash loop went on past max_attempts");
                app = AppProcess::start(&spec).await;
            }
            None => {}
        }
    };
    assert_eq!(crashes, 3, "three runs, then the dead letter");
    assert!(dead.contains("attempts exhausted"), "{dead}");
    assert!(
        dead.contains("crash-1"),
        "the crash job is the dead letter: {dead}"
    );
    while handled.len() < 2 {
        let line = app.expect("handled ", 20).await;
        handled.insert(line["handled ".len()..].to_owned());
    }
    assert_eq!(
        handled,
        BTreeSet::from(["good-a".to_owned(), "good-b".to_owned()])
    );
    eprintln!("crash loop: {crashes} crashed instances, then the dead letter");
    app.kill().await;
}

/// The entries of `stream`, as text, once it has any.
async fn xrange_when_there(url: &str, stream: &str) -> String {
    let mut conn = raw(url).await;
    loop {
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        if !matches!(&reply, Value::Array(entries) if entries.is_empty()) {
            return String::from_utf8_lossy(&format!("{reply:?}").into_bytes()).into_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
