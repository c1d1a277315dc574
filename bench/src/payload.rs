//! The message every scenario carries, and the payloads built before timing.
//!
//! [`build`] and [`discard`] stay out of line so `bench/run.sh --callgrind`
//! can leave them out of the instruction counts (`--toggle-collect`): they
//! are harness work, proportional to N.

use std::sync::Arc;

use ruststream::bytes::Bytes;
use serde::Deserialize;

/// The decoded body: `{"id":<7 digits>,"name":"blue-widget","qty":<2 digits>}`.
#[derive(Debug, Deserialize)]
pub struct Order {
    pub id: u64,
    pub name: String,
    pub qty: u32,
}

impl Order {
    /// What a handler does with a body: read every field, opaquely to the
    /// optimizer.
    pub fn touch(&self) {
        std::hint::black_box(self.id);
        std::hint::black_box(self.name.as_str());
        std::hint::black_box(self.qty);
    }
}

/// `n` distinct JSON payloads, each its own shared buffer. Every payload is
/// cloned once here so the timed clones are reference-count increments: a
/// freshly converted `Vec` is promoted to a shared buffer (one allocation) on
/// its first clone, which would otherwise land in the timed section.
#[inline(never)]
pub fn build(n: u64) -> Arc<[Bytes]> {
    (0..n)
        .map(|i| {
            let json = format!(
                r#"{{"id":{},"name":"blue-widget","qty":{}}}"#,
                1_000_000 + i % 9_000_000,
                10 + i % 90
            );
            let payload = Bytes::from(json);
            drop(payload.clone());
            payload
        })
        .collect()
}

/// Frees the payloads, after timing.
#[inline(never)]
pub fn discard(payloads: Arc<[Bytes]>) {
    drop(payloads);
}
