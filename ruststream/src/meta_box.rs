//! The box a [`Message`](crate::Message)'s metadata lives in, recycled
//! through a small per-thread free list: a request (its reply subject) and
//! its reply (its status) each carry metadata, and a round trip that takes
//! both boxes from the list and gives them back costs no allocation.
//!
//! A box freed on another thread than the one that made it goes to that
//! thread's list; a list keeps at most [`KEEP`] boxes, the rest are freed.

use std::cell::RefCell;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use crate::reply_port::ReplyPort;
use crate::{Headers, Text};

/// A message's metadata (everything beyond its payload).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) headers: Headers,
    pub(crate) key: Option<Text>,
    pub(crate) reply_to: Option<Text>,
    /// A caller in this process to hand the reply to; `reply_to` is then
    /// `None` and the port makes the subject if asked.
    pub(crate) reply_port: Option<ReplyPort>,
    pub(crate) correlation_id: Option<Text>,
}

impl Meta {
    /// Empties it in place: only the fields that hold something do any work.
    fn clear(&mut self) {
        self.headers.clear();
        self.key = None;
        self.reply_to = None;
        self.reply_port = None;
        self.correlation_id = None;
    }
}

/// Boxes one thread keeps for reuse.
const KEEP: usize = 64;

thread_local! {
    // The boxes themselves are what is reused: `Vec<Meta>` would move each
    // one out of its allocation.
    #[allow(clippy::vec_box)]
    static FREE: RefCell<Vec<Box<Meta>>> = const { RefCell::new(Vec::new()) };
}

/// A boxed, empty-on-arrival [`Meta`] that goes back to its thread's free
/// list when dropped.
pub(crate) struct MetaBox(ManuallyDrop<Box<Meta>>);

impl MetaBox {
    /// An empty `Meta`, from the free list when it has one.
    pub(crate) fn new() -> Self {
        let reused = FREE
            .try_with(|free| free.try_borrow_mut().ok()?.pop())
            .ok()
            .flatten();
        MetaBox(ManuallyDrop::new(reused.unwrap_or_default()))
    }
}

impl Drop for MetaBox {
    fn drop(&mut self) {
        // SAFETY: the box is taken exactly once, here, and `self.0` is never
        // used again.
        let mut meta = unsafe { ManuallyDrop::take(&mut self.0) };
        // Emptied before it is kept: a kept box holds no strings alive.
        meta.clear();
        let _ = FREE.try_with(|free| {
            if let Ok(mut free) = free.try_borrow_mut()
                && free.len() < KEEP
            {
                free.push(meta);
            }
        });
    }
}

impl Deref for MetaBox {
    type Target = Meta;

    fn deref(&self) -> &Meta {
        &self.0
    }
}

impl DerefMut for MetaBox {
    fn deref_mut(&mut self) -> &mut Meta {
        &mut self.0
    }
}

impl Clone for MetaBox {
    fn clone(&self) -> Self {
        let mut copy = MetaBox::new();
        *copy = Meta::clone(self);
        copy
    }
}

impl PartialEq for MetaBox {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for MetaBox {}

impl fmt::Debug for MetaBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Meta::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::MetaBox;
    use crate::Text;

    #[test]
    fn a_dropped_box_comes_back_empty_on_the_same_thread() {
        let mut first = MetaBox::new();
        first.reply_to = Some(Text::from("_INBOX.1"));
        let address: *const super::Meta = &*first;
        drop(first);
        let again = MetaBox::new();
        assert_eq!(&*again as *const super::Meta, address, "reused");
        assert_eq!(*again, super::Meta::default(), "emptied");
    }
}
