//! What a request's caller gets back: the handler's reply, or the failure
//! that ended the request, published to its reply subject.

use super::Unit;
use crate::binding::{Broker, Delivery};
use crate::message::header;
use crate::subscriber::Subscriber;
use crate::{Message, Text};

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// The message of a handler's reply, with its codec's content type.
    pub(crate) fn reply_message(&self, reply: bytes::Bytes) -> Message {
        let mut reply = Message::new(reply);
        if let Some(content_type) = self.subscriber.reply_content_type() {
            crate::codec::stamp(&mut reply, content_type);
        }
        reply
    }

    /// Hands a handler's reply straight to its caller when the caller waits
    /// in this process and nothing observes outgoing messages: `None` then.
    /// Otherwise the message comes back, for [`reply`](Self::reply).
    #[inline]
    pub(crate) fn reply_at_once<D: Delivery>(
        &self,
        delivery: &D,
        message: Message,
    ) -> Option<Message> {
        let env = delivery.envelope();
        match env.reply_port() {
            Some(port)
                if env.correlation_id().is_none() && self.app.outgoing().observed().is_none() =>
            {
                port.complete(message);
                None
            }
            _ => Some(message),
        }
    }

    /// Publishes a reply when the delivery is a request. A reply that cannot be
    /// published is logged: the caller's own timeout reports it.
    /// A failed reply carries its `status`; a successful one none.
    pub(crate) async fn reply<D: Delivery>(
        &self,
        delivery: &D,
        mut message: Message,
        status: Option<&'static str>,
    ) {
        let env = delivery.envelope();
        if !env.expects_reply() {
            return;
        }
        if let Some(status) = status {
            message
                .headers_mut()
                .insert(Text::from_static(header::STATUS), Text::from_static(status));
        }
        if let Some(id) = env.correlation_id() {
            message = message.with_correlation_id(id.clone());
        }
        let outgoing = self.app.outgoing();
        let name = self.broker.name();
        let sent = match env.reply_port() {
            // The caller waits in this process: the reply goes straight to
            // it (the subject is made only for an observer that reads it).
            Some(port) => crate::outgoing::send!(outgoing, Reply, name, port.subject(), message, {
                port.complete(message);
                std::future::ready(Ok::<(), crate::Error>(()))
            }),
            None => {
                let reply_to = env.reply_to().expect("a request has a reply subject");
                crate::outgoing::send!(
                    outgoing,
                    Reply,
                    name,
                    reply_to,
                    message,
                    self.broker.publish_message(reply_to, message, None)
                )
            }
        };
        if let Err(err) = sent {
            tracing::warn!(subject = %env.subject(), reply_to = ?env.reply_to(), error = %err, "reply not published");
        }
    }
}

/// Why a request an accept layer skipped has no answer.
pub(super) const SKIPPED: &str = "an accept layer skipped the request: its handler did not run";

/// The reply of a request that failed: the reason in a header, no body.
pub(super) fn error_reply(reason: &str) -> Message {
    Message::new(bytes::Bytes::new()).with_header(header::ERROR, reason)
}
