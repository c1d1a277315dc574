//! Exchanges of every kind, declared and bound into ruststream's topic
//! exchange, so what other systems publish there reaches subscribers.

use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;

use super::{RabbitBroker, close_channel, long, transport};
use crate::{Error, Result};

/// The kinds of AMQP exchange (see [`RabbitBroker::declare_exchange`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routes on the exact routing key.
    Direct,
    /// Routes on routing-key patterns (`*` one word, `#` the rest).
    Topic,
    /// Every bound queue or exchange gets every message.
    Fanout,
    /// Routes on header values (`x-match` = `all` or `any` in the binding).
    Headers,
}

impl From<ExchangeKind> for lapin::ExchangeKind {
    fn from(kind: ExchangeKind) -> Self {
        match kind {
            ExchangeKind::Direct => lapin::ExchangeKind::Direct,
            ExchangeKind::Topic => lapin::ExchangeKind::Topic,
            ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
            ExchangeKind::Headers => lapin::ExchangeKind::Headers,
        }
    }
}

impl RabbitBroker {
    /// Declares a durable exchange `name` of `kind` (fine if it exists with
    /// the same kind), for example one other systems publish to.
    ///
    /// ```no_run
    /// use ruststream::rabbitmq::{ExchangeKind, RabbitBroker};
    ///
    /// # async fn run(rabbit: RabbitBroker) -> ruststream::Result<()> {
    /// // Everything published to the legacy fan-out exchange reaches
    /// // ruststream subscribers, by its routing key as the subject.
    /// rabbit.declare_exchange("legacy.events", ExchangeKind::Fanout).await?;
    /// rabbit.bind_exchange("legacy.events", "", &[]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<()> {
        let admin = self.admin_channel().await?;
        let declared = admin
            .exchange_declare(
                name.into(),
                kind.into(),
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|err| {
                Error::Config(format!(
                    "cannot declare RabbitMQ exchange `{name}` as {kind:?}: {err}"
                ))
            });
        close_admin(admin).await;
        declared
    }

    /// Binds the exchange `source` into ruststream's exchange, so what is
    /// published there reaches subscribers whose subject matches the
    /// message's routing key. `binding_key` filters on a direct or topic
    /// source (ignored by fan-out); `headers` are the binding arguments of a
    /// headers source (for example `[("x-match", "all"), ("region", "eu")]`).
    pub async fn bind_exchange(
        &self,
        source: &str,
        binding_key: &str,
        headers: &[(&str, &str)],
    ) -> Result<()> {
        let mut arguments = FieldTable::default();
        for (name, value) in headers {
            arguments.insert((*name).into(), long(value));
        }
        let admin = self.admin_channel().await?;
        let bound = admin
            .exchange_bind(
                self.inner.settings.exchange.as_str().into(),
                source.into(),
                binding_key.into(),
                lapin::options::ExchangeBindOptions::default(),
                arguments,
            )
            .await
            .map_err(|err| {
                Error::Config(format!(
                    "cannot bind RabbitMQ exchange `{source}` into `{}`: {err}",
                    self.inner.settings.exchange
                ))
            });
        close_admin(admin).await;
        bound
    }

    /// A short-lived channel for declarations: a refused one closes its
    /// channel, which must not be the publishing channel.
    pub(super) async fn admin_channel(&self) -> Result<lapin::Channel> {
        self.ensure_open()?;
        self.inner.conn.create_channel().await.map_err(transport)
    }
}

pub(super) async fn close_admin(channel: lapin::Channel) {
    close_channel(channel, "declared").await;
}
