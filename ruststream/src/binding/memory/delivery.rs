//! The memory Core's subscription stream and delivery handle.

use std::future::poll_fn;
use std::sync::{Arc, Weak};
use std::task::{Poll, ready};

use super::member_flow::MemberFlow;
use super::queue::Queue;
use super::{Connection, Inner};
use crate::binding::{Delivery, Subscription};
use crate::ingress::ReceiveFlow;
use crate::{Envelope, Result};

/// A subscription on a [`MemoryBroker`](super::MemoryBroker).
///
/// Dropping it leaves its queue; when the last member of a queue leaves, the
/// queue is removed and frames still in it are discarded.
pub struct MemorySubscription {
    /// Set for request/reply sources.
    pub(super) flow: Option<Arc<MemberFlow>>,
    pub(super) queue: Arc<Queue>,
    pub(super) broker: Weak<Inner>,
    pub(super) conn: Arc<Connection>,
}

impl Subscription for MemorySubscription {
    type Delivery = MemoryDelivery;

    fn receive_flow(&self) -> Option<Arc<dyn ReceiveFlow>> {
        self.flow
            .as_ref()
            .map(|flow| Arc::clone(flow) as Arc<dyn ReceiveFlow>)
    }

    fn ready(&mut self) -> impl Future<Output = bool> + Send {
        self.queue.wait_ready(&self.conn)
    }

    async fn next(&mut self) -> Option<MemoryDelivery> {
        if self.conn.is_closed() {
            return None;
        }
        // Cooperative budget: a reader by hand with a backlog still lets the
        // other tasks of its runtime run (the runtime's loops use `ready` and
        // `try_next`, and keep a budget of their own).
        poll_fn(|cx| {
            ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
            Poll::Ready(())
        })
        .await;
        let (env, peer) = self.queue.wait_pop(&self.conn).await?;
        Some(MemoryDelivery::new(env, peer, &self.queue))
    }

    #[inline]
    fn try_next(&mut self) -> Option<MemoryDelivery> {
        // An ended subscription (its connection closed) takes nothing more;
        // `ready` then reports the end.
        if self.conn.is_closed() {
            return None;
        }
        let queue = &self.queue;
        queue.try_pop_into(|env, peer| MemoryDelivery::new(env, peer, queue))
    }

    /// One lock for the whole batch.
    fn try_next_batch(&mut self, max: usize, batch: &mut Vec<MemoryDelivery>) -> usize {
        if self.conn.is_closed() {
            return 0;
        }
        let queue = &self.queue;
        queue.try_pop_many(max, |env, peer| {
            batch.push(MemoryDelivery::new(env, peer, queue))
        })
    }
}

impl MemorySubscription {
    /// A requester whose replies come back through this subscription's own
    /// receive FIFO: the single-lane request/reply mode (ClientServer
    /// DEALER-ROUTER in the spec). Data queued before a reply is received
    /// first, each record through the ordinary receive path; the reply
    /// itself completes its caller when it reaches the head, without a
    /// permit, and never shows up as a delivery.
    ///
    /// [`MemoryBroker`](super::MemoryBroker)'s own
    /// [`request_message`](crate::Requester::request_message) is the
    /// two-lane mode: replies come back on a dedicated completion lane.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream::prelude::*;
    /// use ruststream::SubscribeOptions;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let server = MemoryBroker::new();
    /// let mut service = server.subscribe(SubscribeOptions::new("echo")).await?;
    /// let client = server.connect();
    /// let inbox = client.subscribe(SubscribeOptions::new("client.data")).await?;
    /// let requester = inbox.requester();
    ///
    /// let call = tokio::spawn(async move {
    ///     requester.request_message("echo", Message::new("hi"), Duration::from_secs(5)).await
    /// });
    /// let request = service.next().await.unwrap();
    /// let reply_to = request.envelope().reply_to().unwrap().clone();
    /// server.publish_message(&reply_to, Message::new("hi back"), None).await?;
    /// request.ack().await?;
    /// assert_eq!(call.await.unwrap()?.payload(), "hi back".as_bytes());
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    pub fn requester(&self) -> LaneRequester {
        self.queue.carry_replies();
        let broker = self
            .broker
            .upgrade()
            .inspect(|inner| {
                inner
                    .reply_lanes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(self.queue.id, Arc::downgrade(&self.queue));
            })
            .map(|inner| super::MemoryBroker {
                inner,
                conn: Arc::clone(&self.conn),
            });
        LaneRequester {
            broker,
            lane: self.queue.id,
        }
    }
}

/// Requests whose replies share a subscription's receive FIFO (see
/// [`MemorySubscription::requester`]).
#[derive(Clone)]
pub struct LaneRequester {
    pub(super) broker: Option<super::MemoryBroker>,
    pub(super) lane: u64,
}

impl Drop for MemorySubscription {
    fn drop(&mut self) {
        if let Some(flow) = &self.flow {
            flow.retire();
        }
        if self.queue.leave() {
            if let Some(broker) = self.broker.upgrade() {
                broker.registry_write().remove(&self.queue);
            }
            self.queue.close();
        }
    }
}

/// A delivery from the memory Core. Dropped unsettled (for example when a
/// handler is aborted by a shutdown timeout), it is redelivered with attempt + 1
/// to the next consumer of its queue.
pub struct MemoryDelivery {
    /// `Some` until settled.
    env: Option<Envelope>,
    queue: Arc<Queue>,
    /// The publishing peer whose lane it came from: a redelivery goes back
    /// there.
    peer: u64,
}

impl MemoryDelivery {
    #[inline]
    fn new(env: Envelope, peer: u64, queue: &Arc<Queue>) -> Self {
        MemoryDelivery {
            env: Some(env),
            queue: Arc::clone(queue),
            peer,
        }
    }

    #[inline]
    fn take(&mut self) -> Envelope {
        match self.env.take() {
            Some(env) => env,
            None => unreachable!("settlement consumes the delivery"),
        }
    }

    /// Back to the head of its publisher's lane, with attempt + 1.
    #[inline(never)]
    fn redeliver(&self, env: Envelope) {
        let attempt = env.attempt() + 1;
        if !self.queue.requeue(self.peer, env.with_attempt(attempt)) {
            tracing::debug!(subject = %self.queue.subject, "queue closed; unsettled delivery discarded");
        }
    }
}

impl Delivery for MemoryDelivery {
    #[inline]
    fn envelope(&self) -> &Envelope {
        match &self.env {
            Some(env) => env,
            None => unreachable!("settlement consumes the delivery"),
        }
    }

    async fn ack(mut self) -> Result<()> {
        self.take();
        Ok(())
    }

    #[inline]
    fn try_ack(&mut self) -> Option<Result<()>> {
        // Dropped in place: taking it out would copy it first.
        self.env = None;
        Some(Ok(()))
    }

    async fn nack(mut self) -> Result<()> {
        let env = self.take();
        self.redeliver(env);
        Ok(())
    }

    async fn reject(mut self, reason: &str) -> Result<()> {
        let env = self.take();
        let (Some(dead_letter), Some(broker)) =
            (&self.queue.dead_letter, self.queue.broker.upgrade())
        else {
            // Debug: the runtime already logged the rejection and its reason.
            tracing::debug!(
                subject = %env.subject(),
                attempt = env.attempt(),
                reason,
                "message rejected and dropped (no dead-letter subject configured)"
            );
            return Ok(());
        };
        let message = crate::binding::with_dead_letter_headers(env.message().clone(), &env, reason);
        let deadline = super::Deadline::After(broker.publish_timeout);
        match broker.publish(None, dead_letter, message, deadline).await {
            Ok(()) => Ok(()),
            Err(err) => {
                // Losing a rejected message is worse than seeing it again.
                self.redeliver(env);
                Err(err)
            }
        }
    }
}

impl Drop for MemoryDelivery {
    #[inline]
    fn drop(&mut self) {
        if let Some(env) = self.env.take() {
            self.redeliver(env);
        }
    }
}
