//! Fair multi-source receive on the memory Core (JQ-12) and per-peer
//! accounting (JQ-24 items 7, 8, 9): a queue fed by several connections reads
//! them in rounds of at most 64 frames, a byte budget and a time budget, and
//! the next round starts after the connection where the last one stopped.

mod common;

use std::time::Duration;

use common::{frame, within};
use ruststream::binding::memory::{CoreHwm, ROUND_RECORDS, ReceiveRound};
use ruststream::{Broker, Delivery, Error, MemoryBroker, Message, SubscribeOptions, Subscription};
use tokio::time::Instant;

/// A broker whose rounds end only at the given byte budget or time.
fn broker(round: ReceiveRound) -> MemoryBroker {
    MemoryBroker::builder().receive_round(round).build()
}

const NO_LIMIT: Duration = Duration::from_secs(3600);

/// Publishes `n` frames `"<peer>:<i>"` from each connection, in turn.
async fn fill(peers: &[(&str, &MemoryBroker)], n: usize) {
    for (name, conn) in peers {
        for i in 0..n {
            conn.publish_message("fair", Message::new(format!("{name}:{i}")), None)
                .await
                .unwrap();
        }
    }
}

/// Receives `n` frames and returns the peer name of each.
async fn receive(sub: &mut impl Subscription, n: usize) -> Vec<String> {
    let mut peers = Vec::with_capacity(n);
    for _ in 0..n {
        let delivery = within(5, "a queued frame", sub.next())
            .await
            .expect("subscription open");
        let text = std::str::from_utf8(delivery.envelope().payload())
            .unwrap()
            .to_owned();
        peers.push(text.split(':').next().unwrap().to_owned());
        delivery.ack().await.unwrap();
    }
    peers
}

/// Run-length form of a sequence of peer names: `[("a", 64), ("b", 64)]`.
fn runs(peers: &[String]) -> Vec<(String, usize)> {
    let mut runs: Vec<(String, usize)> = Vec::new();
    for peer in peers {
        match runs.last_mut() {
            Some((last, n)) if last == peer => *n += 1,
            _ => runs.push((peer.clone(), 1)),
        }
    }
    runs
}

fn run(peer: &str, n: usize) -> (String, usize) {
    (peer.to_owned(), n)
}

#[tokio::test]
async fn jq24_8_a_round_stops_at_64_records_and_the_next_starts_after_it() {
    let server = broker(ReceiveRound {
        bytes: usize::MAX,
        time: NO_LIMIT,
    });
    let mut sub = server
        .subscribe(SubscribeOptions::new("fair"))
        .await
        .unwrap();
    let (a, b, c) = (server.connect(), server.connect(), server.connect());
    fill(&[("a", &a), ("b", &b), ("c", &c)], 100).await;

    let order = receive(&mut sub, 300).await;
    assert_eq!(ROUND_RECORDS, 64);
    // Round 1 stops at 64 records on a; round 2 starts at b, round 3 at c.
    // Round 4 starts at a again, drains its last 36 and goes on to b for 28
    // more; round 5 starts after b, at c.
    assert_eq!(
        runs(&order),
        vec![
            run("a", 64),
            run("b", 64),
            run("c", 64),
            run("a", 36),
            run("b", 28),
            run("c", 36),
            run("b", 8),
        ]
    );
}

#[tokio::test]
async fn jq24_8_a_round_stops_at_its_byte_budget() {
    // Ten frames' worth of bytes: the byte budget ends each round first.
    let one = frame("a:00".len());
    let server = broker(ReceiveRound {
        bytes: 10 * one,
        time: NO_LIMIT,
    });
    let mut sub = server
        .subscribe(SubscribeOptions::new("fair"))
        .await
        .unwrap();
    let (a, b) = (server.connect(), server.connect());
    // Two-digit indices: every frame has the same size.
    for (name, conn) in [("a", &a), ("b", &b)] {
        for i in 10..40 {
            conn.publish_message("fair", Message::new(format!("{name}:{i}")), None)
                .await
                .unwrap();
        }
    }
    let order = receive(&mut sub, 60).await;
    assert_eq!(
        runs(&order),
        [("a", 10), ("b", 10)]
            .iter()
            .cycle()
            .take(6)
            .map(|(p, n)| run(p, *n))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn jq24_8_a_round_stops_at_its_time_budget() {
    // A zero time budget ends every round after its first frame: strict
    // round robin, whatever the count and byte budgets say.
    let server = broker(ReceiveRound {
        bytes: usize::MAX,
        time: Duration::ZERO,
    });
    let mut sub = server
        .subscribe(SubscribeOptions::new("fair"))
        .await
        .unwrap();
    let (a, b, c) = (server.connect(), server.connect(), server.connect());
    fill(&[("a", &a), ("b", &b), ("c", &c)], 5).await;
    let order = receive(&mut sub, 15).await;
    let expected: Vec<String> = ["a", "b", "c"]
        .iter()
        .cycle()
        .take(15)
        .map(|p| p.to_string())
        .collect();
    assert_eq!(order, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_7_while_one_connection_keeps_sending_the_others_are_received() {
    // Room for about 1,000 of the flooder's frames in its lane.
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(1000 * frame("flood".len())))
        .build();
    let mut sub = server
        .subscribe(SubscribeOptions::new("fair"))
        .await
        .unwrap();
    let flooder = server.connect();
    let flood = tokio::spawn(async move {
        // Keeps sending until the test ends it; waits whenever its lane is
        // full.
        loop {
            if flooder
                .publish_message("fair", Message::new("flood"), None)
                .await
                .is_err()
            {
                return;
            }
        }
    });
    // Let the flooder fill its lane first.
    common::until(10, "the flooder's lane fills", || {
        server.queues()[0].queued >= 990
    })
    .await;

    let quiet = server.connect();
    for i in 0..10 {
        quiet
            .publish_message("fair", Message::new(format!("quiet:{i}")), None)
            .await
            .expect("another peer's lane has room");
    }
    // With one FIFO, the quiet frames would wait behind ~1,000 flood frames.
    // With fair rounds they come within the current round (≤ 64) plus 10.
    let order = receive(&mut sub, ROUND_RECORDS as usize + 10).await;
    let quiet_seen = order.iter().filter(|p| *p == "quiet").count();
    assert_eq!(quiet_seen, 10, "order: {:?}", runs(&order));
    assert!(!flood.is_finished(), "the flooder was still sending");
    flood.abort();
}

#[tokio::test]
async fn jq24_9_accounting_is_per_peer() {
    let budget = 4 * frame("x:0".len());
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(budget))
        .build();
    let _sub = server
        .subscribe(SubscribeOptions::new("fair"))
        .await
        .unwrap();
    let (a, b) = (server.connect(), server.connect());
    for i in 0..4 {
        a.publish_message("fair", Message::new(format!("a:{i}")), None)
            .await
            .unwrap();
    }
    // a's lane is at its budget: a waits, and fails at its deadline …
    let soon = Instant::now() + Duration::from_millis(20);
    let refused = a
        .publish_message("fair", Message::new("a:4"), Some(soon))
        .await;
    assert!(
        matches!(refused, Err(Error::DeadlineExceeded(_))),
        "{refused:?}"
    );
    // … while b, another peer of the same queue, has its own budget.
    for i in 0..4 {
        b.publish_message("fair", Message::new(format!("b:{i}")), Some(soon))
            .await
            .expect("b's lane has room");
    }
    let stats = &server.queues()[0];
    assert_eq!(stats.peers, 2);
    assert_eq!(stats.queued, 8);
    assert_eq!(stats.bytes, 2 * budget);
}

#[tokio::test]
async fn jq24_9_a_redelivery_goes_back_to_its_own_peers_lane() {
    let budget = 2 * frame("a:0".len());
    let server = MemoryBroker::builder()
        .hwm(CoreHwm::default().budget_bytes(budget))
        .build();
    let mut sub = server
        .subscribe(SubscribeOptions::new("fair"))
        .await
        .unwrap();
    let (a, b) = (server.connect(), server.connect());
    a.publish_message("fair", Message::new("a:0"), None)
        .await
        .unwrap();
    b.publish_message("fair", Message::new("b:0"), None)
        .await
        .unwrap();
    // a's only frame is taken (its lane empties, the round moves on to b's)
    // and given back.
    let taken = within(5, "a's frame", sub.next()).await.unwrap();
    assert_eq!(taken.envelope().payload(), "a:0".as_bytes());
    taken.nack().await.unwrap();
    let stats = &server.queues()[0];
    assert_eq!((stats.peers, stats.queued), (2, 2), "each in its own lane");
    // b's lane holds only b's frame: one more of b's fits its budget.
    let soon = Instant::now() + Duration::from_millis(20);
    b.publish_message("fair", Message::new("b:1"), Some(soon))
        .await
        .expect("b's budget is b's alone");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let d = within(5, "a queued frame", sub.next()).await.unwrap();
        seen.push(String::from_utf8(d.envelope().payload().to_vec()).unwrap());
        assert_eq!(
            d.envelope().attempt(),
            if seen.last().unwrap() == "a:0" { 2 } else { 1 }
        );
        d.ack().await.unwrap();
    }
    seen.sort();
    assert_eq!(seen, ["a:0", "b:0", "b:1"]);
}
