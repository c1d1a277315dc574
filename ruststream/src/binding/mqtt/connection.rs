//! One MQTT client connection: `rumqttc`'s event loop, driven by a task of
//! its own and by the subscription's reader while it waits (see `pump`),
//! with publish confirmations matched to their callers, reconnection with
//! backoff and subscriptions restored.
//!
//! Every request reaches `rumqttc`'s request channel while this
//! connection's state lock is held, so the order of the channel is the order
//! of `sent`: the event loop reports each publish it writes
//! (`Outgoing::Publish(pkid)`) in that order, which is how a packet id is
//! tied to its caller, and the PUBACK (PUBCOMP for QoS 2) completes it.
//!
//! When the connection breaks, nothing `rumqttc` kept for a retransmission
//! is sent again by it: the requests it holds and the events it buffered are
//! dropped, every publish not yet confirmed fails with [`Lost`], and its
//! caller sends it again once the connection is back (at-least-once: the
//! broker may have it twice if only the PUBACK was lost). Acks of deliveries
//! received before the break are not sent (their epoch is over): the broker
//! sends those messages again on the resumed session.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{
    Filter, Packet, PubAckReason, PubRecReason, Publish, PublishProperties, RetainForwardRule,
    SubscribeReasonCode,
};
use rumqttc::v5::{AsyncClient, ClientError, Event, EventLoop, MqttOptions};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::convert::{ack_of, valid_topic};
use super::drive::drive;
use super::pump::Pump;
use super::room::Room;
use crate::{Error, Result};

/// Why a publish was not confirmed: the connection broke first. Its caller
/// sends it again once the connection is back.
#[derive(Debug)]
pub(super) struct Lost;

type Confirm = oneshot::Sender<std::result::Result<Result<()>, Lost>>;

/// Where received publishes go.
pub(super) trait Inbound: Send + Sync + 'static {
    /// A publish received on connection `epoch`. May wait (for room in a
    /// full buffer): the event loop is not polled meanwhile, so the socket
    /// is not read and TCP pushes back on the broker.
    fn deliver(&self, publish: Publish, epoch: u64) -> impl Future<Output = ()> + Send;

    /// The connection broke: what was received on it and not yet handed out
    /// is dropped (the broker sends unacked QoS 1/2 messages again).
    fn reset(&self);

    /// The connection is closing: nobody takes deliveries any more, and
    /// `deliver` must not wait.
    fn close(&self) {}
}

/// What one connection is.
pub(super) struct Settings {
    pub(super) options: MqttOptions,
    /// Filters subscribed at the start and again after every reconnect.
    pub(super) filters: Vec<Filter>,
    pub(super) backoff: (Duration, Duration),
    /// For logs and metrics.
    pub(super) label: String,
}

struct State {
    /// Counts broken connections: a delivery's ack is only sent on the
    /// connection it came on.
    epoch: u64,
    /// Publishes in the request channel, in its order.
    sent: VecDeque<(QoS, Confirm)>,
    /// Written, waiting for the PUBACK / PUBCOMP, by packet id.
    inflight: HashMap<u16, Confirm>,
    /// A publish `rumqttc` holds back because its packet id is still in use.
    collided: Option<(u16, Confirm)>,
    /// Subscribes in the request channel, then waiting for their SUBACK.
    subscribes: VecDeque<oneshot::Sender<Result<()>>>,
    subscribes_inflight: HashMap<u16, oneshot::Sender<Result<()>>>,
    /// Acks that found the request channel full, sent by the event-loop
    /// task as room appears. An ack never waits: a settling handler must
    /// not wait for an event loop that may itself wait for the handler's
    /// loop to take the next delivery.
    deferred_acks: VecDeque<(u16, QoS)>,
}

/// A connection's handle; the event-loop task holds another.
pub(super) struct Connection {
    client: AsyncClient,
    state: Mutex<State>,
    /// Room in the request channel, announced by the event loop.
    room: Room,
    /// `true` while connected.
    pub(super) up: watch::Sender<bool>,
    closed: AtomicBool,
    /// `true` once [`close`](Connection::close) has finished (or was
    /// cancelled): a second caller waits for it.
    finished: watch::Sender<bool>,
    /// Whether `deferred_acks` may hold any (set and cleared under the
    /// state lock; read without it).
    deferred: AtomicBool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The event loop (set once, right after the connection is made).
    pump: OnceLock<Arc<Pump>>,
    /// [`Inbound::close`] of where received publishes go.
    close_inbound: Box<dyn Fn() + Send + Sync>,
    /// Names the connection in logs.
    pub(super) label: String,
}

impl Connection {
    /// Connects (the first CONNACK within the options' connection timeout,
    /// or an error), subscribes `settings.filters` and starts the event-loop
    /// task.
    pub(super) async fn open<I: Inbound>(
        settings: Settings,
        capacity: usize,
        inbound: Arc<I>,
    ) -> Result<Arc<Connection>> {
        let Settings {
            options,
            filters,
            backoff,
            label,
        } = settings;
        let (host, port) = options.broker_address();
        let (client, mut eventloop) = AsyncClient::new(options, capacity.max(1));
        let session_present = loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => break ack.session_present,
                Ok(_) => continue,
                Err(err) => {
                    return Err(Error::Transport(
                        format!(
                            "cannot connect to the MQTT broker at {host}:{port} ({label}): {err}"
                        )
                        .into(),
                    ));
                }
            }
        };
        let conn = Arc::new(Connection {
            client,
            state: Mutex::new(State {
                epoch: 0,
                sent: VecDeque::new(),
                inflight: HashMap::new(),
                collided: None,
                subscribes: VecDeque::new(),
                subscribes_inflight: HashMap::new(),
                deferred_acks: VecDeque::new(),
            }),
            room: Room::default(),
            up: watch::Sender::new(true),
            closed: AtomicBool::new(false),
            finished: watch::Sender::new(false),
            deferred: AtomicBool::new(false),
            task: Mutex::new(None),
            pump: OnceLock::new(),
            close_inbound: {
                let inbound = Arc::clone(&inbound);
                Box::new(move || inbound.close())
            },
            label,
        });
        let subscribed = if filters.is_empty() {
            None
        } else {
            Some(conn.subscribe(filters.clone(), !session_present)?)
        };
        let pump = Pump::new(|turn| {
            drive(
                Arc::clone(&conn),
                eventloop,
                inbound,
                filters,
                backoff,
                turn,
            )
        });
        let task = tokio::spawn(Arc::clone(&pump).task());
        let _ = conn.pump.set(pump);
        *conn.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        if let Some(subscribed) = subscribed {
            let timeout = Duration::from_secs(10);
            match tokio::time::timeout(timeout, subscribed).await {
                Ok(Ok(result)) => result?,
                Ok(Err(_)) => {
                    return Err(Error::Transport(
                        "MQTT connection lost before the SUBACK".into(),
                    ));
                }
                Err(_) => {
                    return Err(Error::Transport(
                        format!("MQTT broker did not acknowledge the subscription in {timeout:?}")
                            .into(),
                    ));
                }
            }
        }
        Ok(conn)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The event loop, for a reader to poll while it waits.
    pub(super) fn pump(&self) -> &Pump {
        self.pump.get().expect("set by `open`")
    }

    /// Sends SUBSCRIBE for `filters` (in the request channel at once; the
    /// receiver resolves with the SUBACK). `fresh`: the broker keeps no
    /// subscription of ours, so retained messages are wanted.
    pub(super) fn subscribe(
        &self,
        mut filters: Vec<Filter>,
        fresh: bool,
    ) -> Result<oneshot::Receiver<Result<()>>> {
        if !fresh {
            for filter in &mut filters {
                filter.retain_forward_rule = RetainForwardRule::OnNewSubscribe;
            }
        }
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        self.client
            .try_subscribe_many(filters)
            .map_err(|err| client_error("subscribe", err))?;
        state.subscribes.push_back(tx);
        Ok(rx)
    }

    /// Publishes and waits until `deadline` for the broker's confirmation
    /// (none for QoS 0: written is done). Caught by a connection loss, it is
    /// sent again once the connection is back.
    pub(super) async fn publish(
        &self,
        topic: &str,
        qos: QoS,
        retain: bool,
        payload: bytes::Bytes,
        properties: PublishProperties,
        deadline: Instant,
    ) -> Result<()> {
        let work = async {
            loop {
                let confirmed = self
                    .submit(topic, qos, retain, &payload, &properties)
                    .await?;
                match confirmed.await {
                    Ok(Ok(result)) => return result,
                    // Lost with its connection: again, once it is back.
                    Ok(Err(Lost)) | Err(_) => self.connected().await?,
                }
            }
        };
        match tokio::time::timeout_at(deadline, work).await {
            Ok(result) => result,
            Err(_) => {
                crate::metrics::deadline_exceeded("mqtt");
                Err(Error::DeadlineExceeded(
                    "the MQTT broker did not confirm the publish before the deadline",
                ))
            }
        }
    }

    /// Puts one publish in the request channel, waiting for room.
    async fn submit(
        &self,
        topic: &str,
        qos: QoS,
        retain: bool,
        payload: &bytes::Bytes,
        properties: &PublishProperties,
    ) -> Result<oneshot::Receiver<std::result::Result<Result<()>, Lost>>> {
        let waiter = self.room.waiter();
        loop {
            let room = waiter.notified();
            {
                let mut state = self.lock();
                if self.is_closed() {
                    return Err(Error::Closed("MQTT connection is closed"));
                }
                let sent = self.client.try_publish_with_properties(
                    topic,
                    qos,
                    retain,
                    payload.clone(),
                    properties.clone(),
                );
                match sent {
                    Ok(()) => {
                        let (tx, rx) = oneshot::channel();
                        state.sent.push_back((qos, tx));
                        return Ok(rx);
                    }
                    Err(ClientError::TryRequest(_)) if !valid_topic(topic) => {
                        return Err(Error::Config(format!(
                            "`{topic}` is not an MQTT topic one can publish to (no `+`, `#`)"
                        )));
                    }
                    Err(ClientError::TryRequest(_)) => {}
                    Err(err) => return Err(client_error("publish", err)),
                }
            }
            room.await;
        }
    }

    /// Acknowledges a delivery received on connection `epoch` (PUBACK for
    /// QoS 1, PUBREC for QoS 2), without waiting: with the request channel
    /// full it is sent by the event-loop task as soon as there is room. One
    /// from a connection that has since broken is not sent: the broker sends
    /// the message again.
    pub(super) fn ack(&self, pkid: u16, qos: QoS, epoch: u64) -> Result<()> {
        if qos == QoS::AtMostOnce {
            return Ok(());
        }
        let mut state = self.lock();
        if state.epoch != epoch {
            tracing::debug!(conn = %self.label, pkid, "MQTT ack of a delivery from a broken connection not sent; the broker redelivers it");
            return Ok(());
        }
        if self.is_closed() {
            return Err(Error::Closed("MQTT connection is closed"));
        }
        if state.deferred_acks.is_empty() {
            match self.client.try_ack(&ack_of(pkid, qos)) {
                Ok(()) => return Ok(()),
                Err(ClientError::TryRequest(_)) => {}
                Err(err) => return Err(client_error("ack", err)),
            }
        }
        state.deferred_acks.push_back((pkid, qos));
        self.deferred.store(true, Ordering::Release);
        Ok(())
    }

    /// Sends deferred acks while the request channel has room.
    pub(super) fn flush_acks(&self) {
        if !self.deferred.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.lock();
        while let Some(&(pkid, qos)) = state.deferred_acks.front() {
            if self.client.try_ack(&ack_of(pkid, qos)).is_err() {
                return;
            }
            state.deferred_acks.pop_front();
        }
        self.deferred.store(false, Ordering::Release);
    }

    /// Waits until connected; `Closed` once closed.
    async fn connected(&self) -> Result<()> {
        let mut up = self.up.subscribe();
        loop {
            if self.is_closed() {
                return Err(Error::Closed("MQTT connection is closed"));
            }
            if *up.borrow_and_update() {
                return Ok(());
            }
            if up.changed().await.is_err() {
                return Err(Error::Closed("MQTT connection is closed"));
            }
        }
    }

    /// Sends DISCONNECT after what is already in the request channel (acks
    /// included) and waits a little for the event loop to end.
    /// A second call (the broker's close while the subscription's drop
    /// closes it) returns once the first one has: the acks are out then.
    pub(super) async fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            let _ = self.finished.subscribe().wait_for(|done| *done).await;
            return;
        }
        // Set however this call ends, also when its task is dropped.
        let _finished = Finished(&self.finished);
        (self.close_inbound)();
        if let Some(pump) = self.pump.get() {
            // The reader reads no more: the connection task drives to the end.
            pump.release();
        }
        // The acks made so far go out before the DISCONNECT.
        let until = Instant::now() + Duration::from_secs(1);
        let waiter = self.room.waiter();
        loop {
            let room = waiter.notified();
            self.flush_acks();
            if self.lock().deferred_acks.is_empty() || Instant::now() >= until {
                break;
            }
            let _ = tokio::time::timeout_at(until, room).await;
        }
        drop(waiter);
        {
            let _state = self.lock();
            let _ = self.client.try_disconnect();
        }
        self.up.send_replace(false);
        self.room.wake_all();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut task) = task
            && tokio::time::timeout(Duration::from_secs(2), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
        if let Some(pump) = self.pump.get() {
            // Aborted or not, the drive (which holds this connection) goes.
            pump.stop();
        }
        self.fail_all(|| Ok(Err(Error::Closed("MQTT connection is closed"))));
    }

    /// Every caller still waiting gets `outcome`.
    fn fail_all(&self, outcome: impl Fn() -> std::result::Result<Result<()>, Lost>) {
        let mut state = self.lock();
        for (_, confirm) in state.sent.drain(..) {
            let _ = confirm.send(outcome());
        }
        for (_, confirm) in state.inflight.drain() {
            let _ = confirm.send(outcome());
        }
        if let Some((_, confirm)) = state.collided.take() {
            let _ = confirm.send(outcome());
        }
        for tx in state.subscribes.drain(..) {
            let _ = tx.send(Err(Error::Transport("MQTT connection lost".into())));
        }
        for (_, tx) in state.subscribes_inflight.drain() {
            let _ = tx.send(Err(Error::Transport("MQTT connection lost".into())));
        }
    }

    /// Bookkeeping for one event of the event loop.
    pub(super) fn on_event(&self, event: &Event) {
        match event {
            Event::Outgoing(
                Outgoing::Publish(_) | Outgoing::AwaitAck(_) | Outgoing::Subscribe(_),
            )
            | Event::Incoming(
                Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) | Packet::SubAck(_),
            ) => {}
            // Nothing to look up (acks written, pings): room in the channel.
            Event::Outgoing(_) => {
                self.room.made();
                return;
            }
            _ => return,
        }
        let mut state = self.lock();
        match event {
            Event::Outgoing(Outgoing::Publish(pkid)) => {
                if let Some((held, _)) = &state.collided
                    && held == pkid
                {
                    let (_, confirm) = state.collided.take().expect("checked above");
                    state.inflight.insert(*pkid, confirm);
                } else if let Some((qos, confirm)) = state.sent.pop_front() {
                    if qos == QoS::AtMostOnce {
                        let _ = confirm.send(Ok(Ok(())));
                    } else {
                        state.inflight.insert(*pkid, confirm);
                    }
                }
                self.room.made();
            }
            Event::Outgoing(Outgoing::AwaitAck(pkid)) => {
                if let Some((_, confirm)) = state.sent.pop_front() {
                    state.collided = Some((*pkid, confirm));
                }
                self.room.made();
            }
            Event::Outgoing(Outgoing::Subscribe(pkid)) => {
                if let Some(tx) = state.subscribes.pop_front() {
                    state.subscribes_inflight.insert(*pkid, tx);
                }
                self.room.made();
            }
            Event::Outgoing(_) => self.room.made(),
            Event::Incoming(Packet::PubAck(ack)) => {
                if let Some(confirm) = state.inflight.remove(&ack.pkid) {
                    let result = match ack.reason {
                        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
                        reason => Err(refused(format!("{reason:?}"))),
                    };
                    let _ = confirm.send(Ok(result));
                }
            }
            Event::Incoming(Packet::PubRec(rec)) => match rec.reason {
                PubRecReason::Success | PubRecReason::NoMatchingSubscribers => {}
                reason => {
                    if let Some(confirm) = state.inflight.remove(&rec.pkid) {
                        let _ = confirm.send(Ok(Err(refused(format!("{reason:?}")))));
                    }
                }
            },
            Event::Incoming(Packet::PubComp(comp)) => {
                if let Some(confirm) = state.inflight.remove(&comp.pkid) {
                    let _ = confirm.send(Ok(Ok(())));
                }
            }
            Event::Incoming(Packet::SubAck(ack)) => {
                if let Some(tx) = state.subscribes_inflight.remove(&ack.pkid) {
                    let refused = ack
                        .return_codes
                        .iter()
                        .find(|code| !matches!(code, SubscribeReasonCode::Success(_)));
                    let _ = tx.send(match refused {
                        None => Ok(()),
                        Some(code) => Err(Error::Transport(
                            format!("the MQTT broker refused the subscription: {code:?}").into(),
                        )),
                    });
                }
            }
            _ => {}
        }
    }

    /// The connection broke: drop what `rumqttc` kept to send again (and
    /// what reached its channel since), end the epoch, fail the waiting
    /// publishes so their callers send them again.
    pub(super) fn on_break<I: Inbound>(&self, eventloop: &mut EventLoop, inbound: &I) {
        {
            let mut state = self.lock();
            eventloop.clean();
            eventloop.pending.clear();
            eventloop.state.events.clear();
            state.deferred_acks.clear();
            state.epoch += 1;
        }
        self.up.send_replace(false);
        inbound.reset();
        self.fail_all(|| Err(Lost));
        self.room.wake_all();
    }
}

/// Marks a [`Connection::close`] finished when dropped.
struct Finished<'a>(&'a watch::Sender<bool>);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

fn refused(reason: String) -> Error {
    Error::Transport(format!("the MQTT broker refused the publish: {reason}").into())
}

fn client_error(what: &str, err: ClientError) -> Error {
    Error::Transport(format!("MQTT {what}: {err}").into())
}
