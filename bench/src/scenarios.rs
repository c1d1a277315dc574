//! The scenarios, one function each, all measured the same way: a spawned
//! task publishes the pre-built payloads as fast as the transport admits them
//! while the consumer runs; handlers count into [`progress`].
//!
//! Publishers hold the payloads through an `Arc`, so freeing them never lands
//! in a timed section.
//!
//! To add a scenario: write `async fn name(payloads: Arc<[Bytes]>) ->
//! Result<Measurement, BoxError>`, add it to [`NAMES`] and to [`run`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use ruststream::bytes::Bytes;
use ruststream::{
    App, BoxError, Broker, IntoSubscriber, MemoryBroker, Message, Requester, subscriber,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::payload::Order;
use crate::{alloc, progress};

/// Every scenario, as named on the command line.
pub const NAMES: &[&str] = &[
    "consume-json",
    "consume-workers4",
    "consume-bykey4",
    "consume-threads4",
    "consume-batch100",
    "request-reply",
    "request-reply-64",
    "publish-only",
    "raw-mpsc",
];

/// Runs the scenario `name`; `None` if there is no such scenario.
pub async fn run(name: &str, payloads: Arc<[Bytes]>) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "consume-json" => consume_json(payloads).await,
        "consume-workers4" => consume_workers4(payloads).await,
        "consume-bykey4" => consume_bykey4(payloads).await,
        "consume-threads4" => consume_threads4(payloads).await,
        "consume-batch100" => consume_batch100(payloads).await,
        "request-reply" => request_reply(payloads, 1).await,
        "request-reply-64" => request_reply(payloads, 64).await,
        "publish-only" => publish_only(payloads).await,
        "raw-mpsc" => raw_mpsc(payloads).await,
        _ => return None,
    })
}

/// The timed section of one run.
#[derive(Clone, Copy, Debug)]
pub struct Measurement {
    pub elapsed: Duration,
    pub allocs: u64,
    /// The process's CPU time over `elapsed`.
    pub cpu: Duration,
    /// The process's peak resident set so far, in KiB, where a scenario
    /// measures it.
    pub peak_rss_kib: Option<u64>,
}

/// A point in time, with the allocation count and the process's CPU time
/// at that point.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    at: Instant,
    allocs: u64,
    cpu: Duration,
}

impl Mark {
    pub(crate) fn now() -> Self {
        Mark {
            at: Instant::now(),
            allocs: alloc::count(),
            cpu: process_cpu(),
        }
    }

    pub(crate) fn until(self, end: Mark) -> Measurement {
        Measurement {
            elapsed: end.at - self.at,
            allocs: end.allocs - self.allocs,
            cpu: end.cpu - self.cpu,
            peak_rss_kib: None,
        }
    }
}

/// User plus system time of every thread of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: `getrusage` only writes the struct it is handed.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// Marks of one run: just before the first publish, when the last publish
/// returned, and when a handler saw the last message.
struct Timeline {
    start: Mark,
    published: Mark,
    consumed: Mark,
}

/// A publisher task's result: its `(start, published)` marks.
type Publisher = JoinHandle<Result<(Mark, Mark), BoxError>>;

/// Default loop, JSON body: the framework's end-to-end cost per message.
async fn consume_json(payloads: Arc<[Bytes]>) -> Result<Measurement, BoxError> {
    #[subscriber("bench.orders")]
    async fn handle(order: Order) {
        order.touch();
        progress::seen();
    }
    let t = through_app(handle, "bench.orders", payloads).await?;
    Ok(t.start.until(t.consumed))
}

/// `workers(4)`: four worker tasks, mailbox of one each.
async fn consume_workers4(payloads: Arc<[Bytes]>) -> Result<Measurement, BoxError> {
    #[subscriber("bench.workers", workers(4))]
    async fn handle(order: Order) {
        order.touch();
        progress::seen();
    }
    let t = through_app(handle, "bench.workers", payloads).await?;
    Ok(t.start.until(t.consumed))
}

/// `workers(4, by_key)`: keys cycle over 64 values (the order id mod 64).
async fn consume_bykey4(payloads: Arc<[Bytes]>) -> Result<Measurement, BoxError> {
    fn key(order: &Order) -> u64 {
        order.id % 64
    }
    #[subscriber("bench.bykey", workers(4, by_key = key))]
    async fn handle(order: Order) {
        order.touch();
        progress::seen();
    }
    let t = through_app(handle, "bench.bykey", payloads).await?;
    Ok(t.start.until(t.consumed))
}

/// `batch(max = 100)`: the default loop handing the handler up to 100
/// records at a time (whatever is at hand: no wait).
async fn consume_batch100(payloads: Arc<[Bytes]>) -> Result<Measurement, BoxError> {
    #[subscriber("bench.batch", batch(max = 100))]
    async fn handle(orders: Vec<Order>) {
        for order in &orders {
            order.touch();
        }
        progress::seen_many(orders.len());
    }
    let t = through_app(handle, "bench.batch", payloads).await?;
    Ok(t.start.until(t.consumed))
}

/// `threads(4)`: four dedicated threads, claiming in place while busy.
async fn consume_threads4(payloads: Arc<[Bytes]>) -> Result<Measurement, BoxError> {
    #[subscriber("bench.threads", threads(4))]
    async fn handle(order: Order) {
        order.touch();
        progress::seen();
    }
    let t = through_app(handle, "bench.threads", payloads).await?;
    Ok(t.start.until(t.consumed))
}

/// N request/reply round trips from `callers` concurrent client tasks, each
/// sequential; the handler decodes the order and replies with its id.
async fn request_reply(payloads: Arc<[Bytes]>, callers: usize) -> Result<Measurement, BoxError> {
    #[subscriber("bench.rpc")]
    async fn handle(order: Order) -> u64 {
        order.touch();
        order.id
    }
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(handle)
        .start()
        .await?;
    let start = Mark::now();
    let clients: Vec<JoinHandle<Result<(), BoxError>>> = (0..callers)
        .map(|caller| {
            let broker = broker.clone();
            let payloads = Arc::clone(&payloads);
            tokio::spawn(async move {
                for payload in payloads.iter().skip(caller).step_by(callers) {
                    let reply = broker
                        .request_message(
                            "bench.rpc",
                            Message::new(payload.clone()),
                            Duration::from_secs(10),
                        )
                        .await?;
                    std::hint::black_box(reply.payload().len());
                }
                Ok(())
            })
        })
        .collect();
    for client in clients {
        client.await??;
    }
    let measured = start.until(Mark::now());
    running.shutdown().await?;
    Ok(measured)
}

/// The publishing side alone: time until the last publish returned. The
/// subscriber takes the raw payload and only counts.
async fn publish_only(payloads: Arc<[Bytes]>) -> Result<Measurement, BoxError> {
    #[subscriber("bench.count")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    let t = through_app(count, "bench.count", payloads).await?;
    Ok(t.start.until(t.published))
}

/// No framework: a bounded tokio channel of the same payloads, decoded with
/// serde_json by one consumer task.
async fn raw_mpsc(payloads: Arc<[Bytes]>) -> Result<Measurement, BoxError> {
    progress::expect(payloads.len() as u64);
    let (tx, mut rx) = mpsc::channel::<Bytes>(1024);
    let consumer = tokio::spawn(async move {
        while let Some(payload) = rx.recv().await {
            let order: Order = serde_json::from_slice(&payload)?;
            order.touch();
            progress::seen();
        }
        Ok::<_, BoxError>(())
    });
    let publisher = tokio::spawn(async move {
        let start = Mark::now();
        for payload in payloads.iter() {
            tx.send(payload.clone()).await?;
        }
        Ok((start, Mark::now()))
    });
    let t = wait(publisher).await?;
    consumer.await??;
    Ok(t.start.until(t.consumed))
}

/// Starts an app with `subscriber` (listening on `subject`) on a fresh memory
/// broker, publishes `payloads` to `subject` from a spawned task, waits until
/// the last one was handled and shuts the app down.
async fn through_app<M>(
    subscriber: impl IntoSubscriber<M>,
    subject: &'static str,
    payloads: Arc<[Bytes]>,
) -> Result<Timeline, BoxError> {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(subscriber)
        .start()
        .await?;
    progress::expect(payloads.len() as u64);
    let publisher = tokio::spawn(async move {
        let start = Mark::now();
        for payload in payloads.iter() {
            broker
                .publish_message(subject, Message::new(payload.clone()), None)
                .await?;
        }
        Ok((start, Mark::now()))
    });
    let timeline = wait(publisher).await?;
    running.shutdown().await?;
    Ok(timeline)
}

/// Waits for both the publisher and the last handled message; a failed
/// publisher ends the wait instead of leaving it hanging.
async fn wait(mut publisher: Publisher) -> Result<Timeline, BoxError> {
    let mut marks = None;
    let consumed = loop {
        tokio::select! {
            () = progress::all_seen() => break Mark::now(),
            joined = &mut publisher, if marks.is_none() => marks = Some(joined??),
        }
    };
    let (start, published) = match marks {
        Some(marks) => marks,
        None => publisher.await??,
    };
    Ok(Timeline {
        start,
        published,
        consumed,
    })
}
