//! Request/reply on the memory Core: inboxes that complete callers directly
//! (two lanes), and replies that travel a subscription's own FIFO (one lane).

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use super::delivery::LaneRequester;
use super::inbox;
use super::queue::Queue;
use super::{Inner, MemoryBroker, connection_closed};
use crate::binding::Requester;
use crate::reply_port::{ReplyInbox, ReplyPort};
use crate::{Envelope, Error, Message, Result, Text};

impl Inner {
    /// The single-lane queue a reply to `{prefix}L<queue>.<id>` goes to.
    pub(super) fn reply_lane(&self, rest: &str) -> Option<Arc<Queue>> {
        let queue = rest.split('.').next()?.parse::<u64>().ok()?;
        self.reply_lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&queue)?
            .upgrade()
    }

    pub(super) fn forget_reply_lane(&self, queue: u64) {
        self.reply_lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&queue);
    }

    /// A single-lane reply that reached the head of its queue: it completes
    /// its caller without a permit.
    pub(crate) fn complete_lane_reply(&self, env: Envelope) {
        let subject = env.subject().clone();
        let id = subject[self.inbox.prefix().len()..]
            .split('.')
            .nth(1)
            .unwrap_or("");
        self.complete(id, &subject, env.into_message());
    }

    /// Completion supply: a reply goes straight to its waiting caller.
    /// A reply for a request that already ended is dropped: first terminal wins.
    pub(super) fn complete(&self, id: &str, subject: &str, message: Message) {
        match inbox::parse_id(id) {
            Some(id) => ReplyInbox::complete(self, id, message),
            None => late_reply(subject),
        }
    }
}

/// A handler's reply to a two-lane request reaches its caller here, with no
/// subject on the way.
impl ReplyInbox for Inner {
    fn complete(&self, id: u64, reply: Message) {
        if !self.inbox.complete(id, reply) {
            late_reply(self.inbox.prefix());
        }
    }

    fn subject(&self, id: u64) -> Text {
        self.inbox.subject(id, None)
    }
}

fn late_reply(subject: &str) {
    crate::metrics::late_reply("memory");
    tracing::debug!(subject, "late or unknown reply dropped");
}

/// Releases a request's inbox slot however the request ends.
struct InboxGuard<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for InboxGuard<'_> {
    fn drop(&mut self) {
        self.inner.inbox.close(self.id);
    }
}

impl Requester for MemoryBroker {
    fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Envelope>> + Send {
        self.request_via(None, subject, message, timeout, Reply::AsItCame)
    }

    /// The same request as [`send_request`](Self::send_request), checked in
    /// place: one future, not one inside another.
    fn request_message(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Envelope>> + Send {
        self.request_via(None, subject, message, timeout, Reply::Checked)
    }
}

/// What a request hands back.
#[derive(Clone, Copy)]
enum Reply {
    /// The reply as it came ([`Requester::send_request`]).
    AsItCame,
    /// A reply that reports a failure as that error
    /// ([`Requester::request_message`]).
    Checked,
}

impl MemoryBroker {
    /// One request. `lane` is the single-lane queue its reply must come back
    /// through; `None` is the two-lane completion path.
    async fn request_via(
        &self,
        lane: Option<u64>,
        subject: &str,
        message: Message,
        timeout: Duration,
        wants: Reply,
    ) -> Result<Envelope> {
        let inner = &*self.inner;
        let id = inner.inbox.open();
        let _guard = InboxGuard { inner, id };
        let message = match lane {
            // Its reply travels the lane's queue, by subject.
            Some(queue) => message.with_reply_to(inner.inbox.subject(id, Some(queue))),
            // A handler's reply is handed over directly.
            None => message.with_reply_port(ReplyPort::new(self.inner.clone(), id)),
        };
        inner.publish_request(&self.conn, subject, message)?;
        let mut reply = std::pin::pin!(std::future::poll_fn(|cx| inner.inbox.poll_reply(id, cx)));
        // A reply from a handler on the same runtime usually comes back
        // while this task yields once, and then the request never arms (and
        // clears) a timer of its own: the timer was most of a round trip's
        // cost. A request just published has no reply yet, so the inbox is
        // looked at only after the yield.
        let mut yielded = false;
        let at_once = std::future::poll_fn(|cx| {
            if !yielded {
                yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(reply.as_mut().poll(cx))
        })
        .await;
        let reply = match at_once {
            Poll::Ready(reply) => reply,
            // The clock is read only now, for a reply that did not come at
            // once: the publish before never waits, so the timeout starts
            // one turn of the runtime later than the call, not more.
            Poll::Pending => tokio::time::timeout(timeout, reply)
                .await
                .map_err(|_| Error::Timeout(timeout))?,
        };
        match wants {
            Reply::Checked => crate::binding::reply_result(reply),
            Reply::AsItCame => Ok(reply),
        }
    }
}

impl LaneRequester {
    /// Sends a request whose reply comes back through the subscription's own
    /// receive FIFO (single-lane). The reply waits behind frames queued
    /// before it and under the queue's HWM and pause; once it reaches the head
    /// it completes this call without a job permit. A reply that arrives
    /// after `timeout` is dropped: the first terminal result wins. A reply
    /// that reports a failure is an error, as in
    /// [`Requester::request_message`].
    pub async fn request_message(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        let Some(broker) = &self.broker else {
            return Err(connection_closed());
        };
        broker
            .request_via(Some(self.lane), subject, message, timeout, Reply::Checked)
            .await
    }
}
