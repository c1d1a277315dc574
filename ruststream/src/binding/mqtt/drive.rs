//! A connection's event-loop task: polls `rumqttc`'s event loop until the
//! connection closes, hands received publishes over, keeps the
//! connection's bookkeeping, and reconnects with backoff (subscriptions
//! restored).

use std::sync::Arc;
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{Filter, Packet};
use rumqttc::v5::{Event, EventLoop};

use super::connection::{Connection, Inbound};
use super::pump::Turn;

/// The event-loop task: polls until closed, reconnecting with backoff.
pub(super) async fn drive<I: Inbound>(
    conn: Arc<Connection>,
    mut eventloop: EventLoop,
    inbound: Arc<I>,
    filters: Vec<Filter>,
    (first_backoff, max_backoff): (Duration, Duration),
    turn: Turn,
) {
    let mut backoff = first_backoff;
    let mut epoch = 0;
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                // Only this task ends an epoch (`on_break`): its own count
                // is the current one, no lock needed.
                inbound.deliver(publish, epoch).await;
                turn.yield_to_reader().await;
            }
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                backoff = first_backoff;
                crate::metrics::connection_event("mqtt", "reconnected");
                tracing::info!(conn = %conn.label, session_present = ack.session_present, "MQTT reconnected");
                conn.up.send_replace(true);
                if !filters.is_empty() {
                    // Subscribe again, also when the broker kept the
                    // session: Mosquitto 2.0 restores a persisted session
                    // without its shared subscriptions. Subscribing again
                    // replaces a subscription, and loses nothing.
                    match conn.subscribe(filters.clone(), !ack.session_present) {
                        Ok(_suback) => {
                            tracing::info!(conn = %conn.label, "MQTT subscriptions restored")
                        }
                        Err(err) => {
                            tracing::warn!(conn = %conn.label, error = %err, "MQTT resubscribe failed")
                        }
                    }
                }
            }
            Ok(event) => {
                conn.on_event(&event);
                if let Event::Outgoing(_) = event {
                    conn.flush_acks();
                }
            }
            Err(err) => {
                if conn.is_closed() {
                    break;
                }
                crate::metrics::connection_event("mqtt", "disconnected");
                tracing::warn!(conn = %conn.label, error = %err, retry_in = ?backoff, "MQTT connection lost; reconnecting");
                conn.on_break(&mut eventloop, &*inbound);
                epoch += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(max_backoff);
                if conn.is_closed() {
                    break;
                }
            }
        }
    }
}
