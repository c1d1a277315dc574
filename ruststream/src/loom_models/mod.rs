//! Loom models of the runtime's concurrent hand-offs: each explores every
//! interleaving (up to a preemption bound) of the real code, built with
//! `--cfg loom` so its locks and atomics are loom's ([`crate::sync`]).
//! Run them with `scripts/loom.sh`.
//!
//! Each model is small — two or three threads, a few items — and asserts
//! one invariant; a lost wake-up shows as loom's deadlock report.

mod owners;
mod permits;
mod rings;
mod workers;

/// Runs `model` under loom with a preemption bound of 3, enough for every
/// race between two parties here (`LOOM_MAX_PREEMPTIONS` overrides it).
fn check(model: impl Fn() + Sync + Send + 'static) {
    check_bounded(3, model);
}

/// [`check`] with another preemption bound, for a model with more threads.
fn check_bounded(bound: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(bound);
    }
    builder.check(model);
}
