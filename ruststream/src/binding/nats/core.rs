//! Core NATS subscriptions: push delivery into the client's bounded
//! subscription buffer, merged with the subscription's private redelivery
//! subject, which is where `nack` sends a message back with attempt + 1.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use futures_util::Stream;
use futures_util::task::AtomicWaker;

use super::{NatsBroker, convert};
use crate::binding::{Broker, Delivery, SubscribeOptions, Subscription};
use crate::message::header;
use crate::{Envelope, Message, Result, Text};

/// A core NATS subscription (see [`NatsBroker`]).
pub struct NatsSubscription {
    subjects: convert::SubjectCache,
    main: async_nats::Subscriber,
    redeliver: async_nats::Subscriber,
    shared: Arc<Shared>,
    /// The read-ahead of one that [`ready`](Subscription::ready) waits
    /// for: received, not yet handed to the runtime.
    ahead: Option<NatsDelivery>,
}

/// What every delivery of one subscription needs to settle itself.
struct Shared {
    broker: NatsBroker,
    /// The subscription's private redelivery subject.
    redeliver_to: String,
    dead_letter: Option<Text>,
    /// Nacked messages on their way back. Only this subscription's own
    /// deliveries publish to its redelivery subject, so while this is 0 the
    /// redelivery stream is not polled at all: one channel read per message.
    redeliveries: AtomicUsize,
    /// Wakes a waiting `next` when a nack starts a redelivery.
    waker: AtomicWaker,
}

impl NatsSubscription {
    /// A message the client has already received, without waiting (and
    /// without registering for a wake-up: the waiting `next` does that).
    #[inline]
    fn take_buffered(&mut self) -> Option<NatsDelivery> {
        if self.shared.broker.ensure_open().is_err() {
            return None;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let shared = &self.shared;
        if shared.redeliveries.load(Ordering::Acquire) == 0 {
            // The common case, made into a delivery where it is received:
            // the client's message (~200 bytes) is not moved on the way.
            let Poll::Ready(Some(message)) = Pin::new(&mut self.main).poll_next(&mut cx) else {
                return None;
            };
            return Some(self.delivery(message, false));
        }
        match self.poll_message(&mut cx, false) {
            Poll::Ready(Some((message, redelivered))) => Some(self.delivery(message, redelivered)),
            _ => None,
        }
    }

    /// The next message, redeliveries first; both streams are cancel-safe
    /// channel reads. With `wait`, a pending poll registers for the
    /// redeliveries too.
    fn poll_message(
        &mut self,
        cx: &mut Context<'_>,
        wait: bool,
    ) -> Poll<Option<(async_nats::Message, bool)>> {
        let shared = &self.shared;
        if shared.broker.closed.load(Ordering::Acquire) {
            return Poll::Ready(None);
        }
        if shared.redeliveries.load(Ordering::Acquire) > 0 {
            if let Poll::Ready(Some(m)) = Pin::new(&mut self.redeliver).poll_next(cx) {
                shared.redeliveries.fetch_sub(1, Ordering::AcqRel);
                return Poll::Ready(Some((m, true)));
            }
        } else if wait {
            shared.waker.register(cx.waker());
            if shared.redeliveries.load(Ordering::Acquire) > 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        Pin::new(&mut self.main)
            .poll_next(cx)
            .map(|m| m.map(|m| (m, false)))
    }

    /// A received message as a delivery.
    #[inline]
    fn delivery(&mut self, message: async_nats::Message, redelivered: bool) -> NatsDelivery {
        let reply = message.reply.as_ref().map(|r| r.as_str());
        let body = convert::message(message.payload, message.headers.as_ref(), reply);
        let env = if redelivered {
            let attempt = message
                .headers
                .as_ref()
                .and_then(|h| h.get(convert::REDELIVERY))
                .and_then(|v| v.as_str().parse().ok())
                .unwrap_or(2);
            let subject = body
                .headers()
                .get(header::ORIGINAL_SUBJECT)
                .unwrap_or(message.subject.as_str())
                .to_owned();
            let mut body = body;
            body.headers_mut().remove(header::ORIGINAL_SUBJECT);
            convert::envelope(&subject, body, attempt)
        } else {
            let subject = self.subjects.text(message.subject.as_str());
            Envelope::new(subject, body)
        };
        NatsDelivery {
            env,
            shared: Arc::clone(&self.shared),
        }
    }

    pub(super) async fn open(broker: NatsBroker, options: SubscribeOptions) -> Result<Self> {
        let client = broker.client.clone();
        let subject = options.subject.as_str().to_owned();
        let subscribe_error = |err: async_nats::SubscribeError| {
            crate::Error::Transport(format!("NATS subscribe to `{subject}`: {err}").into())
        };
        let main = match &options.queue_group {
            Some(group) => client
                .queue_subscribe(subject.clone(), group.as_str().to_owned())
                .await
                .map_err(subscribe_error)?,
            None => client
                .subscribe(subject.clone())
                .await
                .map_err(subscribe_error)?,
        };
        let redeliver_to = client.new_inbox();
        let redeliver = client
            .subscribe(redeliver_to.clone())
            .await
            .map_err(subscribe_error)?;
        // Subscribed once the server has seen the SUBs: messages published
        // after this returns reach the subscription.
        client
            .flush()
            .await
            .map_err(|err| crate::Error::Transport(err.into()))?;
        Ok(NatsSubscription {
            ahead: None,
            subjects: convert::SubjectCache::core(&subject),
            main,
            redeliver,
            shared: Arc::new(Shared {
                broker,
                redeliver_to,
                dead_letter: options.dead_letter,
                redeliveries: AtomicUsize::new(0),
                waker: AtomicWaker::new(),
            }),
        })
    }
}

impl Subscription for NatsSubscription {
    type Delivery = NatsDelivery;

    crate::binding::read_ahead_of_one!(NatsDelivery, take_buffered);

    async fn next(&mut self) -> Option<NatsDelivery> {
        if let Some(delivery) = self.ahead.take() {
            return Some(delivery);
        }
        if self.shared.broker.ensure_open().is_err() {
            return None;
        }
        let (message, redelivered) = poll_fn(|cx| self.poll_message(cx, true)).await?;
        Some(self.delivery(message, redelivered))
    }
}

/// A delivery from a core NATS subscription.
pub struct NatsDelivery {
    env: Envelope,
    shared: Arc<Shared>,
}

impl Delivery for NatsDelivery {
    fn envelope(&self) -> &Envelope {
        &self.env
    }

    /// Core NATS has no acknowledgements: nothing to do.
    async fn ack(self) -> Result<()> {
        Ok(())
    }

    /// Done at once: there is nothing to send.
    #[inline]
    fn try_ack(&mut self) -> Option<Result<()>> {
        Some(Ok(()))
    }

    /// Sends the message back to this subscription (only) with attempt + 1,
    /// with its reply address: a request's retry answers the caller.
    async fn nack(self) -> Result<()> {
        let attempt = self.env.attempt() + 1;
        let subject = self.env.subject().clone();
        let message = self
            .env
            .into_message()
            .with_header(header::ORIGINAL_SUBJECT, subject)
            .with_header(convert::REDELIVERY, attempt.to_string());
        let shared = &self.shared;
        shared.redeliveries.fetch_add(1, Ordering::AcqRel);
        shared.waker.wake();
        let sent = shared
            .broker
            .publish_message(&shared.redeliver_to, message, None)
            .await;
        if sent.is_err() {
            shared.redeliveries.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Publishes to the dead-letter subject with the reason, or drops the
    /// message with a warning when there is none.
    async fn reject(self, reason: &str) -> Result<()> {
        let Some(dead_letter) = &self.shared.dead_letter else {
            // Debug: the runtime already logged the rejection and its reason.
            tracing::debug!(
                subject = %self.env.subject(),
                attempt = self.env.attempt(),
                reason,
                "message rejected and dropped (no dead-letter subject configured)"
            );
            return Ok(());
        };
        let message = dead_letter_message(self.env, reason);
        self.shared
            .broker
            .publish_message(dead_letter, message, None)
            .await
    }
}

/// A dead-lettered copy answers nobody: the request it was has had its
/// failure reply.
fn without_reply(message: Message) -> Message {
    let mut out = Message::new(message.payload().clone()).with_headers(message.headers().clone());
    if let Some(key) = message.key() {
        out = out.with_key(key.clone());
    }
    if let Some(id) = message.correlation_id() {
        out = out.with_correlation_id(id.clone());
    }
    out
}

/// The dead-letter copy of `env`: original subject, reason and attempt in
/// headers (the same headers the memory broker writes).
pub(super) fn dead_letter_message(env: Envelope, reason: &str) -> Message {
    crate::binding::with_dead_letter_headers(without_reply(env.message().clone()), &env, reason)
}
