//! Middleware: tower layers around handlers, and hooks on what the app sends.
//!
//! Run it with `cargo run --example middleware`. It shows stock tower layers
//! (`TimeoutLayer` for the whole app, `ConcurrencyLimitLayer` on one
//! subscriber), a layer of one's own written the tower way (timing), one
//! written as an async closure (header enrichment), and a publish hook;
//! then exits 0.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ruststream::SubscribeOptions;
use ruststream::extract::Header;
use ruststream::middleware::{self, BoxError, HandlerService, Next, Outcome, Request};
use ruststream::prelude::*;
use tower::limit::ConcurrencyLimitLayer;
use tower::timeout::TimeoutLayer;
use tower::{Layer, Service};

ruststream::header_name!(Tenant = "tenant");

/// A layer of one's own, the tower way: logs how long each delivery took
/// and how it ended.
#[derive(Clone)]
struct TimingLayer;

impl Layer<HandlerService> for TimingLayer {
    type Service = Timing;

    fn layer(&self, inner: HandlerService) -> Timing {
        Timing { inner }
    }
}

#[derive(Clone)]
struct Timing {
    inner: HandlerService,
}

impl Service<Request> for Timing {
    type Response = Outcome;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Outcome, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let subject = request.envelope().subject().clone();
        let started = Instant::now();
        let outcome = self.inner.call(request);
        Box::pin(async move {
            let outcome = outcome.await;
            let how = match &outcome {
                Ok(Outcome::Ack(_)) => "ok".to_owned(),
                Ok(Outcome::Failed(err)) => format!("failed: {err}"),
                Err(err) => format!("failed: {err}"),
            };
            println!("timing: {subject} took {:?}, {how}", started.elapsed());
            outcome
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    id: u64,
    slow: bool,
}

static RUNNING: AtomicUsize = AtomicUsize::new(0);
static MOST_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Eight workers, but the concurrency limit lets two run at once; a slow
/// report runs past the app's timeout and fails.
#[subscriber(
    "reports",
    workers(8),
    max_attempts = 2,
    dead_letter = "reports.failed"
)]
async fn render(report: Report, tenant: Header<Tenant>) -> String {
    let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    MOST_RUNNING.fetch_max(now, Ordering::SeqCst);
    let work = if report.slow { 5_000 } else { 10 };
    tokio::time::sleep(Duration::from_millis(work)).await;
    RUNNING.fetch_sub(1, Ordering::SeqCst);
    format!("report {} for {}", report.id, tenant.value())
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    let broker = MemoryBroker::new();
    let mut failed = broker
        .subscribe(SubscribeOptions::new("reports.failed"))
        .await?;
    // A layer written as an async closure: messages without a tenant get
    // the default one before the handler's `Header<Tenant>` reads it.
    let default_tenant = middleware::from_fn(|mut request: Request, next: Next| async move {
        if request.envelope().headers().get("tenant").is_none() {
            request.headers_mut().insert("tenant", "public");
        }
        next.run(request).await
    });
    let running = App::new()
        .broker(broker.clone())
        // Outermost first: timing sees the timeout's failure.
        .middleware(TimingLayer)
        .middleware(TimeoutLayer::new(Duration::from_millis(500)))
        .middleware(default_tenant)
        // Every message the app sends (here: the replies) names its sender.
        .on_publish(|_subject: &str, message: &mut Message| {
            message.headers_mut().insert("sent-by", "reports-service");
        })
        .subscriber(render.configure(|c| c.middleware(ConcurrencyLimitLayer::new(2))))
        .start()
        .await?;

    let client = Publisher::new(broker.clone());
    let mut asks = Vec::new();
    for id in 1..=6 {
        let mut message = client.encode(&Report { id, slow: false })?;
        if id % 2 == 0 {
            message = message.with_header("tenant", "acme");
        }
        let client = client.clone();
        asks.push(tokio::spawn(async move {
            client
                .request_message("reports", message, Duration::from_secs(10))
                .await
        }));
    }
    for ask in asks {
        let reply = ask.await.expect("request task")?;
        let text = String::from_utf8_lossy(reply.payload());
        println!(
            "reply: {text} (sent by {})",
            reply.headers().get("sent-by").unwrap_or("?")
        );
        assert_eq!(reply.headers().get("sent-by"), Some("reports-service"));
    }
    let most = MOST_RUNNING.load(Ordering::SeqCst);
    println!("at most {most} handlers ran at once (limit 2, 8 workers)");
    assert!(most <= 2, "the concurrency limit held");

    // Times out twice (max_attempts = 2), then goes to the dead letter.
    client
        .publish("reports", &Report { id: 7, slow: true })
        .await?;
    let dead = tokio::time::timeout(Duration::from_secs(10), failed.next())
        .await
        .expect("the slow report is dead-lettered")
        .expect("the dead-letter subscription is open");
    let reason = dead.envelope().headers().get(ruststream::header::ERROR);
    println!("dead letter: {}", reason.unwrap_or("?"));
    assert_eq!(
        reason,
        Some("handler failed at attempt 2: request timed out")
    );
    dead.ack().await?;

    running.shutdown().await
}
