//! A request's way back to a caller in the same process: the broker's inbox
//! and the request's slot in it. A handler's reply is handed to the caller
//! through it directly, with no subject to make, route or parse; the reply
//! subject is written only if someone asks for it (`reply_to`), and a reply
//! published to that subject finds the same slot.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::{Message, Text};

/// Where requests wait for their replies, by id.
pub(crate) trait ReplyInbox: Send + Sync + 'static {
    /// Hands `reply` to request `id` if it still waits and has no reply yet;
    /// a late or duplicate reply is dropped (first terminal wins).
    fn complete(&self, id: u64, reply: Message);

    /// The subject a reply to request `id` can be published to.
    fn subject(&self, id: u64) -> Text;
}

/// The reply address of one request whose caller waits in this process.
#[derive(Clone)]
pub(crate) struct ReplyPort {
    /// Strong: a request waiting in one of the broker's queues keeps the
    /// broker alive only as long as that queue holds frames, and a queue
    /// drops its frames when its last subscription leaves.
    inbox: Arc<dyn ReplyInbox>,
    id: u64,
    /// Made on first read: most replies never need it.
    subject: OnceLock<Text>,
}

impl ReplyPort {
    pub(crate) fn new(inbox: Arc<dyn ReplyInbox>, id: u64) -> Self {
        ReplyPort {
            inbox,
            id,
            subject: OnceLock::new(),
        }
    }

    /// The reply subject, made the first time it is asked for.
    pub(crate) fn subject(&self) -> &Text {
        self.subject.get_or_init(|| self.inbox.subject(self.id))
    }

    /// Hands `reply` to the waiting caller (or drops it, if the request
    /// already ended).
    pub(crate) fn complete(&self, reply: Message) {
        self.inbox.complete(self.id, reply);
    }
}

impl PartialEq for ReplyPort {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && std::ptr::addr_eq(Arc::as_ptr(&self.inbox), Arc::as_ptr(&other.inbox))
    }
}

impl Eq for ReplyPort {}

impl fmt::Debug for ReplyPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReplyPort").field(self.subject()).finish()
    }
}
