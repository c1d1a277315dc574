//! The MQTT binding through broker restarts, on a Mosquitto of the test's
//! own (a free loopback port, a config file in a temp dir, stopped by its
//! pid): nothing the broker confirmed is lost, and subscriptions are
//! restored — from the broker's persisted session, or made again when the
//! broker lost it.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::server::OwnServer;
use common::{unique, within};
use ruststream::mqtt::{MqttBroker, MqttBrokerBuilder};
use ruststream::{Broker, Delivery, Message, SubscribeOptions, Subscription};

/// A mosquitto on `port` with its config and persistence in `dir`.
fn mosquitto(port: u16, dir: &Path) -> Command {
    // Started as root, mosquitto runs as its own user, which must be able
    // to write its database here.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = dir.join("mosquitto.conf");
    std::fs::write(
        &config,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n\
             persistence_location {}/\nlog_dest none\n",
            dir.display()
        ),
    )
    .unwrap();
    let program = if Path::new("/usr/sbin/mosquitto").exists() {
        "/usr/sbin/mosquitto"
    } else {
        "mosquitto"
    };
    let mut command = Command::new(program);
    command.arg("-c").arg(config);
    command
}

fn quick() -> MqttBrokerBuilder {
    MqttBroker::builder()
        .session_expiry(Duration::from_secs(300))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .publish_timeout(Duration::from_secs(20))
}

/// A graceful stop (SIGTERM: mosquitto saves its sessions), some downtime,
/// and a start: QoS 1 messages published before, during and after reach
/// the subscription — every one the broker confirmed — and the publishes
/// caught by the outage are sent again once it is back. (A plain
/// subscription: Mosquitto 2.0 restores a persisted session without its
/// shared subscriptions, so until the binding has subscribed again a
/// queue group's messages find no subscriber.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_loses_nothing_it_confirmed() {
    let mut server = OwnServer::custom("mosquitto", mosquitto).await;
    let url = format!("mqtt://127.0.0.1:{}", server.port);
    let topic = unique("rs/fault/");
    let app = quick()
        .client_id(unique("rs-fault-"))
        .connect(&url)
        .await
        .unwrap();
    let sender = quick().connect(&url).await.unwrap();
    let mut sub = app
        .subscribe(SubscribeOptions::new(topic.as_str()))
        .await
        .unwrap();
    let publishing = {
        let (sender, topic) = (sender.clone(), topic.clone());
        tokio::spawn(async move {
            for i in 0..200u32 {
                sender
                    .publish_message(&topic, Message::new(i.to_string()), None)
                    .await
                    .unwrap_or_else(|err| panic!("publish {i}: {err}"));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let mut got = BTreeSet::new();
    let received = tokio::time::timeout(Duration::from_secs(60), async {
        let mut restarted = false;
        while got.len() < 200 {
            let d = sub.next().await.expect("the subscription ended");
            got.insert(
                String::from_utf8_lossy(d.envelope().payload())
                    .parse::<u32>()
                    .unwrap(),
            );
            d.ack().await.unwrap();
            if !restarted && got.len() == 50 {
                restarted = true;
                server.stop().await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                server.start_again().await;
            }
        }
    })
    .await;
    let missing: Vec<u32> = (0..200).filter(|i| !got.contains(i)).collect();
    assert!(
        received.is_ok(),
        "timed out after 60s with {} of 200 messages; missing {missing:?}",
        got.len()
    );
    within(30, "the publisher to finish", publishing)
        .await
        .unwrap();
    assert_eq!(got, (0..200).collect());
    app.close().await.unwrap();
    sender.close().await.unwrap();
}

/// `kill -9` of a broker that persists nothing: the sessions are gone, so
/// the binding subscribes again, and what is published afterwards arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_made_again_when_the_broker_lost_them() {
    let mut server = OwnServer::custom("mosquitto", |port, dir| {
        let command = mosquitto(port, dir);
        // No persistence: a restart forgets every session.
        let config = dir.join("mosquitto.conf");
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(
            &config,
            text.replace("persistence true", "persistence false"),
        )
        .unwrap();
        command
    })
    .await;
    let url = format!("mqtt://127.0.0.1:{}", server.port);
    let topic = unique("rs/resub/");
    let app = quick().connect(&url).await.unwrap();
    let sender = quick().connect(&url).await.unwrap();
    let mut sub = app
        .subscribe(SubscribeOptions::new(topic.as_str()))
        .await
        .unwrap();
    sender
        .publish_message(&topic, Message::new("before"), None)
        .await
        .unwrap();
    let d = within(10, "the message before", sub.next()).await.unwrap();
    d.ack().await.unwrap();
    server.restart().await;
    // Published until the restored subscription gets one: the first ones
    // may reach the broker before the subscription is made again.
    let got = within(30, "a message after the restart", async {
        let mut i = 0;
        loop {
            sender
                .publish_message(&topic, Message::new(format!("after {i}")), None)
                .await
                .unwrap();
            i += 1;
            if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(200), sub.next()).await
            {
                let text = String::from_utf8_lossy(d.envelope().payload()).into_owned();
                d.ack().await.unwrap();
                break text;
            }
        }
    })
    .await;
    assert!(got.starts_with("after"), "{got}");
    app.close().await.unwrap();
    sender.close().await.unwrap();
}

/// A publish waits for the broker's PUBACK, and no longer than its
/// deadline: with the broker down it fails with `DeadlineExceeded` (JQ-19);
/// once the broker is back, publishing works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_waits_for_the_puback_until_its_deadline() {
    let mut server = OwnServer::custom("mosquitto", mosquitto).await;
    let url = format!("mqtt://127.0.0.1:{}", server.port);
    let topic = unique("rs/deadline/");
    let sender = quick().connect(&url).await.unwrap();
    let mut sub = sender
        .subscribe(SubscribeOptions::new(topic.as_str()))
        .await
        .unwrap();
    server.stop().await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    let result = within(
        5,
        "the publish to end at its deadline",
        sender.publish_message(&topic, Message::new("lost"), Some(deadline)),
    )
    .await;
    assert!(
        matches!(result, Err(ruststream::Error::DeadlineExceeded(_))),
        "{result:?}"
    );
    server.start_again().await;
    // Publishing works again (each publish confirmed), and once the
    // subscription is back one of them arrives. (The one that timed out
    // may arrive too: at least once.)
    within(20, "a message after the restart", async {
        let mut i = 0;
        loop {
            sender
                .publish_message(&topic, Message::new(format!("back {i}")), None)
                .await
                .unwrap();
            i += 1;
            if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(200), sub.next()).await
            {
                let body = String::from_utf8_lossy(d.envelope().payload()).into_owned();
                d.ack().await.unwrap();
                if body.starts_with("back") {
                    break;
                }
            }
        }
    })
    .await;
    sender.close().await.unwrap();
}
