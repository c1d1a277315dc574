//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod blocked;
pub mod faults;
pub mod retry_once;
pub mod server;

use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::Semaphore;

/// A gate handlers wait at until the test opens it.
pub struct Gate(Semaphore);

impl Gate {
    pub const fn new() -> Self {
        Gate(Semaphore::const_new(0))
    }

    pub async fn pass(&self) {
        self.0.acquire().await.expect("gate open").forget();
    }

    pub fn open(&self) {
        self.0.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

/// Bytes a queued frame with a `payload`-byte payload and no headers owns.
pub fn frame(payload: usize) -> usize {
    payload + ruststream::binding::memory::FRAME_OVERHEAD
}

/// Waits until `cond` holds, re-checking every millisecond; fails loudly
/// after `secs`.
pub async fn until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    within(secs, what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

/// Waits for `fut`, failing the test loudly after `secs` seconds.
pub async fn within<F: Future>(secs: u64, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs}s waiting for: {what}"),
    }
}

/// A request's failure as its caller sees it: the handler's reason
/// (`Error::Handler`, not a timeout), which must contain `reason`.
pub fn assert_handler_failure<T: std::fmt::Debug>(result: ruststream::Result<T>, reason: &str) {
    match result {
        Err(ruststream::Error::Handler(why)) => assert!(why.contains(reason), "{why}"),
        other => panic!("expected the handler's failure, got {other:?}"),
    }
}

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other metrics recorder in the test process");
        snapshotter
    })
}

/// Installs the test recorder (idempotent); call before the code under test.
pub fn install_metrics() {
    snapshotter();
}

/// Counter totals seen so far: the debugging recorder's snapshot resets
/// every value it returns, so counters are accumulated here.
static COUNTERS: Mutex<Vec<CounterTotal>> = Mutex::new(Vec::new());

/// Name, labels, total.
type CounterTotal = (String, Vec<(String, String)>, u64);

/// Name, labels, value.
type GaugeValue = (String, Vec<(String, String)>, f64);

/// One snapshot of every metric: counters are added to their running totals;
/// gauges are read from this snapshot only (a gauge that was not set again
/// since the previous snapshot reads 0, so take one snapshot per check).
pub struct Observed {
    gauges: Vec<GaugeValue>,
}

impl Observed {
    /// Gauge `name` of the series carrying `label_key=label_value` in this
    /// snapshot (summed over such series). A label keeps it apart from the
    /// same gauge of other tests' apps in this process.
    pub fn gauge(&self, name: &str, label_key: &str, label_value: &str) -> f64 {
        self.gauges
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && labels
                        .iter()
                        .any(|(k, v)| k == label_key && v == label_value)
            })
            .map(|(.., v)| *v)
            .sum()
    }
}

/// Takes one snapshot of every metric.
pub fn observe() -> Observed {
    let mut counters = COUNTERS.lock().unwrap();
    let mut gauges = Vec::new();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let name = key.key().name().to_owned();
        let labels: Vec<(String, String)> = key
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        match value {
            DebugValue::Counter(n) => {
                match counters
                    .iter_mut()
                    .find(|(k, l, _)| *k == name && *l == labels)
                {
                    Some((.., total)) => *total += n,
                    None => counters.push((name, labels, n)),
                }
            }
            DebugValue::Gauge(g) => gauges.push((name, labels, g.into_inner())),
            DebugValue::Histogram(_) => {}
        }
    }
    Observed { gauges }
}

/// Total of counter `name` with label `label_key=label_value` so far.
pub fn counter(name: &str, label_key: &str, label_value: &str) -> u64 {
    observe();
    COUNTERS
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && labels
                    .iter()
                    .any(|(k, v)| k == label_key && v == label_value)
        })
        .map(|(.., total)| *total)
        .sum()
}

/// Total of counter `name` over the series carrying every label of `labels`.
#[allow(dead_code)]
pub fn counter_with(name: &str, labels: &[(&str, &str)]) -> u64 {
    observe();
    COUNTERS
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, have, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
        })
        .map(|(.., total)| total)
        .sum()
}

/// The memory broker's queue for `subject`, as it is now.
pub fn queue(
    broker: &ruststream::MemoryBroker,
    subject: &str,
) -> ruststream::binding::memory::QueueStats {
    broker
        .queues()
        .into_iter()
        .find(|q| q.subject.as_str() == subject)
        .unwrap_or_else(|| panic!("a queue for {subject}"))
}

/// A name no other run (or test) uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}{}x{nanos}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
