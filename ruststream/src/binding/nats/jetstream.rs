//! JetStream: durable streams read through pull consumers. A pull is made
//! only when the runtime waits for the next message and asks for at most
//! `pull_window` messages, so nothing runs ahead of what the app has taken
//! (with a job permit each) by more than that window.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use tokio::time::Instant;

use super::durable;
use super::given_up::{self, GivenUp};
use super::jetstream_delivery::{JetStreamDelivery, nak_soon};
use super::pull::Puller;
use super::{NatsBroker, convert, subjects};
use crate::binding::pull_flow::PullFlow;
use crate::binding::{Broker, Requester, SubscribeOptions, Subscription};
use crate::ingress::ReceiveFlow;
use crate::{Envelope, Error, Message, Result, Text};

/// The stream a [`JetStream`] handle is bound to, and how its consumers pull.
///
/// ```
/// use std::time::Duration;
/// use ruststream::nats::StreamSpec;
///
/// let spec = StreamSpec::new("ORDERS", ["orders.>"])
///     .ack_wait(Duration::from_secs(30))
///     .max_deliver(5)
///     .pull_window(64);
/// assert_eq!(spec.name(), "ORDERS");
/// ```
#[derive(Clone, Debug)]
pub struct StreamSpec {
    name: String,
    subjects: Vec<String>,
    memory_storage: bool,
    ack_wait: Duration,
    max_deliver: i64,
    pull_window: usize,
    pull_expires: Duration,
    inactive_threshold: Duration,
}

impl StreamSpec {
    /// Stream `name` capturing `subjects` (file storage).
    pub fn new<S: Into<String>>(
        name: impl Into<String>,
        subjects: impl IntoIterator<Item = S>,
    ) -> Self {
        StreamSpec {
            name: name.into(),
            subjects: subjects.into_iter().map(Into::into).collect(),
            memory_storage: false,
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            pull_window: 64,
            pull_expires: Duration::from_secs(5),
            inactive_threshold: Duration::ZERO,
        }
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Keep the stream in memory instead of on disk.
    pub fn memory_storage(mut self) -> Self {
        self.memory_storage = true;
        self
    }

    /// How long the server waits for an ack before redelivering (default
    /// 30 s).
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// Deliveries per message before the server gives up on it. By default
    /// a subscriber's consumer gets its `max_attempts` + 1: the runtime
    /// dead-letters a message at that last delivery before the handler
    /// runs ("attempts exhausted"), so a handler that takes the process
    /// down every time ends in the dead letter. A message the server gives
    /// up on (the last delivery got lost too, or the client cannot read the
    /// message) is dead-lettered from the server's advisory, by its stream
    /// sequence. Set here, it applies to every consumer of the stream.
    pub fn max_deliver(mut self, deliveries: i64) -> Self {
        self.max_deliver = deliveries;
        self
    }

    /// Messages one pull asks for at most (default 64): the most a
    /// subscription holds beyond what the runtime has taken.
    pub fn pull_window(mut self, messages: usize) -> Self {
        self.pull_window = messages.max(1);
        self
    }

    /// How long one pull stays open waiting for messages (default 5 s).
    pub fn pull_expires(mut self, expires: Duration) -> Self {
        self.pull_expires = expires;
        self
    }

    /// Delete a queue group's durable consumer after it has had no member
    /// pulling for this long (default: never — the durable is the group's
    /// place in the stream and survives any downtime). Should it be
    /// deleted, the next member recreates it from the ack floor members
    /// checkpoint (at least twice per threshold), not from the start of
    /// the stream. Fan-out subscriptions' own consumers always go five
    /// minutes after their subscription.
    pub fn inactive_threshold(mut self, threshold: Duration) -> Self {
        self.inactive_threshold = threshold;
        self
    }
}

/// JetStream on a [`NatsBroker`] connection, bound to one stream. A broker
/// like any other: subscribers consume through durable pull consumers (one
/// per queue group, named after it) or ephemeral ones (fan-out), and publishes
/// wait for the stream's acknowledgement, so a successful publish is stored.
#[derive(Clone)]
pub struct JetStream {
    nats: NatsBroker,
    context: jetstream::Context,
    spec: Arc<StreamSpec>,
}

impl std::fmt::Debug for JetStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStream")
            .field("stream", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl JetStream {
    pub(super) async fn bind(nats: NatsBroker, spec: StreamSpec) -> Result<Self> {
        let context = jetstream::new(nats.client.clone());
        context
            .get_or_create_stream(stream::Config {
                name: spec.name.clone(),
                subjects: spec.subjects.clone(),
                storage: if spec.memory_storage {
                    stream::StorageType::Memory
                } else {
                    stream::StorageType::File
                },
                ..Default::default()
            })
            .await
            .map_err(|err| {
                Error::Transport(format!("JetStream stream `{}`: {err}", spec.name).into())
            })?;
        Ok(JetStream {
            nats,
            context,
            spec: Arc::new(spec),
        })
    }

    /// The underlying `async-nats` JetStream context.
    pub fn context(&self) -> &jetstream::Context {
        &self.context
    }

    /// The core connection underneath.
    pub fn nats(&self) -> &NatsBroker {
        &self.nats
    }

    /// Deletes the bound stream and everything in it.
    pub async fn delete_stream(&self) -> Result<()> {
        self.context
            .delete_stream(&self.spec.name)
            .await
            .map(|_| ())
            .map_err(|err| Error::Transport(err.into()))
    }
}

impl Broker for JetStream {
    fn as_requester(&self) -> Option<&dyn crate::binding::DynRequester> {
        Some(self)
    }

    type Subscription = JetStreamSubscription;

    fn name(&self) -> &'static str {
        "nats-jetstream"
    }

    async fn subscribe(&self, options: SubscribeOptions) -> Result<JetStreamSubscription> {
        self.nats.ensure_open()?;
        JetStreamSubscription::open(self, options).await
    }

    /// Publishes and waits for the stream's acknowledgement until the
    /// deadline: `Ok` means stored.
    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.nats.ensure_open()?;
        let subject = subjects::publish_subject(subject)?;
        let deadline = self.nats.deadline(deadline);
        let headers = convert::headers(&message)?.unwrap_or_default();
        let payload = message.into_payload();
        let publish = async {
            let ack = self
                .context
                .publish_with_headers(subject, headers, payload)
                .await
                .map_err(|err| Error::Transport(err.into()))?;
            ack.await.map_err(|err| Error::Transport(err.into()))
        };
        match tokio::time::timeout_at(deadline, publish).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => {
                crate::metrics::deadline_exceeded("nats-jetstream");
                Err(Error::DeadlineExceeded(
                    "JetStream did not acknowledge the publish before the deadline",
                ))
            }
        }
    }

    async fn close(&self) -> Result<()> {
        self.nats.close().await
    }
}

/// Requests go over core NATS inboxes on the same connection, to a core
/// NATS responder. A subject the stream captures is refused: the stream
/// would store the request and answer it with its own receipt, which would
/// come back as the reply while the handler's reply came too late.
impl Requester for JetStream {
    async fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        let spec = &self.spec;
        if spec
            .subjects
            .iter()
            .any(|pattern| crate::binding::subject::matches(pattern, subject))
        {
            return Err(Error::Config(format!(
                "`{subject}` is a subject of JetStream stream `{}`: a request there would be \
                 stored, and the stream's receipt would come back as its reply. Request/reply \
                 runs on core NATS: subscribe the responder on a `NatsBroker` and send the \
                 request there (`JetStream::nats()`)",
                spec.name
            )));
        }
        self.nats.send_request(subject, message, timeout).await
    }
}

/// A consumer name NATS accepts: no `.`, `*`, `>` or whitespace.
fn consumer_name(group: &str) -> String {
    group
        .chars()
        .map(|c| match c {
            '.' | '*' | '>' => '_',
            c if c.is_whitespace() => '_',
            c => c,
        })
        .collect()
}

/// A JetStream pull subscription.
pub struct JetStreamSubscription {
    subjects: convert::SubjectCache,
    puller: Puller,
    batch: Option<consumer::pull::Batch>,
    flow: Option<Arc<PullFlow>>,
    shared: Arc<Shared>,
    /// The read-ahead of one that [`ready`](Subscription::ready) waits
    /// for: received, not yet handed to the runtime.
    ahead: Option<JetStreamDelivery>,
    /// Dead-letters what the server gives up on, while this lives.
    _given_up: GivenUp,
}

/// What every delivery of one subscription needs to settle itself.
pub(super) struct Shared {
    pub(super) nats: NatsBroker,
    pub(super) dead_letter: Option<Text>,
}

impl JetStreamSubscription {
    /// A message of the open pull the client has already received, without
    /// waiting (see [`Puller::try_next`]).
    fn take_buffered(&mut self) -> Option<JetStreamDelivery> {
        let (message, attempt) = self.puller.try_next(self.batch.as_mut()?)?;
        Some(JetStreamDelivery::new(
            message,
            attempt,
            &mut self.subjects,
            &self.shared,
        ))
    }

    async fn open(js: &JetStream, options: SubscribeOptions) -> Result<Self> {
        let spec = &js.spec;
        let stream = js
            .context
            .get_stream(&spec.name)
            .await
            .map_err(|err| Error::Transport(err.into()))?;
        // A queue group shares one durable consumer (competing consumers);
        // a fan-out subscription gets its own ephemeral one, from now on.
        let config = consumer::pull::Config {
            durable_name: options.queue_group.as_ref().map(|g| consumer_name(g)),
            deliver_policy: match options.queue_group {
                Some(_) => consumer::DeliverPolicy::All,
                None => consumer::DeliverPolicy::New,
            },
            filter_subject: options.subject.as_str().to_owned(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: spec.ack_wait,
            max_deliver: match (spec.max_deliver, options.max_deliveries) {
                // One delivery more than the attempts: the runtime
                // dead-letters a message at it (attempts exhausted).
                (..=0, Some(attempts)) => i64::from(attempts) + 1,
                (deliveries, _) => deliveries,
            },
            inactive_threshold: match options.queue_group {
                Some(_) => spec.inactive_threshold,
                None => FAN_OUT_INACTIVE,
            },
            ..Default::default()
        };
        let (consumer, checkpoints) = match config.durable_name {
            Some(_) => {
                let (consumer, checkpoints) = durable::open(&js.context, &stream, config).await?;
                (consumer, Some(checkpoints))
            }
            None => {
                let consumer = stream.create_consumer(config).await.map_err(|err| {
                    Error::Transport(
                        format!("JetStream consumer on `{}`: {err}", options.subject).into(),
                    )
                })?;
                (consumer, None)
            }
        };
        let given_up = given_up::watch(
            &js.nats,
            &js.context,
            &spec.name,
            &consumer.cached_info().name,
            options.dead_letter.clone(),
        )
        .await?;
        Ok(JetStreamSubscription {
            ahead: None,
            subjects: convert::SubjectCache::of(options.subject.as_str()),
            puller: Puller::new(
                consumer,
                js.nats.client.clone(),
                js.nats.reconnects.watch(),
                (spec.pull_window, spec.pull_expires, spec.ack_wait),
                checkpoints,
            ),
            batch: None,
            flow: options.receive_flow.then(|| Arc::new(PullFlow::default())),
            shared: Arc::new(Shared {
                nats: js.nats.clone(),
                dead_letter: options.dead_letter,
            }),
            _given_up: given_up,
        })
    }
}

/// How long a fan-out subscription's ephemeral consumer outlives it.
const FAN_OUT_INACTIVE: Duration = Duration::from_secs(300);

impl Subscription for JetStreamSubscription {
    type Delivery = JetStreamDelivery;

    crate::binding::read_ahead_of_one!(JetStreamDelivery, take_buffered);

    async fn next(&mut self) -> Option<JetStreamDelivery> {
        if let Some(delivery) = self.ahead.take() {
            return Some(delivery);
        }
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.shared.nats.ensure_open().is_err() {
                return None;
            }
            if let Some(flow) = &self.flow {
                flow.running().await;
            }
            let batch = match &mut self.batch {
                Some(batch) => batch,
                None => {
                    let pull = self.puller.pull().await;
                    match pull {
                        Ok(batch) => self.batch.insert(batch),
                        Err(err) => {
                            pull_failed(&err, &mut backoff).await;
                            continue;
                        }
                    }
                }
            };
            match self.puller.next(batch).await {
                Some(Ok((message, attempt))) => {
                    return Some(JetStreamDelivery::new(
                        message,
                        attempt,
                        &mut self.subjects,
                        &self.shared,
                    ));
                }
                Some(Err(err)) => {
                    self.batch = None;
                    pull_failed(&err, &mut backoff).await;
                }
                // This pull is complete or expired: the next call pulls again.
                None => self.batch = None,
            }
        }
    }

    fn receive_flow(&self) -> Option<Arc<dyn ReceiveFlow>> {
        self.flow
            .as_ref()
            .map(|flow| Arc::clone(flow) as Arc<dyn ReceiveFlow>)
    }
}

/// A pull that failed (server restarting, connection lost): logged, counted,
/// retried after a bounded backoff. Unacked messages are redelivered by the
/// server, so nothing is lost while the connection comes back.
async fn pull_failed(err: &(dyn std::fmt::Display + Sync), backoff: &mut Duration) {
    tracing::warn!(error = %err, retry_in = ?*backoff, "JetStream pull failed");
    crate::metrics::connection_event("nats-jetstream", "pull_failed");
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(1));
}

impl Drop for JetStreamSubscription {
    /// What the open pull received and the runtime never took goes back
    /// now, so the next consumer (the app's next run, another member) gets
    /// it at once rather than after `ack_wait`.
    fn drop(&mut self) {
        for message in self.puller.received(self.batch.as_mut()) {
            nak_soon(message.split().1);
        }
    }
}
