//! The last exact route each thread published to, so a publisher that keeps
//! publishing to one subject skips the registry's lock and hash lookup.
//!
//! An entry is good while the registry's generation is the one it was
//! cached under: every registry change (subscribe, a queue's last member
//! leaving) bumps the generation under the write lock, so a publish that
//! starts after a subscribe returned never uses a route from before it. A
//! publish racing an unsubscribe may still reach the queue that is leaving;
//! it finds the queue closed and skips it, as if it had come just after.
//! An entry keeps its route's queues allocated (a closed queue holds no
//! frames) until the thread publishes to another subject or ends.

use std::cell::RefCell;
use std::sync::Arc;

use super::registry::Route;
use crate::Text;

struct Cached {
    broker: u64,
    generation: u64,
    subject: Text,
    route: Arc<Route>,
}

thread_local! {
    static LAST: RefCell<Option<Cached>> = const { RefCell::new(None) };
}

/// The route of `subject` on broker `broker`, if this thread cached it under
/// `generation`.
#[inline]
pub(crate) fn get(broker: u64, generation: u64, subject: &str) -> Option<Arc<Route>> {
    LAST.try_with(|last| {
        let last = last.try_borrow().ok()?;
        let cached = last.as_ref()?;
        (cached.broker == broker
            && cached.generation == generation
            && same(cached.subject.as_bytes(), subject.as_bytes()))
        .then(|| Arc::clone(&cached.route))
    })
    .ok()
    .flatten()
}

/// `a == b`, comparing a word at a time: subjects are short, and a call to
/// `memcmp` for each publish costs more than the comparison itself.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let n = a.len();
    if n < 8 {
        return a == b;
    }
    let word = |s: &[u8], at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_ne_bytes(w)
    };
    let mut at = 0;
    while at + 8 < n {
        if word(a, at) != word(b, at) {
            return false;
        }
        at += 8;
    }
    // The last word, overlapping the one before when `n` is not a multiple of 8.
    word(a, n - 8) == word(b, n - 8)
}

/// Caches `route` as found under `generation` (read under the registry's
/// lock).
pub(crate) fn put(broker: u64, generation: u64, route: &Arc<Route>) {
    let replaced = LAST.try_with(|last| {
        let mut last = last.try_borrow_mut().ok()?;
        last.replace(Cached {
            broker,
            generation,
            subject: route.subject.clone(),
            route: Arc::clone(route),
        })
    });
    // The entry it replaced is dropped here, with the cell released.
    drop(replaced);
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn same_compares_every_byte_at_every_length() {
        let text = b"orders.created.eu-west-1.priority-high";
        for len in 0..=text.len() {
            let a = &text[..len];
            assert!(same(a, a), "len {len}");
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 1;
                assert!(!same(a, &b), "len {len}, byte {at} differs");
            }
            assert!(!same(a, &text[..len.saturating_sub(1)]) || len == 0);
        }
    }
}
