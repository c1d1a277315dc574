//! One MQTT delivery: acknowledged (PUBACK / PUBREC) only when settled with
//! an ack, redelivered through the subscription's retry topic with its
//! attempt counted, dead-lettered with its reason.

use std::sync::Arc;

use rumqttc::v5::mqttbytes::QoS;

use super::convert::{self, REDELIVERY};
use super::subscription::Shared;
use crate::binding::Delivery;
use crate::message::header;
use crate::{Envelope, Result};

/// An MQTT delivery, unacknowledged until settled. Dropped unsettled, it is
/// redelivered like a `nack`; lost with the process, the broker sends it
/// again when the session resumes.
pub struct MqttDelivery {
    env: Envelope,
    pkid: u16,
    qos: QoS,
    /// The connection it came on: its ack goes out on that one only.
    epoch: u64,
    shared: Arc<Shared>,
    settled: bool,
}

impl MqttDelivery {
    pub(super) fn new(
        env: Envelope,
        pkid: u16,
        qos: QoS,
        epoch: u64,
        shared: &Arc<Shared>,
    ) -> Self {
        MqttDelivery {
            env,
            pkid,
            qos,
            epoch,
            shared: Arc::clone(shared),
            settled: false,
        }
    }

    /// The QoS it was delivered with (the lower of the publisher's and the
    /// subscription's).
    pub fn qos(&self) -> QoS {
        self.qos
    }

    fn ack_now(mut self) -> Result<()> {
        self.ack_in_place()
    }

    fn ack_in_place(&mut self) -> Result<()> {
        self.settled = true;
        self.shared.conn.ack(self.pkid, self.qos, self.epoch)
    }
}

/// Publishes the redelivery copy of `env` to `shared`'s retry topic, with
/// its reply address: a request's retry answers the caller.
async fn redeliver(shared: &Shared, env: &Envelope) -> Result<()> {
    let message = env.message();
    let extra = [
        (REDELIVERY, (env.attempt() + 1).to_string()),
        (header::ORIGINAL_SUBJECT, env.subject().as_str().to_owned()),
    ];
    shared
        .broker
        .publish_raw(
            &shared.retry_topic,
            message,
            &extra,
            QoS::AtLeastOnce,
            false,
            None,
        )
        .await
}

impl Delivery for MqttDelivery {
    fn envelope(&self) -> &Envelope {
        &self.env
    }

    /// PUBACK (QoS 1) or PUBREC (QoS 2); nothing for QoS 0. Never waits:
    /// the ack is queued for the connection's event loop.
    async fn ack(self) -> Result<()> {
        self.ack_now()
    }

    fn try_ack(&mut self) -> Option<Result<()>> {
        Some(self.ack_in_place())
    }

    /// MQTT has no negative acknowledgement: a copy with attempt + 1 goes to
    /// this subscription's private retry topic (its queue group's, for a
    /// shared subscription), and once the broker has it the original is
    /// acked. If the copy cannot be published the original stays unacked,
    /// and the broker sends it again when the session resumes.
    async fn nack(mut self) -> Result<()> {
        self.settled = true;
        redeliver(&self.shared, &self.env).await?;
        self.ack_now()
    }

    /// Publishes to the dead-letter topic with the reason, the original
    /// subject and the attempt, then acks; without a dead-letter topic the
    /// message is dropped with a warning (and acked).
    async fn reject(mut self, reason: &str) -> Result<()> {
        self.settled = true;
        match &self.shared.dead_letter {
            Some(dead_letter) => {
                let message = convert::without_reply(self.env.message());
                let extra = crate::binding::dead_letter_headers(&self.env, reason);
                self.shared
                    .broker
                    .publish_raw(dead_letter, &message, &extra, QoS::AtLeastOnce, false, None)
                    .await?;
            }
            // Debug: the runtime already logged the rejection and its reason.
            None => tracing::debug!(
                subject = %self.env.subject(),
                attempt = self.env.attempt(),
                reason,
                "message rejected and dropped (no dead-letter subject configured)"
            ),
        }
        self.ack_now()
    }
}

impl Drop for MqttDelivery {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // Unsettled: redelivered now, like a nack (left alone it would hold
        // one of the receive maximum's slots until the next reconnect).
        let shared = Arc::clone(&self.shared);
        let env = self.env.clone();
        let (pkid, qos, epoch) = (self.pkid, self.qos, self.epoch);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if redeliver(&shared, &env).await.is_ok() {
                    let _ = shared.conn.ack(pkid, qos, epoch);
                }
            });
        }
    }
}
