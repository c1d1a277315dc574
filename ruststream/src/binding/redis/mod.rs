//! The Redis Streams binding (feature `redis`), on the `redis` crate
//! (redis-rs) with its reconnecting `ConnectionManager`.
//!
//! * A subject is a stream key. Publishing is `XADD` (optionally trimmed
//!   with `MAXLEN ~`); the payload, headers, key, correlation id and reply
//!   address are stream fields.
//! * Subscribers read through consumer groups (`XREADGROUP … BLOCK`): a queue
//!   group is a Redis consumer group shared by its members; a fan-out
//!   subscription gets a group of its own. Groups and streams are created on
//!   demand, starting at new entries.
//! * `ack` is `XACK`. `nack` leaves the entry pending: after
//!   [`claim_idle`](RedisBrokerBuilder::claim_idle) a live member claims it
//!   (`XPENDING … IDLE`, `XCLAIM`) with the delivery count from the pending entries list as
//!   its attempt — the same path that rescues the pending entries of a
//!   crashed consumer. `reject` is `XACK` plus a copy, with the reason, on
//!   the dead-letter stream, in one `MULTI`.
//! * Each subscription blocks on a connection of its own, so a blocking read
//!   never stalls publishes; the connections reconnect by themselves and a
//!   failed read is logged, counted and retried.
//!
//! * Request/reply: a request is an entry with a reply channel; the reply is
//!   a pub/sub message on it, delivered straight to the caller by the
//!   broker's inbox (one `PSUBSCRIBE`), never through a stream.
//!
//! No wildcards: a stream key is exact. Needs Redis 6.2 or later.

mod entry;
mod reply;
mod subscription;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

pub use self::subscription::{RedisDelivery, RedisSubscription};
use crate::binding::{Broker, SubscribeOptions};
use crate::{Error, Message, Result};

/// Stream fields of an entry.
pub(crate) mod field {
    pub const PAYLOAD: &str = "p";
    pub const KEY: &str = "k";
    pub const CORRELATION_ID: &str = "c";
    pub const REPLY_TO: &str = "r";
    /// Prefix of header fields: `h:<name>`.
    pub const HEADER: &str = "h:";
}

/// Buffered acks of one stream and group.
struct AckBatch {
    stream: String,
    group: String,
    ids: Vec<String>,
}

/// Adds `id` to the batch of its stream and group.
fn buffer_ack(acks: &mut Vec<AckBatch>, stream: &str, group: &str, id: String) {
    match acks
        .iter_mut()
        .find(|b| b.stream == stream && b.group == group)
    {
        Some(batch) => batch.ids.push(id),
        None => acks.push(AckBatch {
            stream: stream.to_owned(),
            group: group.to_owned(),
            ids: vec![id],
        }),
    }
}

/// A connection to a Redis server, for Streams. Cloning shares it.
#[derive(Clone)]
pub struct RedisBroker {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    /// Publishes, acks and group management (never blocking commands).
    conn: ConnectionManager,
    settings: RedisBrokerBuilder,
    closed: AtomicBool,
    /// Acked entry ids not yet sent, by stream and group: coalesced into one
    /// `XACK` each. A broker serves a handful of (stream, group) pairs, so a
    /// scan that compares `&str`s beats hashing a key built per ack.
    acks: Mutex<Vec<AckBatch>>,
    /// Acks buffered in `acks`, all keys together.
    buffered: AtomicUsize,
    /// The reply inbox, started by the first request.
    inbox: tokio::sync::Mutex<Option<Arc<reply::Inbox>>>,
    /// `host:port` of the URL it connected with.
    host: String,
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// Settings for a [`RedisBroker`].
///
/// ```no_run
/// use std::time::Duration;
/// use ruststream::redis::RedisBroker;
///
/// # async fn run() -> ruststream::Result<()> {
/// let redis = RedisBroker::builder()
///     .claim_idle(Duration::from_secs(30))
///     .read_count(64)
///     .maxlen(1_000_000)
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # drop(redis); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisBrokerBuilder {
    claim_idle: Duration,
    block: Duration,
    read_count: usize,
    maxlen: Option<usize>,
    publish_timeout: Duration,
    ack_window: usize,
}

impl Default for RedisBrokerBuilder {
    fn default() -> Self {
        RedisBrokerBuilder {
            claim_idle: Duration::from_secs(30),
            block: Duration::from_secs(1),
            read_count: 32,
            maxlen: None,
            publish_timeout: Duration::from_secs(10),
            ack_window: 128,
        }
    }
}

impl RedisBrokerBuilder {
    /// How long an entry stays pending (nacked, or held by a consumer that
    /// crashed) before a live member claims it (default 30 s).
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }

    /// How long one `XREADGROUP` blocks waiting for entries (default 1 s).
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Entries one read asks for at most (default 32): the most a
    /// subscription holds beyond what the runtime has taken.
    pub fn read_count(mut self, count: usize) -> Self {
        self.read_count = count.max(1);
        self
    }

    /// Acks buffered before they are sent (default 128). Acks are coalesced
    /// into one `XACK` per stream and group, sent when this many wait, when a
    /// subscription is about to read again (in the same round trip), and when
    /// the broker closes. `1` sends every ack on its own.
    pub fn ack_window(mut self, acks: usize) -> Self {
        self.ack_window = acks.max(1);
        self
    }

    /// Trim streams to about `entries` on every publish (`MAXLEN ~`).
    pub fn maxlen(mut self, entries: usize) -> Self {
        self.maxlen = Some(entries);
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Connects to `url` (for example `redis://127.0.0.1:6379`). An
    /// unreachable server is an [`Error::Transport`] naming the address.
    pub async fn connect(self, url: &str) -> Result<RedisBroker> {
        let unreachable = |err: redis::RedisError| {
            Error::Transport(format!("cannot connect to Redis at {url}: {err}").into())
        };
        let client = redis::Client::open(url).map_err(unreachable)?;
        let conn = connection(&client, None).await.map_err(unreachable)?;
        Ok(RedisBroker {
            inner: Arc::new(Inner {
                client,
                conn,
                settings: self,
                closed: AtomicBool::new(false),
                acks: Mutex::new(Vec::new()),
                buffered: AtomicUsize::new(0),
                inbox: tokio::sync::Mutex::new(None),
                host: crate::binding::host_of(url),
            }),
        })
    }
}

/// A reconnecting connection; `response_timeout` bounds each command (a
/// blocking read passes one longer than its `BLOCK`).
async fn connection(
    client: &redis::Client,
    response_timeout: Option<Duration>,
) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(response_timeout.unwrap_or(Duration::from_secs(5))))
        .set_max_delay(Duration::from_secs(1));
    client.get_connection_manager_with_config(config).await
}

fn transport(err: redis::RedisError) -> Error {
    Error::Transport(err.into())
}

impl RedisBroker {
    /// Connects with default settings.
    pub async fn connect(url: &str) -> Result<RedisBroker> {
        RedisBrokerBuilder::default().connect(url).await
    }

    /// Settings for a new connection.
    pub fn builder() -> RedisBrokerBuilder {
        RedisBrokerBuilder::default()
    }

    fn ensure_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("Redis connection is closed"));
        }
        Ok(())
    }

    /// A command on the shared connection.
    pub(crate) fn conn(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    /// The reply inbox, started on first use.
    async fn inbox(&self) -> Result<Arc<reply::Inbox>> {
        let mut inbox = self.inner.inbox.lock().await;
        if let Some(inbox) = &*inbox {
            return Ok(Arc::clone(inbox));
        }
        let started = reply::Inbox::start(&self.inner.client).await?;
        *inbox = Some(Arc::clone(&started));
        Ok(started)
    }

    /// Buffers the ack of `id`; sends every buffered ack when the window is
    /// full.
    pub(crate) async fn ack(&self, stream: &str, group: &str, id: String) -> Result<()> {
        let full = {
            let mut acks = self.inner.acks.lock().unwrap_or_else(|e| e.into_inner());
            buffer_ack(&mut acks, stream, group, id);
            self.inner.buffered.fetch_add(1, Ordering::AcqRel) + 1 >= self.inner.settings.ack_window
        };
        if full {
            let mut pipe = redis::pipe();
            if self.take_acks(&mut pipe) {
                pipe.query_async::<redis::Value>(&mut self.conn())
                    .await
                    .map_err(transport)?;
            }
        }
        Ok(())
    }

    /// Moves every buffered ack into `pipe` (one `XACK` per stream and
    /// group); false when there were none.
    pub(crate) fn take_acks(&self, pipe: &mut redis::Pipeline) -> bool {
        if self.inner.buffered.load(Ordering::Acquire) == 0 {
            return false;
        }
        let acks = {
            let mut acks = self.inner.acks.lock().unwrap_or_else(|e| e.into_inner());
            // Under the lock that pushes count under, so no ack is missed.
            self.inner.buffered.store(0, Ordering::Release);
            std::mem::take(&mut *acks)
        };
        let mut any = false;
        for batch in acks {
            pipe.cmd("XACK")
                .arg(batch.stream)
                .arg(batch.group)
                .arg(batch.ids)
                .ignore();
            any = true;
        }
        any
    }

    /// Buffers the ack of `id` (taken, leaving it empty) when that leaves
    /// room in the window, without waiting; `false`, `id` untouched, when
    /// it would fill the window, whose flush [`ack`](Self::ack) waits for.
    pub(crate) fn try_ack(&self, stream: &str, group: &str, id: &mut String) -> bool {
        let mut acks = self.inner.acks.lock().unwrap_or_else(|e| e.into_inner());
        // Counted under the lock that `ack` and `take_acks` count under.
        if self.inner.buffered.load(Ordering::Acquire) + 1 >= self.inner.settings.ack_window {
            return false;
        }
        buffer_ack(&mut acks, stream, group, std::mem::take(id));
        self.inner.buffered.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Sends every buffered ack now.
    async fn flush_acks(&self) -> Result<()> {
        let mut pipe = redis::pipe();
        if self.take_acks(&mut pipe) {
            pipe.query_async::<redis::Value>(&mut self.conn())
                .await
                .map_err(transport)?;
        }
        Ok(())
    }

    /// An `XADD` to `stream` (trimmed where `maxlen` says), fields to follow.
    fn xadd_to(&self, stream: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream);
        if let Some(maxlen) = self.inner.settings.maxlen {
            cmd.arg("MAXLEN").arg("~").arg(maxlen);
        }
        cmd.arg("*");
        cmd
    }

    /// The command that sends `message` to `subject`: a reply goes to its
    /// caller's inbox channel (`PUBLISH`), anything else to a stream.
    fn send_command(&self, subject: &str, message: &Message) -> redis::Cmd {
        if subject.starts_with(reply::PREFIX) {
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(subject).arg(reply::encode(message).as_ref());
            cmd
        } else {
            self.xadd(subject, message)
        }
    }

    /// The `XADD` of `message` to `stream`.
    fn xadd(&self, stream: &str, message: &Message) -> redis::Cmd {
        let mut cmd = self.xadd_to(stream);
        cmd.arg(field::PAYLOAD).arg(message.payload().as_ref());
        if let Some(key) = message.key() {
            cmd.arg(field::KEY).arg(key.as_str());
        }
        if let Some(id) = message.correlation_id() {
            cmd.arg(field::CORRELATION_ID).arg(id.as_str());
        }
        if let Some(reply) = message.reply_to() {
            cmd.arg(field::REPLY_TO).arg(reply.as_str());
        }
        for (name, value) in message.headers().iter() {
            cmd.arg(format!("{}{name}", field::HEADER)).arg(value);
        }
        cmd
    }
}

impl Broker for RedisBroker {
    fn as_requester(&self) -> Option<&dyn crate::binding::DynRequester> {
        Some(self)
    }

    type Subscription = RedisSubscription;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn host(&self) -> Option<String> {
        Some(self.inner.host.clone())
    }

    async fn subscribe(&self, options: SubscribeOptions) -> Result<RedisSubscription> {
        self.ensure_open()?;
        if options.subject.contains(['*', '>']) {
            return Err(Error::Config(format!(
                "Redis streams have no wildcards: `{}` is not a stream key",
                options.subject
            )));
        }
        RedisSubscription::open(self.clone(), options).await
    }

    /// `XADD`, waiting for the server's reply until the deadline.
    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.ensure_open()?;
        let deadline =
            deadline.unwrap_or_else(|| Instant::now() + self.inner.settings.publish_timeout);
        let cmd = self.send_command(subject, &message);
        let mut conn = self.conn();
        match tokio::time::timeout_at(deadline, cmd.query_async::<redis::Value>(&mut conn)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(transport(err)),
            Err(_) => {
                crate::metrics::deadline_exceeded("redis");
                Err(Error::DeadlineExceeded(
                    "Redis did not confirm the XADD before the deadline",
                ))
            }
        }
    }

    /// Marks the connection closed: later calls fail with `Error::Closed`,
    /// subscriptions end. Closing twice is fine.
    async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Every ack is sent before the connection is given up.
        self.flush_acks().await
    }
}
