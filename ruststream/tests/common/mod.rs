//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::sync::OnceLock;
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
    payload + ruststream::FRAME_OVERHEAD
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

/// Current value of counter `name` with label `label_key=label_value`.
pub fn counter(name: &str, label_key: &str, label_value: &str) -> u64 {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key().name() == name
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == label_key && l.value() == label_value)
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}
