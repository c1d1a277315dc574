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

use std::time::Duration;

use common::faults::{self, AppSpec, job};
use common::server::OwnServer;
use common::{counter, install_metrics, within};
use redis::Value;
use ruststream::redis::RedisBroker;
use ruststream::subscriber::SubscriberConfig;
use ruststream::{Broker, Message, header, metrics};
use tokio::sync::mpsc::unbounded_channel;

const CLAIM_IDLE: Duration = Duration::from_millis(500);

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
    let mut server = OwnServer::redis().await;
    let redis = broker(&url(&server)).await;
    let run = faults::restart_mid_stream(redis, "jobs", 200, server.restart()).await;
    eprintln!(
        "redis kill -9 mid-stream: 200 jobs handled, {} handled twice or more, all {:?} after \
         the server was back",
        run.duplicates, run.recovered
    );
}

/// The app process is killed with jobs in its handlers and more read
/// ahead; the next instance claims them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_killed_with_jobs_in_flight_leaves_them_to_the_next_instance() {
    let server = OwnServer::redis().await;
    let url = url(&server);
    let redis = broker(&url).await;
    // The jobs wait in the stream, so the first read takes them all.
    create_group(&url, "inflight").await;
    let spec = AppSpec::new(&url, "inflight", "workers");
    faults::killed_in_flight(spec, 20, true, |i| {
        let redis = redis.clone();
        async move {
            let message = Message::new(job(&i.to_string()));
            redis
                .publish_message("inflight", message, None)
                .await
                .unwrap();
        }
    })
    .await;
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
    let server = OwnServer::redis().await;
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
    let server = OwnServer::redis().await;
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
        .chain((0..3000).map(|i| (format!("h:x-{i}").into_bytes(), b"0123456789".to_vec())))
        .collect();
    let mut expected = Vec::new();
    let mut entries = vec![vec![p(&job("good-1"))]];
    for (payload, poison) in faults::poison_payloads() {
        entries.push(vec![p(&payload)]);
        expected.push(poison);
    }
    entries.extend([
        vec![
            p(&job("bad-value")),
            (b"h:x-bad".to_vec(), b"\xff\xfe".to_vec()),
        ],
        vec![(b"h:\xff\xfe".to_vec(), b"v".to_vec()), p(&job("bad-name"))],
        many_headers,
        vec![p(&job("good-2"))],
    ]);
    expected.push(faults::Poison {
        name: "field name not UTF-8",
        reason: "is not valid UTF-8",
    });
    expected.push(faults::many_headers());
    let mut pipe = redis::pipe();
    for fields in entries {
        pipe.add_command(xadd(fields)).ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();

    let (seen_tx, mut seen) = unbounded_channel();
    let config = SubscriberConfig::new("poison")
        .queue_group("workers")
        .dead_letter("poison.dead")
        .max_message_size(32 * 1024);
    let running = faults::start_app(broker(&url).await, config, seen_tx).await;
    let runs = faults::handled(&mut seen, 3, 10).await;
    let handled: Vec<&str> = runs.keys().map(String::as_str).collect();
    assert_eq!(handled, ["bad-value", "good-1", "good-2"]);
    assert!(
        counter(metrics::UNREADABLE_HEADERS, "binding", "redis") >= 1,
        "the unreadable header value is counted"
    );

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

/// JQ-13: a request whose entry no handler can be given (a field name that
/// is not UTF-8, written with a raw client) gets a protocol error on its
/// reply channel, with its correlation id, rather than waiting out its
/// timeout; the entry is dead-lettered like any poison entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_the_handler_gets_a_protocol_error() {
    use futures_util::StreamExt;
    let server = OwnServer::redis().await;
    let url = url(&server);
    create_group(&url, "poison-request").await;
    // The caller's side: a reply channel of the kind a requester listens on.
    let reply_to = "_rs.inbox.test.1";
    let mut caller = redis::Client::open(url.as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    caller.subscribe(reply_to).await.unwrap();
    let mut replies = caller.on_message();
    let _: String = redis::cmd("XADD")
        .arg("poison-request")
        .arg("*")
        .arg("p")
        .arg(job("asks"))
        .arg("r")
        .arg(reply_to)
        .arg("c")
        .arg("corr-7")
        .arg(b"h:\xff".as_slice())
        .arg("v")
        .query_async(&mut raw(&url).await)
        .await
        .unwrap();
    let (seen_tx, _seen) = unbounded_channel();
    let config = SubscriberConfig::new("poison-request")
        .queue_group("workers")
        .dead_letter("poison.dead");
    let running = faults::start_app(broker(&url).await, config, seen_tx).await;
    let reply = within(10, "the refusal on the reply channel", replies.next())
        .await
        .expect("the reply channel is open");
    let frame = reply.get_payload_bytes();
    let has = |text: &str| frame.windows(text.len()).any(|w| w == text.as_bytes());
    assert!(
        has("protocol-error"),
        "a protocol error: {}",
        frame.escape_ascii()
    );
    assert!(
        has("is not valid UTF-8"),
        "with the reason: {}",
        frame.escape_ascii()
    );
    assert!(
        has("corr-7"),
        "and the request's correlation id: {}",
        frame.escape_ascii()
    );
    let dead = within(10, "the dead letter", async {
        loop {
            let dead = dead_letters(&url).await;
            if !dead.is_empty() {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(dead.len(), 1);
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
    entries(reply)
}

/// The entries of an `XRANGE` reply, fields as bytes.
fn entries(reply: Value) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
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
    let server = OwnServer::redis().await;
    let url = url(&server);
    let redis = broker(&url).await;
    let mut spec = AppSpec::new(&url, "crashes", "workers");
    spec.dead_letter = Some("crashes.dead".to_owned());
    let publish = || async {
        for id in ["good-a", "crash-1", "good-b"] {
            let message = Message::new(job(id));
            redis
                .publish_message("crashes", message, None)
                .await
                .unwrap();
        }
    };
    let (letters, mut dead) = unbounded_channel();
    tokio::spawn(forward_dead_letters(url.clone(), "crashes.dead", letters));
    let reason = faults::crash_loop(&spec, publish, &mut dead).await;
    assert!(reason.contains("attempts exhausted"), "{reason}");
}

/// Sends the payload and reason of every entry of `stream`, as it comes.
async fn forward_dead_letters(
    url: String,
    stream: &'static str,
    letters: tokio::sync::mpsc::UnboundedSender<(Vec<u8>, String)>,
) {
    let mut conn = raw(&url).await;
    let mut sent = 0;
    while !letters.is_closed() {
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap_or(Value::Nil);
        for fields in entries(reply).into_iter().skip(sent) {
            let get = |name: &str| {
                let value = fields.iter().find(|(n, _)| n == name.as_bytes());
                value.map(|(_, v)| v.clone()).unwrap_or_default()
            };
            let reason = String::from_utf8_lossy(&get(&format!("h:{}", header::ERROR))).into();
            let _ = letters.send((get("p"), reason));
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
