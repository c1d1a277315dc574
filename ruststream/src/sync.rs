//! The locks and atomics of the runtime's concurrent hand-offs (the job
//! queue's permits, the owner FIFOs, the workers' mailboxes, the threads'
//! rings). Built with `--cfg loom`, they are loom's, so the models in
//! `loom_models` explore every interleaving of the real code.

#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard, atomic};

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard, atomic};
