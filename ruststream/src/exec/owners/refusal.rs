//! Why an owner FIFO refused an admission.

/// Why an admission was refused: a structural limit, distinct from a
/// deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The owner's FIFO is at its count limit.
    OwnerCount,
    /// The owner's FIFO is at its byte limit.
    OwnerBytes,
    /// All owners together are at the total limit.
    Total,
    /// The set is closed.
    Closed,
}

impl Refusal {
    /// The reason in plain words, as a refused caller reads it.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::OwnerCount => "the key's queue is at its count limit",
            Refusal::OwnerBytes => "the key's queue is at its byte limit",
            Refusal::Total => "the subscriber's pending deliveries are at their limit",
            Refusal::Closed => "the subscriber is stopping",
        }
    }
}

impl From<Refusal> for crate::Error {
    /// A structural limit, never a deadline: the caller can tell a
    /// full owner FIFO from a publish that ran out of time.
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Closed => crate::Error::Closed("owner FIFOs are closed"),
            other => crate::Error::StructuralLimit(other.reason().into()),
        }
    }
}
