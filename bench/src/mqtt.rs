//! MQTT (Mosquitto) next to the raw `rumqttc` client in the same process:
//! `n` messages of 512 bytes published at QoS 1 by a raw publisher and
//! consumed at QoS 1 with a PUBACK per message (manual acks, receive maximum
//! 64). The publisher is the same raw client on both sides and keeps at most
//! `WINDOW` messages ahead of the consumer (Mosquitto drops QoS 1 messages
//! queued past `max_queued_messages`, 1000 by default), so the pair compares
//! consumption: the framework's subscription, permits and handler against a
//! bare event loop acking each publish. Every client here sets TCP_NODELAY,
//! as the binding does.
//!
//! Where the raw loop runs matters as much as what it does: `raw-mqtt` runs
//! it in a task of the runtime, as the framework runs its loops (and as the
//! NATS pair runs its raw consumer); `raw-mqtt-main` runs it in
//! `block_on`, on the main thread — a third OS thread beside the runtime's
//! two workers, which the framework's loop, its connection task and the
//! publisher share. On 2 cores, where ~70% of this pair's CPU time is the
//! kernel's TCP path, the raw loop is 5–15% faster there than in a task.

use std::time::Duration;

use ruststream::bytes::Bytes;
use ruststream::mqtt::MqttBroker;
use ruststream::{App, BoxError, Broker, subscriber};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use crate::progress;
use crate::scenarios::{Mark, Measurement};

/// The scenarios that need Mosquitto.
pub const NAMES: &[&str] = &["mqtt", "raw-mqtt", "raw-mqtt-main"];

const RECEIVE_MAXIMUM: u16 = 64;
/// How far the publisher may run ahead of the consumer.
const WINDOW: u64 = 512;

/// Runs MQTT scenario `name` over `n` messages; `None` for other names.
pub async fn run(name: &str, n: u64) -> Option<Result<Measurement, BoxError>> {
    Some(match name {
        "mqtt" => framework(n).await,
        "raw-mqtt" => raw(n, Placement::Task).await,
        "raw-mqtt-main" => raw(n, Placement::Main).await,
        _ => return None,
    })
}

fn url() -> String {
    std::env::var("RUSTSTREAM_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".to_owned())
}

/// Host and port of [`url`].
fn address() -> (String, u16) {
    let url = url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let rest = rest.trim_end_matches('/');
    match rest.rsplit_once(':') {
        Some((host, port)) => (host.to_owned(), port.parse().unwrap_or(1883)),
        None => (rest.to_owned(), 1883),
    }
}

fn options(id: &str) -> MqttOptions {
    let (host, port) = address();
    let mut options = MqttOptions::new(format!("{id}-{}", std::process::id()), host, port);
    options.set_keep_alive(Duration::from_secs(30));
    options.set_max_packet_size(Some(1 << 20));
    // The binding's transport: without TCP_NODELAY, Nagle's algorithm holds
    // each small packet (a PUBACK, a publish) until the broker's TCP ack of
    // the previous one, and the pair would compare socket options.
    let mut network = options.network_options();
    network.set_tcp_nodelay(true);
    options.set_network_options(network);
    options
}

/// Publishes `n` QoS 1 messages to `topic`, never more than `WINDOW` ahead
/// of what the consumer has seen; returns once all are confirmed.
async fn publish(topic: &'static str, n: u64) -> Result<(), BoxError> {
    let (client, mut eventloop) = AsyncClient::new(options("bench-pub"), 1024);
    let acked = tokio::spawn(async move {
        let mut acked = 0;
        while acked < n {
            if let Event::Incoming(Packet::PubAck(_)) = eventloop.poll().await? {
                acked += 1;
            }
        }
        Ok::<_, rumqttc::v5::ConnectionError>(())
    });
    let payload = Bytes::from(vec![b'x'; 512]);
    for sent in 0..n {
        while sent >= progress::count() + WINDOW {
            // A millisecond is a few dozen messages: the window never
            // drains, and the wait takes no core from the consumer.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        client
            .publish(topic, QoS::AtLeastOnce, false, payload.clone())
            .await?;
    }
    acked.await??;
    drop(client);
    Ok(())
}

async fn framework(n: u64) -> Result<Measurement, BoxError> {
    #[subscriber("bench/mqtt/framework")]
    async fn count(_payload: Bytes) {
        progress::seen();
    }
    let mqtt = MqttBroker::builder()
        .receive_maximum(RECEIVE_MAXIMUM)
        .connect(&url())
        .await?;
    let running = App::new()
        .broker(mqtt.clone())
        .subscriber(count)
        .start()
        .await?;
    progress::expect(n);
    let start = Mark::now();
    let publisher = tokio::spawn(publish("bench/mqtt/framework", n));
    progress::all_seen().await;
    let end = Mark::now();
    publisher.await??;
    running.shutdown().await?;
    mqtt.close().await?;
    Ok(start.until(end))
}

/// Where the raw consumer loop runs.
#[derive(Clone, Copy)]
enum Placement {
    /// A task of the runtime (`tokio::spawn`), as the framework's loops.
    Task,
    /// The main thread (`block_on`), beside the runtime's workers.
    Main,
}

async fn raw(n: u64, placement: Placement) -> Result<Measurement, BoxError> {
    let mut options = options("bench-raw-sub");
    options.set_manual_acks(true);
    options.set_receive_maximum(Some(RECEIVE_MAXIMUM));
    // Room for every ack the event loop has not taken yet: this task both
    // polls it and queues the acks, so a full channel would stall it.
    let (client, mut eventloop) = AsyncClient::new(options, 4096);
    client
        .subscribe("bench/mqtt/raw", QoS::AtLeastOnce)
        .await?;
    // Subscribed once the SUBACK is in.
    loop {
        if let Event::Incoming(Packet::SubAck(_)) = eventloop.poll().await? {
            break;
        }
    }
    progress::expect(n);
    let start = Mark::now();
    let publisher = tokio::spawn(publish("bench/mqtt/raw", n));
    let consume = async move {
        let mut seen = 0;
        while seen < n {
            if let Event::Incoming(Packet::Publish(publish)) = eventloop.poll().await? {
                std::hint::black_box(&publish.payload);
                client.ack(&publish).await?;
                progress::seen();
                seen += 1;
            }
        }
        Ok::<_, BoxError>((client, eventloop))
    };
    let (client, mut eventloop) = match placement {
        Placement::Task => tokio::spawn(consume).await??,
        Placement::Main => consume.await?,
    };
    let end = Mark::now();
    publisher.await??;
    client.disconnect().await?;
    // Send the DISCONNECT.
    let _ = tokio::time::timeout(Duration::from_secs(1), eventloop.poll()).await;
    Ok(start.until(end))
}
