//! The app's HTTP endpoints (issue 22, feature `prometheus`): `/metrics`
//! scraped over real HTTP and parsed as the Prometheus text format, and
//! `/ready` turning false at the start of the shutdown (RT-9's first phase)
//! while `/health` still answers.

#![cfg(feature = "prometheus")]

mod common;

use std::net::SocketAddr;

use common::within;
use ruststream::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// One GET over a fresh connection: status code and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("the endpoint accepts");
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    within(5, "the response", stream.read_to_string(&mut response))
        .await
        .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    (status, body.to_owned())
}

#[subscriber("endpoints.orders")]
async fn order(_id: u64) {}

/// The value of `metric` with `labels` in a scrape of `addr`, if there.
async fn scrape(addr: SocketAddr, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the text format parses");
    scrape
        .samples
        .into_iter()
        .find(|s| {
            s.metric == metric
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(k).is_some_and(|got| got.ends_with(v)))
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            other => panic!("{metric} is a {other:?}"),
        })
}

/// Polls the scrape until `metric` reaches `want` (bounded; fails with the
/// last value seen).
async fn until_value(addr: SocketAddr, metric: &str, labels: &[(&str, &str)], want: f64) {
    let mut last = None;
    for _ in 0..200 {
        last = scrape(addr, metric, labels).await;
        if last == Some(want) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{metric}{labels:?} never reached {want}: last {last:?}");
}

#[tokio::test]
async fn metrics_are_served_in_the_prometheus_text_format() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .name("shop")
        .broker(broker.clone())
        .subscriber(order)
        .serve_metrics(([127, 0, 0, 1], 0))
        .start()
        .await
        .unwrap();
    let addr = running.metrics_addr().expect("served");
    let client = Publisher::new(broker.clone());
    for id in 0..3u64 {
        client.publish("endpoints.orders", &id).await.unwrap();
    }
    // A payload that does not decode.
    broker
        .publish_message("endpoints.orders", Message::new("not json"), None)
        .await
        .unwrap();
    let subject = ("subject", "endpoints.orders");
    let subscriber = ("subscriber", "order");
    until_value(
        addr,
        "ruststream_handled_total",
        &[("app", "shop"), subject, subscriber, ("outcome", "acked")],
        3.0,
    )
    .await;
    until_value(
        addr,
        "ruststream_handled_total",
        &[subject, subscriber, ("outcome", "malformed")],
        1.0,
    )
    .await;
    until_value(addr, "ruststream_malformed_total", &[subject], 1.0).await;
    let (_, body) = get(addr, "/metrics").await;
    assert!(
        body.contains("ruststream_handler_duration_seconds"),
        "handler timings are on with serve_metrics:\n{body}"
    );
    assert_eq!(
        scrape(addr, "ruststream_in_flight", &[subject]).await,
        Some(0.0),
        "nothing runs now"
    );
    assert_eq!(get(addr, "/health").await, (200, "ok\n".to_owned()));
    assert_eq!(get(addr, "/nowhere").await.0, 404);
    running.shutdown().await.unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "nothing is served after the shutdown"
    );
}

#[tokio::test]
async fn ready_turns_false_when_the_shutdown_begins() {
    let (at_shutdown, mut shutting_down) = mpsc::channel::<()>(1);
    let (release, released) = oneshot::channel::<()>();
    let running = App::new()
        .broker(MemoryBroker::new())
        .subscriber(order)
        .serve_metrics(([127, 0, 0, 1], 0))
        .on_shutdown(move |_| async move {
            at_shutdown.send(()).await.unwrap();
            released.await.unwrap();
            Ok(())
        })
        .start()
        .await
        .unwrap();
    let addr = running.metrics_addr().unwrap();
    assert_eq!(get(addr, "/ready").await, (200, "ready\n".to_owned()));

    let stopping = tokio::spawn(running.shutdown());
    within(5, "the shutdown to begin", shutting_down.recv())
        .await
        .unwrap();
    assert_eq!(
        get(addr, "/ready").await,
        (503, "shutting down\n".to_owned())
    );
    assert_eq!(
        get(addr, "/health").await,
        (200, "ok\n".to_owned()),
        "alive while it drains"
    );
    release.send(()).unwrap();
    within(5, "the shutdown", stopping).await.unwrap().unwrap();
}

#[tokio::test]
async fn an_address_in_use_is_a_startup_error_that_names_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = App::new()
        .broker(MemoryBroker::new())
        .serve_metrics(addr)
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ruststream::Error::Config(m) if m.contains(&addr.to_string())),
        "{err}"
    );
}

#[subscriber("endpoints.quotes")]
async fn quote(id: u64, ctx: Ctx) -> Result<u64, HandlerError> {
    ctx.publish("endpoints.quoted", &id).await?;
    Ok(id * 2)
}

/// The app that serves `/metrics` (the first one in the process, which
/// installs the recorder) reports what it registers and times while it is
/// built: its own sends (a handler's publish and reply), its job gauges.
/// Timings are histograms with buckets, as the metrics table says.
#[tokio::test]
async fn the_serving_app_times_its_own_sends_in_histograms_and_reports_its_job_gauges() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .name("shop")
        .broker(broker.clone())
        .subscriber(quote)
        .serve_metrics(([127, 0, 0, 1], 0))
        .start()
        .await
        .unwrap();
    let addr = running.metrics_addr().expect("served");
    let doubled: u64 = within(
        5,
        "the reply",
        Publisher::new(broker).request(
            "endpoints.quotes",
            &21u64,
            std::time::Duration::from_secs(5),
        ),
    )
    .await
    .unwrap();
    assert_eq!(doubled, 42);
    let sends = |operation: &str| {
        format!(
            "ruststream_publish_duration_seconds_count{{app=\"shop\",binding=\"memory\",operation=\"{operation}\",outcome=\"ok\"}}"
        )
    };
    let wanted = [
        sends("publish"),
        sends("reply"),
        "ruststream_jobs_in_use{app=\"shop\"}".to_owned(),
        "ruststream_job_waiters{app=\"shop\"}".to_owned(),
        "# TYPE ruststream_handler_duration_seconds histogram".to_owned(),
        "# TYPE ruststream_publish_duration_seconds histogram".to_owned(),
        "ruststream_handler_duration_seconds_bucket{".to_owned(),
    ];
    let mut body = String::new();
    for _ in 0..200 {
        body = get(addr, "/metrics").await.1;
        if wanted.iter().all(|w| body.contains(w.as_str())) {
            break;
        }
        tokio::task::yield_now().await;
    }
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|w| !body.contains(w.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "missing from /metrics: {missing:?}\n{body}"
    );
    running.shutdown().await.unwrap();
}
