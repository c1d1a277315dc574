//! Publish subjects: checked once, then handed to the client as `Subject`s
//! that clone and drop without a reference count; subscriptions keep the
//! subject they receive on the same way (`convert::SubjectCache`).
//!
//! A publish's subject travels from the publishing thread to the client's
//! connection task, which drops it once written. A shared `Subject` would
//! bounce its reference count between the two threads on every message;
//! a static one has none. So each subject seen is kept for the life of the
//! process (leaked), up to [`INTERNED_BYTES`] in all; past that bound a
//! subject is copied per publish, which is what the client does with any
//! subject that is not `&'static`.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};

use async_nats::Subject;

use crate::{Error, Result};

/// The bytes of subject text kept for the life of the process: services
/// publish to a few subjects, and one minting a subject per message (an
/// id in it) stops adding to the set here.
const INTERNED_BYTES: usize = 64 * 1024;

/// The subjects kept for the process.
static INTERNED: LazyLock<Mutex<Interner>> =
    LazyLock::new(|| Mutex::new(Interner::new(INTERNED_BYTES)));

thread_local! {
    /// The subject this thread published to last: a publisher usually sends
    /// to the same subject again, found here without a lock.
    static LAST: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The client's subject for a publish to `subject`, checked
/// ([`check_subject`]) the first time this thread publishes to it in a row.
pub(crate) fn publish_subject(subject: &str) -> Result<Subject> {
    if let Some(last) = LAST.get()
        && last == subject
    {
        return Ok(Subject::from_static(last));
    }
    check_subject(subject)?;
    Ok(match intern(subject) {
        Some(kept) => {
            LAST.set(Some(kept));
            Subject::from_static(kept)
        }
        None => Subject::from(subject),
    })
}

/// `subject` kept for the life of the process; `None` once the process's
/// room for subjects is full.
pub(crate) fn intern(subject: &str) -> Option<&'static str> {
    INTERNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .keep(subject)
}

/// A set of strings kept for the life of the process, up to a bound.
struct Interner {
    kept: HashSet<&'static str>,
    bytes: usize,
    limit: usize,
}

impl Interner {
    fn new(limit: usize) -> Self {
        Interner {
            kept: HashSet::new(),
            bytes: 0,
            limit,
        }
    }

    /// The kept copy of `s`, made now if there is room for it.
    fn keep(&mut self, s: &str) -> Option<&'static str> {
        if let Some(kept) = self.kept.get(s) {
            return Some(kept);
        }
        if self.bytes + s.len() > self.limit {
            return None;
        }
        let kept: &'static str = Box::leak(s.into());
        self.kept.insert(kept);
        self.bytes += kept.len();
        Some(kept)
    }
}

/// Refuses a subject NATS cannot take in a publish or a request: it must
/// not be empty, nor hold whitespace, which would break the protocol's
/// framing. The broker's client is told not to check every publish (the
/// check was a third of a publish's cost in the client), so every publish
/// and request goes through [`publish_subject`], which checks a subject it
/// has not seen last.
fn check_subject(subject: &str) -> Result<()> {
    if subject.is_empty()
        || subject
            .bytes()
            .any(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
    {
        return Err(Error::Config(format!(
            "{subject:?} is not a NATS subject to publish to: it is empty or holds whitespace"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_is_kept_once_and_found_again() {
        let a = publish_subject("subjects.test.kept").unwrap();
        let b = publish_subject("subjects.test.other").unwrap();
        let c = publish_subject("subjects.test.kept").unwrap();
        assert_eq!(a.as_str(), "subjects.test.kept");
        assert_eq!(b.as_str(), "subjects.test.other");
        // The same kept text, not a copy.
        assert_eq!(a.as_str().as_ptr(), c.as_str().as_ptr());
    }

    #[test]
    fn a_bad_subject_is_refused_even_after_a_good_one() {
        publish_subject("subjects.test.good").unwrap();
        for bad in ["", "has space", "tab\there", "line\nbreak"] {
            assert!(
                matches!(publish_subject(bad), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn past_its_bound_an_interner_keeps_nothing_more() {
        let mut interner = Interner::new(10);
        let a = interner.keep("a.b.c").unwrap();
        assert_eq!(
            interner.keep("a.b.c"),
            Some(a),
            "found again, not kept twice"
        );
        assert!(interner.keep("d.e.f").is_some());
        assert_eq!(interner.keep("g.h.i"), None, "10 bytes are taken");
        assert_eq!(interner.keep("a.b.c"), Some(a), "what is kept stays");
    }
}
