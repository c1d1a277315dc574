//! Sensors on MQTT: devices publish readings to
//! `example/sensors/<room>/temperature`; an ingest service shares them out
//! over a queue group (`$share/ingest/…`) with a `+` wildcard, an audit
//! subscriber sees every message under `#` at QoS 0, a reading that cannot
//! be right is dead-lettered with its reason, and a dashboard asks the
//! service for a room's latest reading (MQTT 5 request/reply).
//!
//! Needs Mosquitto on `RUSTSTREAM_MQTT_URL` (default `mqtt://127.0.0.1:1883`);
//! `scripts/test.sh` starts it when it is down. Run it with
//! `cargo run --example mqtt_sensors`. It exits 0 once every reading is
//! handled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::extract::Subject;
use ruststream::mqtt::{MqttBroker, QoS};
use ruststream::prelude::*;
use ruststream::{SubscribeOptions, header};
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct Reading {
    sensor: String,
    celsius: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Ask {
    room: String,
}

static HANDLED: AtomicU32 = AtomicU32::new(0);
static AUDITED: AtomicU32 = AtomicU32::new(0);
static ALL_DONE: Notify = Notify::const_new();
static LATEST: Mutex<Option<HashMap<String, f64>>> = Mutex::new(None);
const ROOMS: [&str; 3] = ["kitchen", "hall", "attic"];
const READINGS: u32 = 9;

fn done() {
    if HANDLED.load(Ordering::SeqCst) == READINGS && AUDITED.load(Ordering::SeqCst) >= READINGS {
        ALL_DONE.notify_one();
    }
}

/// Ingest: `+` matches the room; members of `ingest` share the readings.
#[subscriber(
    "example/sensors/+/temperature",
    queue_group = "ingest",
    dead_letter = "example/sensors/dead"
)]
async fn ingest(reading: Reading, subject: Subject) -> Result<(), HandlerError> {
    HANDLED.fetch_add(1, Ordering::SeqCst);
    let room = subject
        .0
        .as_str()
        .split('/')
        .nth(2)
        .unwrap_or("?")
        .to_owned();
    let outcome = if !(-60.0..=90.0).contains(&reading.celsius) {
        Err(HandlerError::reject(format!(
            "{} °C from {} cannot be right",
            reading.celsius, reading.sensor
        )))
    } else {
        println!("{room}: {} °C ({})", reading.celsius, reading.sensor);
        let mut latest = LATEST.lock().unwrap();
        latest.get_or_insert_default().insert(room, reading.celsius);
        Ok(())
    };
    done();
    outcome
}

/// Audit: every message under `example/sensors/`, at QoS 0 (set on the
/// broker for this subject).
#[subscriber("example/sensors/#")]
async fn audit(_message: Bytes) {
    AUDITED.fetch_add(1, Ordering::SeqCst);
    done();
}

/// The dashboard's question: a room's latest reading.
#[subscriber("example/dashboard/latest")]
async fn latest(ask: Ask) -> Option<f64> {
    let latest = LATEST.lock().unwrap();
    latest
        .as_ref()
        .and_then(|rooms| rooms.get(&ask.room).copied())
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    let url =
        std::env::var("RUSTSTREAM_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into());
    let mqtt = MqttBroker::builder()
        // No client id: a random one, and sessions that end with the
        // connections (a service gives a stable one for persistent sessions).
        .subscription_qos("example/sensors/#", QoS::AtMostOnce)
        .connect(&url)
        .await?;
    let mut dead = mqtt
        .subscribe(SubscribeOptions::new("example/sensors/dead"))
        .await?;
    let running = App::new()
        .broker(mqtt.clone())
        .subscriber(ingest)
        .subscriber(audit)
        .subscriber(latest)
        .start()
        .await?;

    let devices = Publisher::new(mqtt.clone());
    for i in 0..READINGS {
        let room = ROOMS[i as usize % ROOMS.len()];
        let reading = Reading {
            sensor: format!("{room}-1"),
            celsius: if i == 4 { 400.0 } else { 18.0 + f64::from(i) },
        };
        // Confirmed (PUBACK) when this returns.
        devices
            .publish(&format!("example/sensors/{room}/temperature"), &reading)
            .await?;
    }
    tokio::time::timeout(Duration::from_secs(30), ALL_DONE.notified())
        .await
        .map_err(|_| ruststream::Error::App("not every reading was handled in 30 s".into()))?;

    let rejected = tokio::time::timeout(Duration::from_secs(10), dead.next())
        .await
        .map_err(|_| ruststream::Error::App("no dead letter in 10 s".into()))?
        .expect("open");
    println!(
        "dead-lettered from {}: {}",
        rejected
            .envelope()
            .headers()
            .get(header::ORIGINAL_SUBJECT)
            .unwrap_or("?"),
        rejected
            .envelope()
            .headers()
            .get(header::ERROR)
            .unwrap_or("?")
    );
    rejected.ack().await?;

    let dashboard = Publisher::new(mqtt.clone());
    let kitchen: Option<f64> = dashboard
        .request(
            "example/dashboard/latest",
            &Ask {
                room: "kitchen".into(),
            },
            Duration::from_secs(5),
        )
        .await?;
    println!("dashboard: the kitchen's latest is {kitchen:?} °C");
    if kitchen.is_none() {
        return Err(ruststream::Error::App("no kitchen reading".into()));
    }

    running.shutdown().await?;
    mqtt.close().await?;
    println!("all {READINGS} readings handled and audited");
    Ok(())
}
