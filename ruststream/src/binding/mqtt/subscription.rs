//! One MQTT subscription: a client connection of its own (its own session,
//! its own receive maximum), subscribed to the subject (as a shared
//! subscription for a queue group) and to its private retry topic, where
//! `nack` sends copies back.
//!
//! Received publishes wait in a buffer of at most the receive maximum until
//! the runtime claims them. While the runtime waits for one, its task polls
//! the connection's event loop itself (see `pump`), as a raw client's loop
//! does: the publish it reads is at hand, and the acks queued since go out,
//! without a hand-off between tasks. The broker should never have more than the
//! receive maximum of QoS 1/2 messages unacknowledged with us; when the
//! buffer is full all the same (QoS 0, which MQTT does not flow-control, or
//! a broker sending past the maximum, as Mosquitto 2.0 does under load) the
//! event loop stops reading the socket and TCP pushes back on the broker.
//! Acks never wait for it. While the receive flow is PAUSED nothing is
//! handed out: the buffer fills, the broker stops at the receive maximum,
//! and memory stays bounded.
//!
//! Stopped, the event loop sends no keep-alive either: a QoS 0 message that
//! finds the buffer full for a quarter of the keep-alive is dropped, and so
//! is every QoS 0 message after it until the buffer has room again (counted
//! as `slow_consumer`, as a core NATS client drops what its buffer cannot
//! take), so the broker never takes the connection for dead.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use futures_util::task::AtomicWaker;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Publish};
use tokio::sync::Notify;

use super::connection::{Connection, Inbound, Settings};
use super::delivery::MqttDelivery;
use super::{MqttBroker, convert};
use crate::binding::pull_flow::PullFlow;
use crate::binding::{SubscribeOptions, Subscription};
use crate::ingress::ReceiveFlow;
use crate::{Error, Result, Text};

/// Topics of the private retry subscriptions start with this.
pub(super) const RETRY_PREFIX: &str = "ruststream/retry/";

/// An MQTT subscription (see [`MqttBroker`]).
pub struct MqttSubscription {
    shared: Arc<Shared>,
    buffer: Arc<Buffer>,
    flow: Option<Arc<PullFlow>>,
    /// The subject of the last delivery, reused while it repeats.
    last_subject: Option<Text>,
}

/// What every delivery of one subscription needs to settle itself.
pub(super) struct Shared {
    pub(super) broker: MqttBroker,
    pub(super) conn: Arc<Connection>,
    /// Where `nack` publishes the copy (only this subscription, or its
    /// queue group, reads it).
    pub(super) retry_topic: String,
    pub(super) dead_letter: Option<Text>,
}

/// Received, not yet handed out.
pub(super) struct Buffer {
    queue: Mutex<Received>,
    /// How many QoS 0 publishes, and how many QoS 1/2 ones, the buffer
    /// holds at most: each class has its own room, so a QoS 1 publish (which
    /// the broker holds back at the receive maximum) never waits behind QoS
    /// 0 ones (which nothing holds back).
    capacity: usize,
    /// The reader, woken when a publish arrives while it `waiting`, and at
    /// close.
    reader: AtomicWaker,
    waiting: AtomicBool,
    /// Notified when a publish is taken out.
    room: Notify,
    closed: AtomicBool,
    /// How long a QoS 0 publish waits for room before it is dropped: a
    /// quarter of the keep-alive, so the event loop gets back to its pings
    /// well within the broker's limit (1.5 keep-alives).
    patience: Duration,
    /// QoS 0 publishes are being dropped: one waited out `patience`, and
    /// the buffer has had no room since.
    dropping: AtomicBool,
}

/// The buffered publishes, in arrival order, with their connection epoch.
struct Received {
    publishes: VecDeque<(Publish, u64)>,
    /// How many of them are QoS 0.
    at_most_once: usize,
}

impl Received {
    /// How many of the class of `publish` (QoS 0, or QoS 1/2) are held.
    fn held(&self, publish: &Publish) -> usize {
        if publish.qos == QoS::AtMostOnce {
            self.at_most_once
        } else {
            self.publishes.len() - self.at_most_once
        }
    }

    fn push(&mut self, publish: (Publish, u64)) {
        self.at_most_once += usize::from(publish.0.qos == QoS::AtMostOnce);
        self.publishes.push_back(publish);
    }

    /// The oldest publish, and whether its class was full before.
    fn pop(&mut self, capacity: usize) -> Option<((Publish, u64), bool)> {
        let oldest = self.publishes.front()?;
        let full = self.held(&oldest.0) >= capacity;
        let oldest = self.publishes.pop_front()?;
        self.at_most_once -= usize::from(oldest.0.qos == QoS::AtMostOnce);
        Some((oldest, full))
    }

    fn clear(&mut self) {
        self.publishes.clear();
        self.at_most_once = 0;
    }
}

impl Buffer {
    fn lock(&self) -> MutexGuard<'_, Received> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.reader.wake();
        self.room.notify_waiters();
    }

    /// Buffers `publish` (taking it) unless its class is full; `true` when
    /// done with it (buffered, or dropped after close).
    fn try_deliver(&self, publish: &mut Option<(Publish, u64)>) -> bool {
        if self.closed.load(Ordering::Acquire) {
            // Nobody takes it: unacked, it comes back next session.
            return true;
        }
        let mut queue = self.lock();
        let (next, _) = publish.as_ref().expect("pushed once");
        if queue.held(next) >= self.capacity {
            return false;
        }
        let at_most_once = next.qos == QoS::AtMostOnce;
        let was_empty = queue.publishes.is_empty();
        queue.push(publish.take().expect("pushed once"));
        drop(queue);
        if at_most_once && self.dropping.load(Ordering::Relaxed) {
            self.dropping.store(false, Ordering::Relaxed);
            tracing::info!("MQTT subscription buffer has room again: QoS 0 messages are kept");
        }
        // The reader waits only on an empty buffer (and is not waiting
        // while it polls the event loop itself).
        if was_empty && self.waiting.load(Ordering::SeqCst) {
            self.reader.wake();
        }
        true
    }

    /// Waits until `publish` is buffered (or dropped after close).
    async fn wait_for_room(&self, publish: &mut Option<(Publish, u64)>) {
        loop {
            let room = self.room.notified();
            if self.try_deliver(publish) {
                return;
            }
            room.await;
        }
    }

    /// A QoS 0 publish the full buffer cannot take: dropped.
    fn drop_at_most_once(&self) {
        crate::metrics::connection_event("mqtt", "slow_consumer");
        if !self.dropping.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                waited = ?self.patience,
                "MQTT subscription buffer full: QoS 0 messages are dropped until it has room, so the connection's keep-alive goes on"
            );
        }
    }
}

impl Inbound for Buffer {
    async fn deliver(&self, publish: Publish, epoch: u64) {
        let at_most_once = publish.qos == QoS::AtMostOnce;
        let mut publish = Some((publish, epoch));
        // The first try registers nothing: the buffer is seldom full.
        if self.try_deliver(&mut publish) {
            return;
        }
        if !at_most_once {
            // Past the receive maximum (which the broker should not send):
            // it waits for our acks.
            return self.wait_for_room(&mut publish).await;
        }
        if self.dropping.load(Ordering::Relaxed)
            || tokio::time::timeout(self.patience, self.wait_for_room(&mut publish))
                .await
                .is_err()
        {
            self.drop_at_most_once();
        }
    }

    fn reset(&self) {
        self.lock().clear();
        self.room.notify_waiters();
    }

    fn close(&self) {
        Buffer::close(self);
    }
}

/// FNV-1a: a stable hash for client ids and retry topics that must be the
/// same in the next run of the app.
fn stable_hash(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

fn check_group(group: &str) -> Result<()> {
    if group.is_empty() || group.contains(['/', '+', '#']) {
        return Err(Error::Config(format!(
            "`{group}` cannot be an MQTT shared-subscription group (no `/`, `+`, `#`)"
        )));
    }
    Ok(())
}

impl MqttSubscription {
    pub(super) async fn open(broker: MqttBroker, options: SubscribeOptions) -> Result<Self> {
        let settings = &broker.inner.settings;
        let subject = options.subject.as_str();
        if subject.is_empty() {
            return Err(Error::Config("an MQTT topic filter cannot be empty".into()));
        }
        let qos = settings.qos_for(subject);
        let group = options.queue_group.as_ref().map(|g| g.as_str());
        let hash = stable_hash(&format!("{}|{subject}", group.unwrap_or("")));
        let client_id = broker.subscription_client_id(hash);
        let (filter, retry_topic, retry_filter) = match group {
            Some(group) => {
                check_group(group)?;
                let retry = format!("{RETRY_PREFIX}{group}/{hash:08x}");
                (
                    format!("$share/{group}/{subject}"),
                    retry.clone(),
                    format!("$share/{group}/{retry}"),
                )
            }
            None => {
                let retry = format!("{RETRY_PREFIX}{client_id}");
                (subject.to_owned(), retry.clone(), retry)
            }
        };
        let receive_maximum = settings.receive_maximum;
        let buffer = Arc::new(Buffer {
            queue: Mutex::new(Received {
                publishes: VecDeque::with_capacity(usize::from(receive_maximum)),
                at_most_once: 0,
            }),
            capacity: usize::from(receive_maximum),
            reader: AtomicWaker::new(),
            waiting: AtomicBool::new(false),
            room: Notify::new(),
            closed: AtomicBool::new(false),
            patience: settings.keep_alive / 4,
            dropping: AtomicBool::new(false),
        });
        let mut mqtt = broker.options(&client_id);
        mqtt.set_manual_acks(true);
        mqtt.set_receive_maximum(Some(receive_maximum));
        let conn = Connection::open(
            Settings {
                options: mqtt,
                filters: vec![Filter::new(filter, qos), Filter::new(retry_filter, qos)],
                backoff: settings.backoff(),
                label: format!("subscription {client_id} to {subject}"),
            },
            usize::from(receive_maximum) + 8,
            Arc::clone(&buffer),
        )
        .await?;
        broker.track(&conn);
        Ok(MqttSubscription {
            shared: Arc::new(Shared {
                broker,
                conn,
                retry_topic,
                dead_letter: options.dead_letter,
            }),
            buffer,
            last_subject: None,
            flow: options.receive_flow.then(|| Arc::new(PullFlow::default())),
        })
    }

    fn closed(&self) -> bool {
        self.shared.conn.is_closed() || self.shared.broker.ensure_open().is_err()
    }

    /// `Some(true)` with a publish at hand, `Some(false)` once closed.
    fn at_hand(&self) -> Option<bool> {
        if !self.buffer.lock().publishes.is_empty() {
            Some(true)
        } else if self.closed() || self.buffer.closed.load(Ordering::Acquire) {
            Some(false)
        } else {
            None
        }
    }
}

impl Subscription for MqttSubscription {
    type Delivery = MqttDelivery;

    /// Waits until the receive flow runs and a received publish is at hand,
    /// polling the connection's event loop meanwhile.
    async fn ready(&mut self) -> bool {
        if let Some(flow) = &self.flow
            && flow.is_paused()
        {
            // No reads for a while: the connection task drives meanwhile.
            self.shared.conn.pump().release();
            flow.running().await;
        }
        let reader = self.shared.conn.pump().reader();
        let buffer = &self.buffer;
        let ready = poll_fn(|cx| {
            buffer.reader.register(cx.waker());
            buffer.waiting.store(true, Ordering::SeqCst);
            if let Some(ready) = self.at_hand() {
                return Poll::Ready(ready);
            }
            // What this poll delivers, it sees below: no wake-up.
            buffer.waiting.store(false, Ordering::SeqCst);
            reader.poll(cx);
            buffer.waiting.store(true, Ordering::SeqCst);
            self.at_hand().map_or(Poll::Pending, Poll::Ready)
        })
        .await;
        buffer.waiting.store(false, Ordering::SeqCst);
        ready
    }

    fn try_next(&mut self) -> Option<MqttDelivery> {
        let (publish, epoch) = {
            let mut queue = self.buffer.lock();
            let (taken, full) = queue.pop(self.buffer.capacity)?;
            drop(queue);
            // The event loop waits only on a full class.
            if full {
                self.buffer.room.notify_waiters();
            }
            taken
        };
        // Acks queued since the last read go out, the buffer refills.
        self.shared.conn.pump().poke();
        let copy = publish.topic.as_ref() == self.shared.retry_topic.as_bytes();
        let (pkid, qos) = (publish.pkid, publish.qos);
        let env = convert::envelope(publish, copy, &mut self.last_subject);
        Some(MqttDelivery::new(env, pkid, qos, epoch, &self.shared))
    }

    fn receive_flow(&self) -> Option<Arc<dyn ReceiveFlow>> {
        self.flow
            .as_ref()
            .map(|flow| Arc::clone(flow) as Arc<dyn ReceiveFlow>)
    }
}

impl Drop for MqttSubscription {
    fn drop(&mut self) {
        self.buffer.close();
        let conn = Arc::clone(&self.shared.conn);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // DISCONNECT after the acks already in the channel; the session
            // stays for its expiry, so what was not acked comes back to the
            // next subscription with the same client id.
            runtime.spawn(async move { conn.close().await });
        }
    }
}

#[cfg(test)]
mod tests {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Publish;

    use super::Received;

    fn publish(payload: &'static str, qos: QoS) -> (Publish, u64) {
        (Publish::new("t", qos, payload, None), 0)
    }

    #[test]
    fn each_class_has_its_own_room_and_arrival_order_holds() {
        let mut received = Received {
            publishes: Default::default(),
            at_most_once: 0,
        };
        let capacity = 2;
        for payload in ["a", "b"] {
            received.push(publish(payload, QoS::AtMostOnce));
        }
        let qos0 = publish("c", QoS::AtMostOnce).0;
        let qos1 = publish("d", QoS::AtLeastOnce).0;
        assert_eq!(received.held(&qos0), capacity, "QoS 0 is full");
        assert_eq!(received.held(&qos1), 0, "QoS 1 has room beside it");
        received.push(publish("d", QoS::AtLeastOnce));
        let ((first, _), full) = received.pop(capacity).unwrap();
        assert_eq!((&first.payload[..], full), (&b"a"[..], true));
        let ((second, _), full) = received.pop(capacity).unwrap();
        assert_eq!((&second.payload[..], full), (&b"b"[..], false));
        let ((third, _), full) = received.pop(capacity).unwrap();
        assert_eq!((&third.payload[..], full), (&b"d"[..], false));
        assert_eq!(received.at_most_once, 0);
        assert!(received.pop(capacity).is_none());
    }
}
