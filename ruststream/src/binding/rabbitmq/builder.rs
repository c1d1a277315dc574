//! [`RabbitBrokerBuilder`]: connection settings, and the connection's
//! lifecycle events.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use super::{Inner, RabbitBroker, transport};
use crate::{Error, Result};

/// Settings for a [`RabbitBroker`].
///
/// ```no_run
/// use ruststream::rabbitmq::RabbitBroker;
///
/// # async fn run() -> ruststream::Result<()> {
/// let rabbit = RabbitBroker::builder()
///     .exchange("orders")
///     .prefetch(64)
///     .connect("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .await?;
/// # drop(rabbit); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RabbitBrokerBuilder {
    pub(super) connection_name: String,
    pub(super) exchange: String,
    pub(super) prefetch: u16,
    pub(super) ack_window: usize,
    pub(super) queue_expires: Option<Duration>,
    pub(super) quorum: bool,
    pub(super) publish_timeout: Duration,
    pub(super) connection_timeout: Duration,
}

impl Default for RabbitBrokerBuilder {
    fn default() -> Self {
        RabbitBrokerBuilder {
            connection_name: "ruststream".to_owned(),
            exchange: "ruststream".to_owned(),
            prefetch: 64,
            ack_window: 32,
            queue_expires: None,
            quorum: false,
            publish_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(10),
        }
    }
}

impl RabbitBrokerBuilder {
    /// The connections' name as the broker shows it (default `ruststream`):
    /// the consuming connection has this name, the publishing one this name
    /// with `-publish`.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The topic exchange subjects are routed through (default `ruststream`).
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.exchange = name.into();
        self
    }

    /// Unacked deliveries one subscription may hold (`basic.qos`, default
    /// 64); never more than the app's job queue can take.
    pub fn prefetch(mut self, messages: u16) -> Self {
        self.prefetch = messages.max(1);
        self
    }

    /// Settled acks sent as one `basic.ack(multiple)` at most (default 32).
    /// Contiguous settled deliveries are acked together when this many wait,
    /// after at most a millisecond otherwise, and before a channel or the
    /// connection closes. `1` acks each delivery on its own.
    pub fn ack_window(mut self, acks: usize) -> Self {
        self.ack_window = acks.max(1);
        self
    }

    /// Delete a queue group's queue after it has had no consumer for this
    /// long (`x-expires`; default: never — the queue outlives its members,
    /// as a durable work queue should).
    pub fn queue_expires(mut self, idle: Duration) -> Self {
        self.queue_expires = Some(idle);
        self
    }

    /// Declare queue groups' queues as quorum queues (replicated; default:
    /// classic durable queues). The broker then counts deliveries: `nack`
    /// is a plain requeue with the broker's delivery count as the attempt,
    /// and a message delivered `max_attempts` times without being settled —
    /// a handler that crashes the process every time — is dead-lettered by
    /// the broker itself (`x-delivery-limit`).
    pub fn quorum_queues(mut self, on: bool) -> Self {
        self.quorum = on;
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How long [`connect`](Self::connect) may take to reach the broker
    /// and finish each connection's AMQP handshake (default 10 s). A broker
    /// that refuses the connection is an error at once; one that takes it
    /// and never answers — a node still booting or overloaded, or a port
    /// that is not RabbitMQ's — is an error after this long, not after the
    /// client's minutes of retries.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ruststream::rabbitmq::RabbitBroker;
    ///
    /// # async fn run() -> ruststream::Result<()> {
    /// let rabbit = RabbitBroker::builder()
    ///     .connection_timeout(Duration::from_secs(3))
    ///     .connect("amqp://guest:guest@127.0.0.1:5672/%2f")
    ///     .await?;
    /// # drop(rabbit); Ok(()) }
    /// ```
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects to `url` (for example
    /// `amqp://guest:guest@127.0.0.1:5672/%2f`), declares the exchange and
    /// opens the publishing channel with confirms.
    pub async fn connect(self, url: &str) -> Result<RabbitBroker> {
        let shown = without_password(url);
        let unreachable = |err: &dyn std::fmt::Display| {
            Error::Transport(format!("cannot connect to RabbitMQ at {shown}: {err}").into())
        };
        // The client's own connect retries a refused connection for minutes
        // (the backoff that lets a running app ride out a broker restart):
        // a broker that is down at start is an error at once.
        let timeout = self.connection_timeout;
        reachable(url, timeout)
            .await
            .map_err(|err| unreachable(&err))?;
        let open = |name: String| async move {
            let properties = ConnectionProperties::default()
                .with_connection_name(name.into())
                .enable_auto_recover();
            // Bounded too: a listener that takes the connection and never
            // answers would keep the client's handshake waiting, and its
            // retries going, for minutes.
            let conn = tokio::time::timeout(timeout, Connection::connect(url, properties))
                .await
                .map_err(|_| unreachable(&format_args!("no AMQP handshake within {timeout:?}")))?
                .map_err(|err| unreachable(&err))?;
            watch_connection(&conn);
            Ok::<_, Error>(conn)
        };
        let conn = open(self.connection_name.clone()).await?;
        let publish_conn = open(format!("{}-publish", self.connection_name)).await?;
        let publisher = publish_conn.create_channel().await.map_err(transport)?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(transport)?;
        publisher
            .exchange_declare(
                self.exchange.as_str().into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(transport)?;
        Ok(RabbitBroker {
            inner: Arc::new(Inner {
                conn,
                publish_conn,
                publisher,
                settings: self,
                closed: AtomicBool::new(false),
                host: crate::binding::host_of(url),
                ack_windows: Mutex::new(Vec::new()),
                inbox: tokio::sync::Mutex::new(None),
                delay_queues: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// Logs and counts connection events: losses, recoveries, blocking.
fn watch_connection(conn: &Connection) {
    let mut events = conn.events_listener();
    tokio::spawn(async move {
        use futures_util::StreamExt;
        while let Some(event) = events.next().await {
            let name = match &event {
                lapin::Event::Connected => "connected",
                lapin::Event::Error(err) => {
                    tracing::warn!(error = %err, "RabbitMQ connection error; recovering");
                    "disconnected"
                }
                lapin::Event::ConnectionBlocked(reason) => {
                    tracing::warn!(%reason, "RabbitMQ blocked the connection");
                    "blocked"
                }
                lapin::Event::ConnectionUnblocked => "unblocked",
                _ => continue,
            };
            crate::metrics::connection_event("rabbitmq", name);
        }
    });
}

/// Whether the broker at `url` takes a TCP connection within `timeout`,
/// tried once.
async fn reachable(url: &str, timeout: Duration) -> std::io::Result<()> {
    let uri: lapin::uri::AMQPUri = url
        .parse()
        .map_err(|err: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, err))?;
    let address = (uri.authority.host.as_str(), uri.authority.port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await {
        Ok(connected) => connected.map(drop),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no TCP connection within {timeout:?}"),
        )),
    }
}

/// `url` with its password left out, for errors and logs.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{}", &rest[userinfo.len() + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_url_is_shown_without_its_password() {
        assert_eq!(
            without_password("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            without_password("amqp://127.0.0.1:5672"),
            "amqp://127.0.0.1:5672"
        );
        assert_eq!(without_password("amqp://svc@host/vh"), "amqp://svc@host/vh");
    }
}
