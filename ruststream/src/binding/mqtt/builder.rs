//! [`MqttBrokerBuilder`]: connection, session and flow settings.

use std::collections::HashMap;
use std::time::Duration;

use rumqttc::v5::MqttOptions;
use rumqttc::v5::mqttbytes::QoS;

use super::MqttBroker;
use crate::{Error, Result};

/// Settings for an [`MqttBroker`].
///
/// ```no_run
/// use std::time::Duration;
/// use ruststream::mqtt::{MqttBroker, QoS};
///
/// # async fn run() -> ruststream::Result<()> {
/// let mqtt = MqttBroker::builder()
///     .client_id("sensors-service")
///     .session_expiry(Duration::from_secs(3600))
///     .receive_maximum(32)
///     .subscription_qos("sensors/+/raw", QoS::AtMostOnce)
///     .connect("mqtt://127.0.0.1:1883")
///     .await?;
/// # drop(mqtt); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MqttBrokerBuilder {
    pub(super) client_id: Option<String>,
    pub(super) clean_start: bool,
    pub(super) session_expiry: Duration,
    pub(super) receive_maximum: u16,
    pub(super) keep_alive: Duration,
    pub(super) credentials: Option<(String, String)>,
    pub(super) backoff: Duration,
    pub(super) max_backoff: Duration,
    pub(super) publish_timeout: Duration,
    pub(super) publish_qos: QoS,
    pub(super) subscription_qos: QoS,
    pub(super) qos_by_subject: HashMap<String, QoS>,
    pub(super) max_packet_size: u32,
    pub(super) publish_window: usize,
    pub(super) connection_timeout: Duration,
}

impl Default for MqttBrokerBuilder {
    fn default() -> Self {
        MqttBrokerBuilder {
            client_id: None,
            clean_start: false,
            session_expiry: Duration::from_secs(3600),
            receive_maximum: 64,
            keep_alive: Duration::from_secs(30),
            credentials: None,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            publish_timeout: Duration::from_secs(10),
            publish_qos: QoS::AtLeastOnce,
            subscription_qos: QoS::AtLeastOnce,
            qos_by_subject: HashMap::new(),
            max_packet_size: 16 * 1024 * 1024,
            publish_window: 1024,
            connection_timeout: Duration::from_secs(5),
        }
    }
}

impl MqttBrokerBuilder {
    /// The client id this app is known by. Without one the id is
    /// `ruststream-` and a random suffix, and sessions end with their
    /// connections (clean start, expiry 0): nothing outlives the process.
    /// Give a stable one for persistent sessions: each subscription connects as
    /// `<client id>-<hash of its queue group and subject>`, the publishing
    /// connection as `<client id>-pub`, and the broker keeps a
    /// subscription's session — with the QoS 1/2 messages published while
    /// the app is down — for [`session_expiry`](Self::session_expiry).
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = Some(id.into());
        self
    }

    /// How long the broker keeps a subscription's session after its
    /// connection ends (MQTT 5 session expiry interval; default one hour),
    /// when the [`client_id`](Self::client_id) is given. `Duration::ZERO`
    /// ends it with the connection.
    ///
    /// A kept session of a shared subscription stays a member of its group:
    /// the broker keeps giving it its share of the messages, which wait for
    /// the client to come back. Give each instance of a service a client id
    /// of its own that it keeps across restarts.
    pub fn session_expiry(mut self, expiry: Duration) -> Self {
        self.session_expiry = expiry;
        self
    }

    /// Start every subscription's connections with a clean session,
    /// dropping what the broker kept for it (default `false`: resume; only
    /// with a [`client_id`](Self::client_id)).
    pub fn clean_start(mut self, clean: bool) -> Self {
        self.clean_start = clean;
        self
    }

    /// Unacknowledged QoS 1/2 deliveries the broker may have outstanding
    /// with one subscription (MQTT 5 receive maximum, default 64): also how
    /// many QoS 1/2 messages, and how many QoS 0 ones, its receive buffer
    /// holds (each has its own room, so QoS 0 messages never hold a QoS 1
    /// one up).
    pub fn receive_maximum(mut self, messages: u16) -> Self {
        self.receive_maximum = messages.max(1);
        self
    }

    /// Keep-alive interval (default 30 s; at least 5 s). A QoS 0 message
    /// that finds its subscription's buffer full for a quarter of it is
    /// dropped (counted as `slow_consumer`), so the connection is never
    /// closed for silence while the app takes nothing.
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval.max(Duration::from_secs(5));
        self
    }

    /// Username and password (also taken from a URL's `user:password@`).
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((username.into(), password.into()));
        self
    }

    /// Reconnect backoff: the first wait and the longest (default 100 ms,
    /// doubling up to 5 s).
    pub fn reconnect_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max.max(first);
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// QoS of [`Broker::publish_message`](crate::Broker::publish_message)
    /// (default 1; [`MqttBroker::publish_with`] picks per message).
    pub fn publish_qos(mut self, qos: QoS) -> Self {
        self.publish_qos = qos;
        self
    }

    /// QoS subscriptions ask for unless [`subscription_qos`](Self::subscription_qos)
    /// names their subject (default 1).
    pub fn default_subscription_qos(mut self, qos: QoS) -> Self {
        self.subscription_qos = qos;
        self
    }

    /// The QoS a subscriber of `subject` (its exact subject string) asks
    /// for: 0 (at most once: no acknowledgement, so no redelivery of
    /// what a crash loses), 1 (at least once, the default), 2 (exactly once
    /// between broker and client; a `nack` still redelivers a copy).
    pub fn subscription_qos(mut self, subject: impl Into<String>, qos: QoS) -> Self {
        self.qos_by_subject.insert(subject.into(), qos);
        self
    }

    /// Largest packet this client accepts (default 16 MiB); the broker drops
    /// larger messages for it.
    pub fn max_packet_size(mut self, bytes: u32) -> Self {
        self.max_packet_size = bytes.max(64);
        self
    }

    /// Publishes the publishing connection queues before a publish waits
    /// for room (default 1024).
    pub fn publish_window(mut self, publishes: usize) -> Self {
        self.publish_window = publishes.max(1);
        self
    }

    pub(super) fn qos_for(&self, subject: &str) -> QoS {
        self.qos_by_subject
            .get(subject)
            .copied()
            .unwrap_or(self.subscription_qos)
    }

    pub(super) fn backoff(&self) -> (Duration, Duration) {
        (self.backoff, self.max_backoff)
    }

    /// Connects to `url` (`mqtt://[user:password@]host[:port]`, `tcp://…`
    /// or `host:port`; port 1883 by default) with MQTT 5.
    pub async fn connect(self, url: &str) -> Result<MqttBroker> {
        let address = Address::parse(url)?;
        MqttBroker::open(self, address).await
    }

    /// `rumqttc` options for a connection of this app as `client_id`.
    pub(super) fn options(&self, address: &Address, client_id: &str) -> MqttOptions {
        let mut options = MqttOptions::new(client_id, address.host.clone(), address.port);
        options.set_keep_alive(self.keep_alive);
        if self.client_id.is_some() {
            options.set_clean_start(self.clean_start);
            let expiry = u32::try_from(self.session_expiry.as_secs()).unwrap_or(u32::MAX);
            options.set_session_expiry_interval(Some(expiry));
        } else {
            // Nobody comes back for a random id's session, and an orphaned
            // member of a shared subscription would keep taking its share.
            options.set_clean_start(true);
            options.set_session_expiry_interval(Some(0));
        }
        options.set_max_packet_size(Some(self.max_packet_size));
        // MQTT's packets are small and each waits for an answer (a PUBACK
        // frees a slot of the receive maximum, a publish waits for its
        // PUBACK): Nagle's algorithm would hold each one back until the
        // broker's TCP ack of the previous one.
        let mut network = options.network_options();
        network.set_tcp_nodelay(true);
        options.set_network_options(network);
        options.set_connection_timeout(self.connection_timeout.as_secs().max(1));
        if let Some((user, password)) = self.credentials.as_ref().or(address.credentials.as_ref()) {
            options.set_credentials(user.clone(), password.clone());
        }
        options
    }
}

/// Where the broker is.
#[derive(Clone, Debug)]
pub(super) struct Address {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) credentials: Option<(String, String)>,
}

impl Address {
    pub(super) fn parse(url: &str) -> Result<Address> {
        let bad = || Error::Config(format!("`{url}` is not an MQTT address (mqtt://host:port)"));
        let rest = match url.split_once("://") {
            Some(("mqtt" | "tcp", rest)) => rest,
            Some(_) => return Err(bad()),
            None => url,
        };
        let rest = rest.trim_end_matches('/');
        let (credentials, hostport) = match rest.rsplit_once('@') {
            Some((login, hostport)) => {
                let (user, password) = login.split_once(':').unwrap_or((login, ""));
                (Some((user.to_owned(), password.to_owned())), hostport)
            }
            None => (None, rest),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().map_err(|_| bad())?),
            None => (hostport, 1883),
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Address {
            host: host.to_owned(),
            port,
            credentials,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Address;

    #[test]
    fn addresses_parse_with_and_without_scheme_port_and_login() {
        let a = Address::parse("mqtt://u:p@broker.local:1884").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("broker.local", 1884));
        assert_eq!(a.credentials, Some(("u".to_owned(), "p".to_owned())));
        let a = Address::parse("tcp://127.0.0.1").unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.credentials),
            ("127.0.0.1", 1883, None)
        );
        let a = Address::parse("localhost:1999").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("localhost", 1999));
        assert!(Address::parse("amqp://x").is_err());
        assert!(Address::parse("mqtt://host:port").is_err());
        assert!(Address::parse("mqtt://").is_err());
    }
}
