//! One Redis Streams subscription: a consumer in a consumer group, reading on
//! a connection of its own, claiming entries left pending too long.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManager;
use redis::streams::StreamPendingCountReply;
use tokio::time::Instant;

use super::entry::{self, Entry};
use super::{RedisBroker, field, transport};
use crate::binding::pull_flow::PullFlow;
use crate::binding::{Delivery, SubscribeOptions, Subscription};
use crate::ingress::{JobPermit, JobQueue, ReceiveFlow};
use crate::message::header;
use crate::{Envelope, Error, Result, Text};

static NEXT_CONSUMER: AtomicU64 = AtomicU64::new(1);

/// A Redis Streams subscription (see [`RedisBroker`]).
pub struct RedisSubscription {
    reader: ConnectionManager,
    /// Set for request/reply sources: PAUSED stops issuing reads.
    flow: Option<Arc<PullFlow>>,
    shared: Arc<Shared>,
    consumer: String,
    /// Read records, each with the job permit it was asked for under
    /// (`None` for the first of a read: the read-ahead of one that `ready`
    /// waits for, taken by the runtime with a permit of its own).
    buffer: VecDeque<(Entry, u32, Option<JobPermit>)>,
    jobs: Option<Arc<JobQueue>>,
    last_claim: Instant,
    /// Where the next claim goes on scanning the pending entries.
    claim_cursor: String,
    /// A fan-out subscription's group is its own: destroyed when it drops.
    own_group: bool,
    /// The read-ahead of one that [`ready`](Subscription::ready) waits
    /// for: received, not yet handed to the runtime.
    ahead: Option<RedisDelivery>,
}

/// What deliveries need to settle themselves.
struct Shared {
    broker: RedisBroker,
    stream: String,
    subject: Text,
    group: String,
    dead_letter: Option<Text>,
}

impl RedisSubscription {
    /// An entry the last `XREADGROUP COUNT n` buffered, without waiting:
    /// it gives back the permit it was read under, as the runtime holds
    /// one for it.
    fn take_buffered(&mut self) -> Option<RedisDelivery> {
        let (entry, attempt, permit) = self.buffer.pop_front()?;
        drop(permit);
        Some(RedisDelivery::new(entry, attempt, &self.shared))
    }

    pub(super) async fn open(broker: RedisBroker, options: SubscribeOptions) -> Result<Self> {
        let settings = &broker.inner.settings;
        let n = NEXT_CONSUMER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let (group, own_group) = match &options.queue_group {
            Some(group) => (group.as_str().to_owned(), false),
            None => (format!("rs-fanout-{pid}-{n}"), true),
        };
        let stream = options.subject.as_str().to_owned();
        // New entries only; the group (and the stream) may exist already.
        let created = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(&group)
            .arg("$")
            .arg("MKSTREAM")
            .query_async::<Value>(&mut broker.conn())
            .await;
        if let Err(err) = created
            && err.code() != Some("BUSYGROUP")
        {
            return Err(Error::Transport(
                format!("Redis consumer group `{group}` on `{stream}`: {err}").into(),
            ));
        }
        let reader = super::connection(
            &broker.inner.client,
            Some(settings.block + Duration::from_secs(5)),
        )
        .await
        .map_err(transport)?;
        Ok(RedisSubscription {
            ahead: None,
            reader,
            flow: options.receive_flow.then(|| Arc::new(PullFlow::default())),
            consumer: format!("rs-{pid}-{n}"),
            buffer: VecDeque::new(),
            jobs: None,
            last_claim: Instant::now(),
            claim_cursor: START.to_owned(),
            own_group,
            shared: Arc::new(Shared {
                broker,
                stream,
                subject: options.subject,
                group,
                dead_letter: options.dead_letter,
            }),
        })
    }

    /// Claims entries pending longer than `claim_idle` (nacked, or held by a
    /// consumer that went away), with their delivery counts as attempts.
    ///
    /// Pages are as large as reads: one record plus one per extra permit.
    /// A full page means more may be waiting — a crashed consumer's
    /// backlog — so the next call claims on at once from where this one
    /// stopped, and a takeover runs at read speed. An entry delivered
    /// twice already without being settled is claimed alone: if it takes
    /// the process down again, nothing else goes down with it (and counts
    /// a delivery for it).
    async fn claim(&mut self) -> redis::RedisResult<()> {
        let settings = &self.shared.broker.inner.settings;
        let idle = settings.claim_idle.as_millis() as u64;
        let (count, permits) = self.read_size();
        // Acks still buffered go first: an acked entry is never claimed.
        let mut pipe = redis::pipe();
        self.shared.broker.take_acks(&mut pipe);
        pipe.cmd("XPENDING")
            .arg(&self.shared.stream)
            .arg(&self.shared.group)
            .arg("IDLE")
            .arg(idle)
            .arg(&self.claim_cursor)
            .arg("+")
            .arg(count);
        let (pending,): (StreamPendingCountReply,) = pipe.query_async(&mut self.reader).await?;
        let take: &[_] = match pending.ids.split_first() {
            None => &[],
            Some((first, _)) if first.times_delivered >= 2 => std::slice::from_ref(first),
            Some(_) => {
                let fresh = pending.ids.iter().take_while(|p| p.times_delivered < 2);
                &pending.ids[..fresh.count()]
            }
        };
        let more = take.len() < pending.ids.len() || pending.ids.len() >= count;
        self.claim_cursor = match take.last() {
            Some(last) if more => format!("({}", last.id),
            _ => START.to_owned(),
        };
        if more {
            self.last_claim = Instant::now()
                .checked_sub(claim_every(settings.claim_idle))
                .unwrap_or(self.last_claim);
        }
        if take.is_empty() {
            return Ok(());
        }
        let attempts: HashMap<&str, usize> = take
            .iter()
            .map(|p| (p.id.as_str(), p.times_delivered + 1))
            .collect();
        let claimed: Value = redis::cmd("XCLAIM")
            .arg(&self.shared.stream)
            .arg(&self.shared.group)
            .arg(&self.consumer)
            .arg(idle)
            .arg(take.iter().map(|p| p.id.as_str()).collect::<Vec<_>>())
            .query_async(&mut self.reader)
            .await?;
        let claimed = entry::entries(claimed)
            .into_iter()
            .map(|entry| {
                let attempt = attempts.get(entry.id.as_str()).copied().unwrap_or(2);
                (entry, u32::try_from(attempt).unwrap_or(u32::MAX))
            })
            .collect();
        self.take(claimed, permits).await
    }

    /// Permits for a read beyond the first record: as many as are free now
    /// while one more stays free, up to `read_count − 1`, taken without
    /// waiting.
    fn extra_permits(&self) -> Vec<JobPermit> {
        let want = self.shared.broker.inner.settings.read_count - 1;
        let Some(jobs) = &self.jobs else {
            return Vec::new();
        };
        std::iter::from_fn(|| jobs.try_acquire_extra())
            .take(want)
            .collect()
    }

    /// How many records one read or claim asks for, with the extra permits
    /// that cover them: `read_count` without a job queue, else one (the
    /// runtime's permit) plus one per permit free now.
    fn read_size(&self) -> (usize, Vec<JobPermit>) {
        if self.jobs.is_none() {
            return (self.shared.broker.inner.settings.read_count, Vec::new());
        }
        let permits = self.extra_permits();
        (permits.len() + 1, permits)
    }

    /// Reads new entries. With the app's job queue, a read asks for one
    /// record (the read-ahead the runtime takes with a permit of its own)
    /// plus one per extra permit it could take now, and only a read that
    /// asks for one record blocks: extra permits are never held while
    /// waiting for data, so other subscriptions are not starved of them.
    async fn read(&mut self) -> redis::RedisResult<()> {
        let (count, permits) = self.read_size();
        if self.jobs.is_none() || permits.is_empty() {
            return self.read_count(count, true, permits).await;
        }
        self.read_count(count, false, permits).await?;
        if self.buffer.is_empty() {
            // Nothing waiting: block for one, holding no extra permit.
            return self.read_count(1, true, Vec::new()).await;
        }
        Ok(())
    }

    async fn read_count(
        &mut self,
        count: usize,
        block: bool,
        permits: Vec<JobPermit>,
    ) -> redis::RedisResult<()> {
        let settings = &self.shared.broker.inner.settings;
        // Buffered acks ride along in the same round trip.
        let mut pipe = redis::pipe();
        self.shared.broker.take_acks(&mut pipe);
        let read = pipe
            .cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.shared.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(count);
        if block {
            read.arg("BLOCK").arg(settings.block.as_millis() as u64);
        }
        read.arg("STREAMS").arg(&self.shared.stream).arg(">");
        let (reply,): (Value,) = pipe.query_async(&mut self.reader).await?;
        let read = entry::read_reply(reply)
            .into_iter()
            .map(|e| (e, 1))
            .collect();
        self.take(read, permits).await
    }

    /// Buffers what a read or claim brought, each record with a permit
    /// (the first without: the runtime's permit covers it); permits for
    /// records that did not come go back. A malformed entry is never
    /// buffered: it is dead-lettered here, and its neighbours are not
    /// held up by it.
    async fn take(
        &mut self,
        entries: Vec<(Entry, u32)>,
        mut permits: Vec<JobPermit>,
    ) -> redis::RedisResult<()> {
        let mut malformed = Vec::new();
        let mut first = true;
        for (entry, attempt) in entries {
            if let Some(reason) = entry.malformed() {
                malformed.push((entry, attempt, reason));
                continue;
            }
            let permit = if first { None } else { permits.pop() };
            first = false;
            self.buffer.push_back((entry, attempt, permit));
        }
        drop(permits);
        if malformed.is_empty() {
            return Ok(());
        }
        self.dead_letter_malformed(malformed).await
    }

    /// Entries no handler can be given (malformed input never reaches a
    /// handler): a waiting caller gets a protocol error, and each is copied
    /// as it is,
    /// with the reason, its id, the original subject and the attempt, to the
    /// dead-letter stream (or dropped with a warning without one), and
    /// acked — all in one `MULTI`. If that fails the entries stay pending
    /// and come back through a claim.
    async fn dead_letter_malformed(
        &mut self,
        malformed: Vec<(Entry, u32, String)>,
    ) -> redis::RedisResult<()> {
        let shared = &self.shared;
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut ids = Vec::with_capacity(malformed.len());
        for (entry, attempt, reason) in malformed {
            crate::metrics::malformed("", &shared.subject);
            crate::metrics::rejected("", &shared.subject);
            tracing::warn!(stream = %shared.stream, id = %entry.id, reason, "malformed Redis entry refused before the handler");
            if let Some(dead_letter) = &shared.dead_letter {
                let mut copy = shared.broker.xadd_to(dead_letter);
                for (name, value) in &entry.fields {
                    copy.arg(name.as_slice()).arg(value.as_slice());
                }
                let header = |name: &str| format!("{}{name}", field::HEADER);
                copy.arg(header(header::ERROR))
                    .arg(&reason)
                    .arg(header(header::ORIGINAL_SUBJECT))
                    .arg(shared.subject.as_str())
                    .arg(header(header::ATTEMPT))
                    .arg(attempt)
                    .arg(header(header::ORIGINAL_ID))
                    .arg(&entry.id);
                pipe.add_command(copy).ignore();
            }
            if let Some((reply_to, reply)) = entry.refusal_reply(&reason) {
                pipe.add_command(shared.broker.send_command(&reply_to, &reply))
                    .ignore();
            }
            ids.push(entry.id);
        }
        pipe.cmd("XACK")
            .arg(&shared.stream)
            .arg(&shared.group)
            .arg(ids)
            .ignore();
        pipe.query_async::<()>(&mut self.reader).await
    }
}

/// The start of the pending entries list.
const START: &str = "-";

/// How often a subscription looks for entries to claim.
fn claim_every(claim_idle: Duration) -> Duration {
    (claim_idle / 2).max(Duration::from_millis(20))
}

impl Subscription for RedisSubscription {
    type Delivery = RedisDelivery;

    fn receive_flow(&self) -> Option<Arc<dyn ReceiveFlow>> {
        self.flow
            .as_ref()
            .map(|flow| Arc::clone(flow) as Arc<dyn ReceiveFlow>)
    }

    fn use_job_queue(&mut self, jobs: &Arc<JobQueue>) {
        self.jobs = Some(Arc::clone(jobs));
    }

    crate::binding::read_ahead_of_one!(RedisDelivery, take_buffered);

    async fn next(&mut self) -> Option<RedisDelivery> {
        if let Some(delivery) = self.ahead.take() {
            return Some(delivery);
        }
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.shared.broker.ensure_open().is_err() {
                return None;
            }
            if let Some((entry, attempt, permit)) = self.buffer.pop_front() {
                // Handed out: its permit goes back, and the runtime takes
                // one of its own before it takes the record.
                drop(permit);
                return Some(RedisDelivery::new(entry, attempt, &self.shared));
            }
            if let Some(flow) = &self.flow {
                flow.running().await;
            }
            let claim_every = claim_every(self.shared.broker.inner.settings.claim_idle);
            let result = if self.last_claim.elapsed() >= claim_every {
                self.last_claim = Instant::now();
                self.claim().await
            } else {
                self.read().await
            };
            if let Err(err) = result {
                tracing::warn!(stream = %self.shared.stream, error = %err, retry_in = ?backoff, "Redis read failed");
                crate::metrics::connection_event("redis", "read_failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

impl Drop for RedisSubscription {
    fn drop(&mut self) {
        if !self.own_group {
            return;
        }
        // A fan-out group serves this subscription only.
        let shared = Arc::clone(&self.shared);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = redis::cmd("XGROUP")
                    .arg("DESTROY")
                    .arg(&shared.stream)
                    .arg(&shared.group)
                    .query_async::<Value>(&mut shared.broker.conn())
                    .await;
            });
        }
    }
}

/// A Redis Streams entry, pending in its group until settled.
pub struct RedisDelivery {
    env: Envelope,
    id: String,
    shared: Arc<Shared>,
}

impl RedisDelivery {
    fn new(entry: Entry, attempt: u32, shared: &Arc<Shared>) -> Self {
        let (id, message) = entry.into_message(&shared.stream);
        RedisDelivery {
            env: Envelope::new(shared.subject.clone(), message).with_attempt(attempt),
            id,
            shared: Arc::clone(shared),
        }
    }
}

impl Delivery for RedisDelivery {
    fn envelope(&self) -> &Envelope {
        &self.env
    }

    /// Buffered and coalesced (see `RedisBrokerBuilder::ack_window`): sent
    /// with the next read, when the window fills, or at close. An ack lost
    /// with a crash leaves the entry pending, to be claimed again
    /// (at-least-once).
    async fn ack(self) -> Result<()> {
        let shared = &self.shared;
        shared
            .broker
            .ack(&shared.stream, &shared.group, self.id)
            .await
    }

    /// Buffered at once unless this ack fills the window (then `ack`
    /// sends the window and waits for it).
    fn try_ack(&mut self) -> Option<Result<()>> {
        let shared = &self.shared;
        let buffered = shared
            .broker
            .try_ack(&shared.stream, &shared.group, &mut self.id);
        buffered.then_some(Ok(()))
    }

    /// Leaves the entry pending: a member of the group claims it after
    /// `claim_idle`, with the delivery count as its attempt.
    async fn nack(self) -> Result<()> {
        Ok(())
    }

    /// `XACK` and, where a dead-letter subject is set, a copy on that stream
    /// with the reason, original subject and attempt — in one `MULTI`.
    async fn reject(self, reason: &str) -> Result<()> {
        let shared = &self.shared;
        let mut pipe = redis::pipe();
        pipe.atomic();
        match &shared.dead_letter {
            Some(dead_letter) => {
                let message = crate::binding::with_dead_letter_headers(
                    self.env.message().clone(),
                    &self.env,
                    reason,
                );
                pipe.add_command(shared.broker.xadd(dead_letter, &message));
            }
            // Debug: the runtime already logged the rejection and its reason.
            None => tracing::debug!(
                subject = %shared.subject,
                attempt = self.env.attempt(),
                reason,
                "message rejected and dropped (no dead-letter subject configured)"
            ),
        }
        pipe.cmd("XACK")
            .arg(&shared.stream)
            .arg(&shared.group)
            .arg(&self.id);
        pipe.query_async::<Value>(&mut shared.broker.conn())
            .await
            .map(|_| ())
            .map_err(transport)
    }
}
