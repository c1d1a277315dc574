//! One publish on the memory Core: the route, admission to every target
//! queue, and — only when a queue is full — the wait for space until the
//! deadline (three-stage backpressure), in a future of its own so publishes
//! that never wait stay small.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::Instant;

use super::queue::{Queue, Refused};
use super::registry::Targets;
use super::route_cache;
use super::{Connection, Inner, connection_closed, queue_closed};
use crate::{Envelope, Error, Message, Result, Text};

impl Inner {
    /// One publish. The common case is synchronous once the cooperative
    /// budget allows it: the route is looked up and every target queue admits
    /// the frame under the registry's read lock, with nothing cloned but the
    /// subject. Only a publish that must wait for space leaves that
    /// path, for a boxed future that owns what it needs, so the waiting state
    /// never inflates the futures of publishes that do not wait.
    ///
    /// `conn` is the publishing connection, checked first (a closed one
    /// refuses); internal publishes (dead-lettering, requests) pass `None`.
    #[inline]
    pub(crate) fn publish<'a, 's>(
        &'a self,
        conn: Option<&'a Arc<Connection>>,
        subject: &'s str,
        message: Message,
        deadline: Deadline,
    ) -> Publish<'a, 's> {
        Publish {
            inner: self,
            state: PublishState::Start {
                peer: conn.map_or(0, |conn| conn.id),
                conn,
                subject,
                message: Some(message),
                deadline,
            },
        }
    }

    /// The publish of a request, from connection `conn`: a plain call, as it
    /// never waits (JQ-19: a full or paused queue refuses it at once), and
    /// the route lookup that admits it also finds whether anyone responds
    /// (`NoResponders` if nobody does). Its subject is never an inbox's: a
    /// request is no reply.
    pub(super) fn publish_request(
        &self,
        conn: &Connection,
        subject: &str,
        message: Message,
    ) -> Result<()> {
        if conn.is_closed() {
            return Err(connection_closed());
        }
        match self.publish_now(conn.id, subject, message, true) {
            Ok(()) => Ok(()),
            Err(Stalled::Failed(err)) => Err(err),
            Err(Stalled::Full(refused)) => refused.refuse_request(),
        }
    }

    /// Routes and admits `message` without waiting: `Stalled::Full` at the
    /// first target queue that has no room (the ones before it keep the
    /// frame, as with a waiting publish).
    /// `request`: a subject with no subscribers fails with `NoResponders`
    /// rather than dropping the message.
    #[inline]
    fn publish_now(
        &self,
        peer: u64,
        subject: &str,
        message: Message,
        request: bool,
    ) -> Result<(), Stalled> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(route) = route_cache::get(self.id, generation, subject) {
            // A queue that left since is skipped (see `route_cache`).
            return push_now(peer, &route.queues, &route.subject, message, true).map_err(|stall| {
                stall.into_stalled(peer, || Targets::Shared(Arc::clone(&route)), &route.subject)
            });
        }
        let registry = self.registry_read();
        let targets = match registry.exact(subject) {
            Ok(Some(route)) => {
                // Read under the lock: no change can come between.
                let generation = self.generation.load(Ordering::Acquire);
                route_cache::put(self.id, generation, route);
                return push_now(peer, &route.queues, &route.subject, message, false).map_err(
                    |stall| {
                        stall.into_stalled(
                            peer,
                            || Targets::Shared(Arc::clone(route)),
                            &route.subject,
                        )
                    },
                );
            }
            Ok(None) => None,
            Err(()) => registry.targets(subject),
        };
        drop(registry);
        let Some(targets) = targets else {
            if request {
                return Err(Stalled::Failed(Error::NoResponders(subject.to_owned())));
            }
            tracing::trace!(subject, "no subscribers; message dropped");
            return Ok(());
        };
        let subject = Text::from(subject);
        push_now(peer, targets.queues(), &subject, message, false)
            .map_err(|stall| stall.into_stalled(peer, || targets, &subject))
    }
}

/// When a waiting publish gives up.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    /// At this instant.
    At(Instant),
    /// This long after it starts waiting: the clock is read only when a
    /// publish has to wait, never on the fast path.
    After(Duration),
}

impl Deadline {
    fn resolve(self) -> Instant {
        match self {
            Deadline::At(at) => at,
            Deadline::After(wait) => Instant::now() + wait,
        }
    }
}

/// The future of one publish ([`Inner::publish`]): a hand-written state
/// machine, so the path that does not wait is one plain function call per
/// poll rather than nested `async` state.
pub(crate) struct Publish<'a, 's> {
    inner: &'a Inner,
    state: PublishState<'a, 's>,
}

enum PublishState<'a, 's> {
    /// Not admitted yet; `message` is `None` once handed on (the publish
    /// is then finished or waiting).
    Start {
        /// The publishing connection's id, kept across polls.
        peer: u64,
        conn: Option<&'a Arc<Connection>>,
        subject: &'s str,
        message: Option<Message>,
        deadline: Deadline,
    },
    /// Waiting for space, out of line.
    Waiting(Pin<Box<dyn Future<Output = Result<()>> + Send>>),
    Done,
}

impl Future for Publish<'_, '_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        let inner = this.inner;
        match &mut this.state {
            PublishState::Start {
                peer,
                conn,
                subject,
                message,
                deadline,
            } => {
                let (peer, conn, subject) = (*peer, *conn, *subject);
                if conn.is_some_and(|conn| conn.is_closed()) {
                    this.state = PublishState::Done;
                    return Poll::Ready(Err(connection_closed()));
                }
                // Inbox subjects start with `_`: one byte compare on every
                // publish, the whole prefix only for candidates.
                if subject.as_bytes().first() == Some(&b'_')
                    && subject.starts_with(inner.inbox.prefix())
                {
                    let message = take_message(message);
                    let rest = &subject[inner.inbox.prefix().len()..];
                    let Some(lane) = rest.strip_prefix('L') else {
                        // Two-lane: the completion lane, straight to the caller.
                        inner.complete(rest, subject, message);
                        return Poll::Ready(Ok(()));
                    };
                    // Single-lane: the reply queues in the requester's own
                    // FIFO, under its HWM and pause like any frame.
                    let Some(queue) = inner.reply_lane(lane) else {
                        crate::metrics::late_reply("memory");
                        return Poll::Ready(Ok(()));
                    };
                    let subject = Text::from(subject);
                    match push_now(peer, std::slice::from_ref(&queue), &subject, message, false) {
                        Ok(()) => return Poll::Ready(Ok(())),
                        Err(stall) => {
                            match stall.into_stalled(peer, || Targets::Owned(vec![queue]), &subject)
                            {
                                Stalled::Failed(err) => return Poll::Ready(Err(err)),
                                Stalled::Full(waiting) => {
                                    let deadline = *deadline;
                                    this.state = PublishState::Waiting(Box::pin(
                                        waiting.wait(deadline, conn.cloned()),
                                    ));
                                }
                            }
                        }
                    }
                } else {
                    // Cooperative budget: a publisher that never has to wait
                    // still lets the other tasks of its runtime run.
                    ready!(crate::coop::poll_publish(cx));
                    let message = take_message(message);
                    match inner.publish_now(peer, subject, message, false) {
                        Ok(()) => return Poll::Ready(Ok(())),
                        Err(Stalled::Failed(err)) => return Poll::Ready(Err(err)),
                        Err(Stalled::Full(waiting)) => {
                            let deadline = *deadline;
                            this.state = PublishState::Waiting(Box::pin(
                                waiting.wait(deadline, conn.cloned()),
                            ));
                        }
                    }
                }
            }
            PublishState::Waiting(_) => {}
            PublishState::Done => panic!("publish future polled after completion"),
        }
        let PublishState::Waiting(waiting) = &mut this.state else {
            unreachable!("only a waiting publish gets here")
        };
        let result = ready!(waiting.as_mut().poll(cx));
        this.state = PublishState::Done;
        Poll::Ready(result)
    }
}

/// The message of a publish in its start state: taken once, where a
/// whole-state swap would move every field.
#[inline]
fn take_message(message: &mut Option<Message>) -> Message {
    match message.take() {
        Some(message) => message,
        None => panic!("publish future polled after completion"),
    }
}

/// Why a publish could not finish without waiting.
enum Stalled {
    /// It failed for good (a target queue is closed).
    Failed(Error),
    /// A target queue is full: wait for space there, then go on.
    Full(Box<Waiting>),
}

/// A publish that has to wait for space in `targets[at]`; the queues before
/// `at` already admitted the frame.
struct Waiting {
    peer: u64,
    targets: Targets,
    subject: Text,
    at: usize,
    env: Envelope,
    /// The message for the queues after `at`, if any.
    rest: Option<Message>,
}

impl Waiting {
    /// Offers the message once to every target after `at`, none waiting
    /// (a queue closed since the route was read is passed over, as a
    /// publish racing an unsubscribe does): whether any target has taken
    /// it, and the frames refused for want of space with their queues'
    /// places (the one at `at` first).
    fn offer_rest(self) -> (Targets, bool, Vec<(usize, Envelope)>) {
        let queues = self.targets.queues();
        let mut taken = self.at > 0;
        let mut refused = vec![(self.at, self.env)];
        let mut from = self.at + 1;
        let mut rest = self.rest;
        while let Some(message) = rest.take() {
            match push_now(self.peer, &queues[from..], &self.subject, message, true) {
                Ok(()) => taken = true,
                Err(PushStall::Closed) => unreachable!("closed queues are passed over"),
                Err(PushStall::Full {
                    at,
                    env,
                    rest: after,
                }) => {
                    taken |= at > 0;
                    refused.push((from + at, env));
                    from += at + 1;
                    rest = after;
                }
            }
        }
        (self.targets, taken, refused)
    }

    /// A request that a full or paused queue refused: it does not wait for
    /// space (JQ-19). It stands if any target took it (a reply may come
    /// from there); when none did it fails at once, and its caller decides
    /// what to do.
    fn refuse_request(self) -> Result<()> {
        let subject = self.subject.clone();
        let (_, taken, _) = self.offer_rest();
        if taken {
            tracing::debug!(%subject, "a full or paused queue did not take the request; others did");
            return Ok(());
        }
        crate::metrics::deadline_exceeded("memory");
        Err(Error::DeadlineExceeded(
            "the receive queue is full or paused, and a request does not wait for space",
        ))
    }

    /// The three stages for the queues that refused: every target has had
    /// its offer first (a full subscription never holds up the others),
    /// then each full one is waited for until the shared deadline and
    /// offered once more. Each subscription is independent, as on NATS: the
    /// publish succeeds once any queue took it, and a queue that stayed
    /// full misses this message, which is observed (a warning, the
    /// `deadline_exceeded` metric), not the publish's result (JQ-19). It
    /// fails only when no queue took it. The publishing connection closing
    /// ends every wait (first terminal wins).
    async fn wait(self, deadline: Deadline, conn: Option<Arc<Connection>>) -> Result<()> {
        let (peer, subject) = (self.peer, self.subject.clone());
        let (targets, mut taken, refused) = self.offer_rest();
        let queues = targets.queues();
        let deadline = deadline.resolve();
        let mut failed = None;
        for (at, env) in refused {
            match queues[at]
                .wait_push(peer, conn.as_deref(), env, deadline)
                .await
            {
                Ok(()) => taken = true,
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
        }
        match failed {
            None => Ok(()),
            Some(err) if taken => {
                tracing::warn!(%subject, error = %err, "a subscription's queue stayed full: it misses this message, the others have it");
                Ok(())
            }
            Some(err) => Err(err),
        }
    }
}

/// How `push_now` stopped.
enum PushStall {
    Closed,
    Full {
        at: usize,
        env: Envelope,
        rest: Option<Message>,
    },
}

impl PushStall {
    fn into_stalled(self, peer: u64, targets: impl FnOnce() -> Targets, subject: &Text) -> Stalled {
        match self {
            PushStall::Closed => Stalled::Failed(queue_closed()),
            PushStall::Full { at, env, rest } => Stalled::Full(Box::new(Waiting {
                peer,
                targets: targets(),
                subject: subject.clone(),
                at,
                env,
                rest,
            })),
        }
    }
}

/// Offers the frame to every queue in order without waiting, stopping at
/// the first one that refuses it. With `skip_closed`, a closed queue (one
/// that left the route since it was cached) is passed over.
// The refused frame comes back by value: boxing it would allocate on the path
// that is already under pressure.
#[allow(clippy::result_large_err)]
fn push_now(
    peer: u64,
    queues: &[Arc<Queue>],
    subject: &Text,
    message: Message,
    skip_closed: bool,
) -> Result<(), PushStall> {
    let Some((last, rest)) = queues.split_last() else {
        return Ok(());
    };
    for (at, queue) in rest.iter().enumerate() {
        match queue.try_push(peer, Envelope::new(subject.clone(), message.clone())) {
            Ok(()) => {}
            Err(Refused::Closed) if skip_closed => {}
            Err(Refused::Closed) => return Err(PushStall::Closed),
            Err(Refused::Full(env)) => {
                return Err(PushStall::Full {
                    at,
                    env,
                    rest: Some(message),
                });
            }
        }
    }
    match last.try_push(peer, Envelope::new(subject.clone(), message)) {
        Ok(()) => Ok(()),
        Err(Refused::Closed) if skip_closed => Ok(()),
        Err(Refused::Closed) => Err(PushStall::Closed),
        Err(Refused::Full(env)) => Err(PushStall::Full {
            at: rest.len(),
            env,
            rest: None,
        }),
    }
}
