//! A job permit in its three shapes: owned ([`JobPermit`]), borrowing its
//! queue ([`BorrowedPermit`]), and counted ([`Permits`]). Each is returned
//! exactly once, when dropped.

use std::sync::Arc;

use super::permits::JobQueue;

/// One permit: a reserved supply slot or a queued job. It travels with
/// its record and is returned exactly once, when dropped: right
/// before the handler body starts, after bounded processing of a control or
/// malformed record, or on cancellation and shutdown.
#[must_use = "a permit is returned when dropped"]
pub struct JobPermit {
    pub(super) queue: Arc<JobQueue>,
}

/// A [`JobPermit`] that borrows its queue, for a loop that keeps the queue
/// alive itself (the default loop): the same permit without the reference
/// count it would take and drop for every delivery.
#[must_use = "a permit is returned when dropped"]
pub(crate) struct BorrowedPermit<'a>(pub(super) &'a JobQueue);

impl Drop for BorrowedPermit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.release();
    }
}

impl BorrowedPermit<'_> {
    /// The same permit as one that owns a reference to `queue` (its own
    /// queue), for a delivery whose permit travels on into a middleware
    /// stack: nothing is released or taken on the way.
    pub(crate) fn into_owned(self, queue: &Arc<JobQueue>) -> JobPermit {
        debug_assert!(std::ptr::eq(self.0, &**queue), "a permit of another queue");
        std::mem::forget(self);
        JobPermit {
            queue: Arc::clone(queue),
        }
    }
}

/// Permits of a batch of records, counted rather than one value each: one
/// atomic update takes or returns them all. Borrows its queue, like
/// [`BorrowedPermit`]; what it still holds returns when it is dropped.
#[must_use = "permits are returned when dropped"]
pub(crate) struct Permits<'a> {
    pub(super) queue: &'a JobQueue,
    pub(super) n: usize,
}

impl<'a> Permits<'a> {
    /// How many it holds.
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Whether it holds none.
    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Takes over a single permit.
    pub(crate) fn adopt(&mut self, permit: BorrowedPermit<'a>) {
        std::mem::forget(permit);
        self.n += 1;
    }

    /// Takes over every permit of `other`.
    pub(crate) fn merge(&mut self, mut other: Permits<'a>) {
        self.n += std::mem::take(&mut other.n);
    }

    /// One of the permits, split off as one that owns a reference to
    /// `queue` (their own queue): nothing is released or taken on the way.
    pub(crate) fn split_one(&mut self, queue: &Arc<JobQueue>) -> JobPermit {
        debug_assert!(
            std::ptr::eq(self.queue, &**queue),
            "permits of another queue"
        );
        assert!(self.n > 0, "no permit to split off");
        self.n -= 1;
        JobPermit {
            queue: Arc::clone(queue),
        }
    }

    /// Returns all but `keep`.
    pub(crate) fn truncate(&mut self, keep: usize) {
        if keep < self.n {
            self.queue.release_n(self.n - keep);
            self.n = keep;
        }
    }
}

impl Drop for Permits<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.n > 0 {
            self.queue.release_n(self.n);
        }
    }
}

impl std::fmt::Debug for JobPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobPermit")
    }
}

impl Drop for JobPermit {
    #[inline]
    fn drop(&mut self) {
        self.queue.release();
    }
}
