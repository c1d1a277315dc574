//! Faults on NATS JetStream, each on a nats-server of the test's own (a
//! free loopback port, file storage, stopped by its pid): the server killed
//! and restarted mid-stream, the app process killed with messages in
//! flight, a queue group's durable consumer across a downtime (with a short
//! threshold of the user's, and with none), poison published with raw
//! clients — a header that is not UTF-8 among it, which the NATS client
//! cannot receive — and a handler that aborts its process every time.
//!
//! JQ-13: no garbage reaches a handler; every poison message ends in the
//! dead-letter subject with its reason, and the messages around it are
//! handled.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use common::faults::{self, AppSpec, job};
use common::server::OwnServer;
use common::{install_metrics, within};
use futures_util::StreamExt;
use ruststream::nats::{JetStream, NatsBroker, StreamSpec};
use ruststream::subscriber::SubscriberConfig;
use ruststream::{Broker, Delivery, Envelope, Message, Subscription, header};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

const ACK_WAIT: Duration = Duration::from_secs(1);

fn url(server: &OwnServer) -> String {
    format!("nats://127.0.0.1:{}", server.port)
}

/// Stream `JOBS` on `jobs.>`, with quick redelivery.
fn spec() -> StreamSpec {
    StreamSpec::new("JOBS", ["jobs.>"])
        .ack_wait(ACK_WAIT)
        .pull_expires(Duration::from_millis(500))
}

async fn jetstream(url: &str, spec: StreamSpec) -> JetStream {
    NatsBroker::connect(url)
        .await
        .unwrap()
        .jetstream(spec)
        .await
        .unwrap()
}

/// The app the tests run as a process of their own (see `common::faults`).
#[test]
#[ignore = "the app process of the fault tests, run by them"]
fn app_process() {
    if let Some(app) = AppSpec::from_env() {
        app.serve(|| jetstream(&app.url, spec()));
    }
}

/// A `kill -9` of the server mid-stream, publishes going on: every job
/// whose publish was acknowledged is handled at least once, and the
/// subscription resumes as soon as the client is back (it does not wait
/// for its lost pull to expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_server_killed_and_restarted_mid_stream_loses_no_job() {
    let mut server = OwnServer::nats().await;
    // Pulls that stay open 5 s: the resume must not wait for them.
    let js = jetstream(&url(&server), spec().pull_expires(Duration::from_secs(5))).await;
    let run = faults::restart_mid_stream(js, "jobs.restart", 200, server.restart()).await;
    eprintln!(
        "jetstream kill -9 mid-stream: 200 jobs handled, {} handled twice or more; consumption \
         resumed {:?} after the server was back (pull_expires 5 s), all handled after {:?}",
        run.duplicates, run.resumed, run.recovered
    );
    assert!(
        run.resumed < Duration::from_secs(4),
        "resumed only after {:?}: the lost pull was waited out",
        run.resumed
    );
}

/// The app process is killed with jobs in its handlers and more pulled;
/// the next instance gets them all after `ack_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_killed_with_jobs_in_flight_leaves_them_to_the_next_instance() {
    let server = OwnServer::nats().await;
    let url = url(&server);
    let js = jetstream(&url, spec()).await;
    let spec = AppSpec::new(&url, "jobs.inflight", "workers");
    faults::killed_in_flight(spec, 20, false, |i| {
        let js = js.clone();
        async move {
            let message = Message::new(job(&i.to_string()));
            js.publish_message("jobs.inflight", message, None)
                .await
                .unwrap();
        }
    })
    .await;
}

/// The durable consumer of a queue group outlives a downtime of every
/// member. By default nothing deletes it (no inactivity threshold), and
/// the next member goes on where the group stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_outlives_any_downtime_by_default() {
    let server = OwnServer::nats().await;
    let url = url(&server);
    let js = jetstream(&url, spec()).await;
    let consumed = consume_and_stop(&url, (spec(), false), "jobs.durable", 0..10).await;
    assert_eq!(consumed, (0..10).map(|i| i.to_string()).collect());
    let info = consumer_info(&js, "workers").await.expect("the durable");
    assert_eq!(
        info.config.inactive_threshold,
        Duration::ZERO,
        "no threshold applies"
    );
    // A downtime longer than the old 5 min threshold is not waited out
    // here: with no threshold, the server has nothing to delete it by.
    let after = consume_and_stop(&url, (spec(), false), "jobs.durable", 10..15).await;
    assert_eq!(
        after,
        (10..15).map(|i| i.to_string()).collect(),
        "only what came since: nothing acked is handed out again"
    );
}

/// With a threshold of the user's (1 s here), the server deletes the
/// durable after a longer downtime. The next member recreates it from the
/// checkpointed ack floor: the acked history is not handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_deleted_after_its_threshold_is_recreated_where_the_group_was() {
    let server = OwnServer::nats().await;
    let url = url(&server);
    let spec = spec().inactive_threshold(Duration::from_secs(1));
    let js = jetstream(&url, spec.clone()).await;
    consume_and_stop(&url, (spec.clone(), true), "jobs.threshold", 0..10).await;
    within(20, "the server deletes the idle durable", async {
        while consumer_info(&js, "workers").await.is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let after = consume_and_stop(&url, (spec, true), "jobs.threshold", 10..15).await;
    assert_eq!(
        after,
        (10..15).map(|i| i.to_string()).collect(),
        "only what came since: nothing acked is handed out again"
    );
}

/// A stream deleted and made again under the same name starts over: the
/// old stream's checkpoint does not make its group skip the new messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_made_again_is_read_from_its_start() {
    let server = OwnServer::nats().await;
    let url = url(&server);
    let spec = spec().inactive_threshold(Duration::from_secs(1));
    consume_and_stop(&url, (spec.clone(), true), "jobs.again", 0..10).await;
    jetstream(&url, spec.clone())
        .await
        .delete_stream()
        .await
        .unwrap();
    let again = consume_and_stop(&url, (spec, false), "jobs.again", 0..3).await;
    assert_eq!(again, (0..3).map(|i| i.to_string()).collect());
}

/// Publishes jobs `ids`, runs a member of group `workers` (on a
/// connection of its own, which it closes) until it has handled them and
/// the durable's ack floor is past them — and checkpointed, if asked —
/// then stops it. Returns every job it handled.
async fn consume_and_stop(
    url: &str,
    (spec, checkpointed): (StreamSpec, bool),
    subject: &str,
    ids: std::ops::Range<usize>,
) -> BTreeSet<String> {
    let js = &jetstream(url, spec).await;
    let (seen_tx, mut seen) = unbounded_channel();
    let running = faults::start_app(
        js.clone(),
        SubscriberConfig::new(subject).queue_group("workers"),
        seen_tx,
    )
    .await;
    let (count, last) = (ids.len(), ids.end as u64);
    for i in ids {
        js.publish_message(subject, Message::new(job(&i.to_string())), None)
            .await
            .unwrap();
    }
    let runs = faults::handled(&mut seen, count, 10).await;
    // Acked and checkpointed: the ack floor is recorded past them.
    within(10, "the ack floor checkpointed", async {
        loop {
            let floor = consumer_info(js, "workers")
                .await
                .map_or(0, |i| i.ack_floor.stream_sequence);
            // Job i is the stream's message i + 1.
            if floor >= last && (!checkpointed || checkpoint(js).await >= Some(floor)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    running.shutdown().await.unwrap();
    tokio::time::sleep(faults::QUIET).await;
    assert!(seen.try_recv().is_err(), "nothing handed out twice");
    runs.into_keys().collect()
}

async fn consumer_info(
    js: &JetStream,
    name: &str,
) -> Option<async_nats::jetstream::consumer::Info> {
    let stream = js.context().get_stream("JOBS").await.unwrap();
    stream.consumer_info(name).await.ok()
}

/// The durable's last checkpointed ack floor.
async fn checkpoint(js: &JetStream) -> Option<u64> {
    let stream = js.context().get_stream("RUSTSTREAM_DURABLES").await.ok()?;
    let last = stream
        .get_last_raw_message_by_subject("$RS.DURABLES.JOBS.workers")
        .await
        .ok()?;
    let text = String::from_utf8(last.payload.to_vec()).ok()?;
    text.split(' ').next()?.parse().ok()
}

/// A raw `HPUB` on a connection of its own (async-nats refuses to send
/// such headers), acknowledged by a `PONG`.
fn raw_hpub(port: u16, subject: &str, headers: &[u8], payload: &[u8]) {
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut reader = BufReader::new(tcp.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap(); // INFO
    let mut head = b"NATS/1.0\r\n".to_vec();
    head.extend_from_slice(headers);
    head.extend_from_slice(b"\r\n");
    let mut frame = format!(
        "CONNECT {{\"verbose\":false,\"headers\":true}}\r\nHPUB {subject} {} {}\r\n",
        head.len(),
        head.len() + payload.len()
    )
    .into_bytes();
    frame.extend_from_slice(&head);
    frame.extend_from_slice(payload);
    frame.extend_from_slice(b"\r\nPING\r\n");
    tcp.write_all(&frame).unwrap();
    line.clear();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "PONG", "the server took the raw publish");
}

/// Poison published with raw clients between good messages: no garbage
/// reaches the handler, each poison message is dead-lettered with its
/// reason, and the good ones are handled. A header that is not UTF-8 (or
/// a header name that is not ASCII) makes async-nats drop the whole
/// connection every time the message is delivered; the server gives up on
/// it after `max_attempts + 1` deliveries and its advisory gets it
/// dead-lettered, read raw by its sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_and_their_neighbours_handled() {
    install_metrics();
    let server = OwnServer::nats().await;
    let url = url(&server);
    let js = jetstream(&url, spec()).await;
    let client = async_nats::connect(&url).await.unwrap();
    let mut dead = client.subscribe("dead.jobs").await.unwrap();
    client.flush().await.unwrap();
    let (seen_tx, mut seen) = unbounded_channel();
    let config = SubscriberConfig::new("jobs.poison")
        .queue_group("workers")
        .dead_letter("dead.jobs")
        .max_attempts(2)
        .max_message_size(32 * 1024);
    let running = faults::start_app(js.clone(), config, seen_tx).await;

    let publish = |payload: Vec<u8>| {
        let js = js.clone();
        async move {
            js.publish_message("jobs.poison", Message::new(payload), None)
                .await
                .unwrap()
        }
    };
    let mut expected = Vec::new();
    publish(job("good-1")).await;
    for (payload, poison) in faults::poison_payloads() {
        publish(payload).await;
        expected.push(poison);
    }
    raw_hpub(
        server.port,
        "jobs.poison",
        b"X-Bad: \xff\xfe\r\n",
        &job("bad-value"),
    );
    raw_hpub(
        server.port,
        "jobs.poison",
        "X-Ünï: v\r\n".as_bytes(),
        &job("bad-name"),
    );
    for name in ["header value not UTF-8", "header name not ASCII"] {
        let reason = "malformed headers";
        expected.push(faults::Poison { name, reason });
    }
    let mut many = Message::new(job("many-headers"));
    // Under JetStream's own 64 KiB header limit, over the subscriber's
    // max_message_size.
    for i in 0..3000 {
        many = many.with_header(format!("x-{i}"), "0123456789");
    }
    js.publish_message("jobs.poison", many, None).await.unwrap();
    expected.push(faults::many_headers());
    publish(job("good-2")).await;

    let started = std::time::Instant::now();
    while !expected.is_empty() {
        let letter = within(30, "the dead letters", dead.next()).await.unwrap();
        let headers = letter.headers.clone().unwrap_or_default();
        let mut message = Message::new(letter.payload.clone());
        for (name, values) in headers.iter() {
            message = message.with_header(name.as_ref() as &str, values[0].as_str());
        }
        let env = Envelope::new("dead.jobs".into(), message);
        if env
            .headers()
            .get(header::ERROR)
            .unwrap_or("")
            .contains("malformed headers")
        {
            assert!(
                env.headers().get(header::ORIGINAL_ID).is_some(),
                "its sequence"
            );
            assert_eq!(
                env.headers().get(header::ORIGINAL_SUBJECT),
                Some("jobs.poison")
            );
        }
        faults::dead_lettered(&mut expected, &env);
    }
    eprintln!(
        "every poison message dead-lettered after {:?}",
        started.elapsed()
    );
    let runs = faults::handled(&mut seen, 2, 10).await;
    let handled: Vec<&str> = runs.keys().map(String::as_str).collect();
    assert_eq!(handled, ["good-1", "good-2"]);
    tokio::time::sleep(faults::QUIET).await;
    assert!(seen.try_recv().is_err(), "the handler saw nothing else");
    running.shutdown().await.unwrap();
}

/// A job whose handler aborts the process every time: each instance dies
/// on it, and the one that gets it past `max_attempts` dead-letters it
/// before the handler ("attempts exhausted"). The jobs around it are
/// handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_ends_in_the_dead_letter_after_max_attempts() {
    let server = OwnServer::nats().await;
    let url = url(&server);
    let js = jetstream(&url, spec()).await;
    let mut spec = AppSpec::new(&url, "jobs.crashes", "workers");
    spec.dead_letter = Some("dead.crashes".to_owned());
    let mut dead = dead_letters(&url, "dead.crashes").await;
    let publish = || async {
        for id in ["good-a", "crash-1", "good-b"] {
            let message = Message::new(job(id));
            js.publish_message("jobs.crashes", message, None)
                .await
                .unwrap();
        }
    };
    let reason = faults::crash_loop(&spec, publish, &mut dead).await;
    assert!(reason.contains("attempts exhausted"), "{reason}");
}

/// The payload and reason of every message on `subject`, from a raw client.
async fn dead_letters(url: &str, subject: &str) -> UnboundedReceiver<(Vec<u8>, String)> {
    let client = async_nats::connect(url).await.unwrap();
    let mut dead = client.subscribe(subject.to_owned()).await.unwrap();
    client.flush().await.unwrap();
    let (letters, rx) = unbounded_channel();
    tokio::spawn(async move {
        let _client = client;
        while let Some(letter) = dead.next().await {
            let reason = letter.headers.as_ref().and_then(|h| h.get(header::ERROR));
            let reason = reason.map(|v| v.as_str().to_owned()).unwrap_or_default();
            if letters.send((letter.payload.to_vec(), reason)).is_err() {
                break;
            }
        }
    });
    rx
}

/// A message dropped unsettled when the shutdown timeout aborts its
/// handler comes back to the next instance with the attempt it is on (2),
/// not as a first delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_aborted_by_the_shutdown_timeout_comes_back_as_attempt_two() {
    let server = OwnServer::nats().await;
    let url = url(&server);
    let js = jetstream(&url, spec()).await;
    let config = SubscriberConfig::new("jobs.aborted").queue_group("workers");
    let first = ruststream::App::new()
        .broker(jetstream(&url, spec()).await)
        .shutdown_timeout(Duration::from_millis(100))
        .subscriber(faults::Recorder {
            config: config.clone(),
            behaviour: faults::Behaviour::Hold,
            seen: Some(unbounded_channel().0),
        })
        .start()
        .await
        .unwrap();
    js.publish_message("jobs.aborted", Message::new(job("held")), None)
        .await
        .unwrap();
    within(10, "the first run", async {
        while consumer_info(&js, "workers")
            .await
            .is_none_or(|i| i.num_ack_pending == 0)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    first.shutdown().await.unwrap();
    let (seen_tx, mut seen) = unbounded_channel();
    let second = faults::start_app(js.clone(), config, seen_tx).await;
    let runs = faults::handled(&mut seen, 1, 10).await;
    assert_eq!(runs["held"], [2], "the second delivery is attempt 2");
    second.shutdown().await.unwrap();
}

/// A core publish waits for room in the client's write buffer until its
/// deadline, then fails with `DeadlineExceeded` (JQ-18): given explicitly,
/// and the builder's publish timeout, counted from when the buffer is
/// found full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_publish_to_a_frozen_server_ends_at_its_deadline() {
    let server = OwnServer::nats().await;
    let nats = NatsBroker::builder()
        .publish_timeout(Duration::from_millis(300))
        .connect(&url(&server))
        .await
        .unwrap();
    server.freeze(true);
    let payload = vec![b'x'; 60 * 1024];
    // Fill the socket and the client's buffers until a publish has to wait.
    let result = within(60, "a publish that waits for room", async {
        loop {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
            let message = Message::new(payload.clone());
            if let Err(err) = nats
                .publish_message("frozen.a", message, Some(deadline))
                .await
            {
                return err;
            }
        }
    })
    .await;
    assert!(result.is_deadline(), "{result}");
    // The builder's timeout, for a publish without a deadline of its own.
    let started = tokio::time::Instant::now();
    let err = within(10, "the default timeout", async {
        nats.publish_message("frozen.a", Message::new(payload.clone()), None)
            .await
            .unwrap_err()
    })
    .await;
    assert!(err.is_deadline(), "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    server.freeze(false);
}

/// A core publish that had to wait for room goes out once, in its place,
/// when room comes: the server frozen until a publish waits, then thawed;
/// a subscriber gets every message exactly once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_publish_that_waited_for_room_goes_out_once_in_order() {
    let server = OwnServer::nats().await;
    let nats = NatsBroker::connect(&url(&server)).await.unwrap();
    let mut sub = nats
        .subscribe(ruststream::SubscribeOptions::new("frozen.order"))
        .await
        .unwrap();
    nats.client().flush().await.unwrap();
    let (seen_tx, mut seen_rx) = unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Some(delivery) = sub.next().await {
            let n: u64 = std::str::from_utf8(&delivery.envelope().payload()[..8])
                .unwrap()
                .parse()
                .unwrap();
            seen_tx.send(n).unwrap();
            delivery.ack().await.unwrap();
        }
    });
    server.freeze(true);
    let message = |n: u64| {
        let mut payload = format!("{n:08}").into_bytes();
        payload.resize(4 * 1024, b'x');
        Message::new(payload)
    };
    // Publish until one has to wait; it stays pending while frozen.
    let mut n = 0;
    #[allow(clippy::async_yields_async)] // the pending publish, awaited below
    let waited = within(60, "a publish that waits for room", async {
        loop {
            let deadline = Some(tokio::time::Instant::now() + Duration::from_secs(60));
            let mut publish = Box::pin(nats.publish_message("frozen.order", message(n), deadline));
            if futures_util::poll!(publish.as_mut()).is_pending() {
                break publish;
            }
            n += 1;
            assert!(n < 100_000, "no publish had to wait for room");
            tokio::task::yield_now().await;
        }
    })
    .await;
    server.freeze(false);
    within(60, "the waiting publish", waited).await.unwrap();
    nats.publish_message("frozen.order", message(n + 1), None)
        .await
        .unwrap();
    nats.client().flush().await.unwrap();
    let mut got = Vec::new();
    within(60, "every message", async {
        while got.len() as u64 != n + 2 {
            got.push(seen_rx.recv().await.unwrap());
        }
    })
    .await;
    assert_eq!(got, (0..n + 2).collect::<Vec<_>>(), "once each, in order");
    reader.abort();
}
