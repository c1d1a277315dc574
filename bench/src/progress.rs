//! How the harness learns that the last message was handled: handlers count
//! into a static, and the one that sees the N-th message wakes the waiter.
//! `Notify::notify_one` stores a permit, so a wake-up before the wait is kept.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

static SEEN: AtomicU64 = AtomicU64::new(0);
static TARGET: AtomicU64 = AtomicU64::new(u64::MAX);
static ALL_SEEN: Notify = Notify::const_new();

/// Arms the counter for a run of `n` messages.
pub fn expect(n: u64) {
    SEEN.store(0, Ordering::Relaxed);
    TARGET.store(n, Ordering::Relaxed);
}

/// One message handled.
pub fn seen() {
    if SEEN.fetch_add(1, Ordering::Relaxed) + 1 == TARGET.load(Ordering::Relaxed) {
        ALL_SEEN.notify_one();
    }
}

/// `n` messages handled at once (a batch handler).
pub fn seen_many(n: usize) {
    let before = SEEN.fetch_add(n as u64, Ordering::Relaxed);
    let target = TARGET.load(Ordering::Relaxed);
    if before < target && before + n as u64 >= target {
        ALL_SEEN.notify_one();
    }
}

/// Messages handled since [`expect`].
#[cfg_attr(not(any(feature = "kafka", feature = "mqtt")), allow(dead_code))]
pub fn count() -> u64 {
    SEEN.load(Ordering::Relaxed)
}

/// Resolves once the N-th message was handled.
pub async fn all_seen() {
    ALL_SEEN.notified().await;
}
