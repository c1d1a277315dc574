//! The RabbitMQ binding against a real rabbitmq-server: the conformance
//! suite (request/reply over direct reply-to included), the dead-letter
//! content, prefetch never above what the app's job queue holds, and a
//! connection closed by the server recovered without losing a message.
//!
//! Needs RabbitMQ on `RUSTSTREAM_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`); `scripts/test.sh` starts it when
//! it is down. The tests fail — never skip — when it is unreachable.

mod common;

use common::blocked::Blocked;
use common::retry_once::{RetryApp, in_a_process_that_dies};
use common::{unique, until, within};
use ruststream::conformance::{self, Capabilities, Harness};
use ruststream::ingress::JobQueueSettings;
use ruststream::rabbitmq::RabbitBroker;
use ruststream::subscriber::SubscriberConfig;
use ruststream::{
    App, Broker, Delivery, Message, Requester, Result, SubscribeOptions, Subscription, header,
};

const START: &str = "rabbitmq-server -detached with a loopback-only config (see \
     ../shared/services.md; or run scripts/test.sh, which starts it)";

fn url() -> String {
    std::env::var("RUSTSTREAM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// Test queues go away a minute after their last consumer.
fn builder() -> ruststream::rabbitmq::RabbitBrokerBuilder {
    RabbitBroker::builder().queue_expires(std::time::Duration::from_secs(60))
}

async fn rabbit() -> RabbitBroker {
    let url = url();
    match builder().connect(&url).await {
        Ok(rabbit) => rabbit,
        Err(err) => panic!("RabbitMQ is not reachable at {url}: {err}\nstart it with: {START}"),
    }
}

struct Rabbit;

impl Harness for Rabbit {
    type Broker = RabbitBroker;

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    async fn connect(&self, _prefix: &str) -> Result<RabbitBroker> {
        Ok(rabbit().await)
    }
}

/// A broker that is down at start is a transport error at once, naming
/// the address without its password (the client alone would retry the
/// connection for minutes).
#[tokio::test]
async fn connecting_to_a_broker_that_is_down_fails_at_once() {
    let refused = within(
        15,
        "the connect error",
        RabbitBroker::connect("amqp://guest:s3cret@127.0.0.1:1/%2f"),
    )
    .await;
    match refused {
        Err(ruststream::Error::Transport(err)) => {
            let err = err.to_string();
            assert!(err.contains("amqp://guest:***@127.0.0.1:1/%2f"), "{err}");
            assert!(!err.contains("s3cret"), "the password stays out: {err}");
        }
        Err(other) => panic!("expected a transport error, got {other}"),
        Ok(_) => panic!("nothing listens on port 1"),
    }
}

/// A listener that takes the connection and never answers (a node still
/// booting, a port that is not RabbitMQ's) is a transport error after the
/// connect timeout, naming what it waited for, not a wait of minutes.
#[tokio::test]
async fn a_listener_that_never_answers_is_an_error_after_the_connection_timeout() {
    // Bound, never accepting: the kernel completes the TCP handshake, and
    // nothing ever answers the client's AMQP header.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("amqp://{}/%2f", silent.local_addr().unwrap());
    let connect = RabbitBroker::builder()
        .connection_timeout(std::time::Duration::from_millis(300))
        .connect(&url);
    match within(10, "the connect error", connect).await {
        Err(ruststream::Error::Transport(err)) => {
            let err = err.to_string();
            assert!(err.contains(&url), "{err}");
            assert!(err.contains("no AMQP handshake within 300ms"), "{err}");
        }
        Err(other) => panic!("expected a transport error, got {other}"),
        Ok(_) => panic!("nothing answers on {url}"),
    }
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_conforms() {
    let report = conformance::run(&Rabbit).await;
    report.assert_passed();
    assert!(report.skipped.is_empty(), "skipped: {:?}", report.skipped);
}

/// Queue groups on quorum queues, where the broker counts deliveries.
struct Quorum;

impl Harness for Quorum {
    type Broker = RabbitBroker;

    fn capabilities(&self) -> Capabilities {
        Capabilities::all().counting_returns()
    }

    async fn connect(&self, _prefix: &str) -> Result<RabbitBroker> {
        Ok(builder().quorum_queues(true).connect(&url()).await.unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_conforms_on_quorum_queues() {
    let report = conformance::run(&Quorum).await;
    report.assert_passed();
    assert!(report.skipped.is_empty(), "skipped: {:?}", report.skipped);
}

/// A message whose handler takes the process down every time never gets
/// rejected by the runtime; on a quorum queue the broker counts the
/// deliveries and dead-letters it after `max_deliveries` (the subscriber's
/// `max_attempts`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_crashing_its_consumer_is_dead_lettered_by_the_broker() {
    let subject = unique("rs.crashloop.");
    let dead = format!("{subject}.dead");
    let rabbit = builder().quorum_queues(true).connect(&url()).await.unwrap();
    let mut dlq = rabbit
        .subscribe(SubscribeOptions::new(dead.as_str()))
        .await
        .unwrap();
    let options = SubscribeOptions::new(subject.as_str())
        .queue_group("w")
        .dead_letter(dead.as_str())
        .max_deliveries(3);
    rabbit.subscribe(options.clone()).await.unwrap();
    rabbit
        .publish_message(&subject, Message::new("poison"), None)
        .await
        .unwrap();
    for attempt in 1..=3 {
        // A consumer process that dies holding the message: its connection
        // goes, and the broker takes the message back.
        let consumer = builder().quorum_queues(true).connect(&url()).await.unwrap();
        let mut sub = consumer.subscribe(options.clone()).await.unwrap();
        let d = within(10, "the poison message", sub.next()).await.unwrap();
        assert_eq!(d.envelope().attempt(), attempt);
        consumer.close().await.unwrap();
        drop(d);
    }
    let d = within(10, "the broker's dead letter", dlq.next())
        .await
        .unwrap();
    assert_eq!(d.envelope().payload(), "poison".as_bytes());
    d.ack().await.unwrap();
    rabbit.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_dead_letters_with_the_reason() {
    let subject = unique("rs.dlq.");
    let dead = format!("{subject}.dead");
    let rabbit = rabbit().await;
    let mut dlq = rabbit
        .subscribe(SubscribeOptions::new(dead.as_str()))
        .await
        .unwrap();
    let mut sub = rabbit
        .subscribe(
            SubscribeOptions::new(subject.as_str())
                .queue_group("w")
                .dead_letter(dead.as_str()),
        )
        .await
        .unwrap();
    let message = Message::new("poison")
        .with_header("x-tenant", "acme")
        .with_key("k1");
    rabbit
        .publish_message(&subject, message, None)
        .await
        .unwrap();
    let d = within(10, "the message", sub.next()).await.unwrap();
    d.reject("cannot parse").await.unwrap();
    let d = within(10, "the dead letter", dlq.next()).await.unwrap();
    let env = d.envelope();
    assert_eq!(env.payload(), "poison".as_bytes());
    assert_eq!(env.key().map(|k| k.as_str()), Some("k1"));
    assert_eq!(env.headers().get("x-tenant"), Some("acme"));
    assert_eq!(env.headers().get(header::ERROR), Some("cannot parse"));
    assert_eq!(
        env.headers().get(header::ORIGINAL_SUBJECT),
        Some(subject.as_str())
    );
    d.ack().await.unwrap();
    rabbit.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_never_exceeds_what_the_job_queue_holds() {
    const M: usize = 4;
    const IN_FLIGHT: usize = 2;
    const N: u32 = 100;
    let subject = unique("rs.prefetch.");
    let rabbit = builder().prefetch(1000).connect(&url()).await.unwrap();
    let blocked = Blocked::new(
        SubscriberConfig::new(subject.as_str())
            .queue_group("prefetch")
            .receive_flow(false)
            .workers_by_key(2),
    );
    let (gate, done) = (blocked.gate.clone(), blocked.done.clone());
    let running = App::new()
        .broker(rabbit.clone())
        .job_queue(JobQueueSettings::default().max_queued_jobs(M))
        .subscriber(blocked)
        .start()
        .await
        .unwrap();
    for i in 0..N {
        let message = Message::new(i.to_string()).with_key(format!("k{}", i % 2));
        rabbit
            .publish_message(&subject, message, None)
            .await
            .unwrap();
    }
    // Deliveries stop at the prefetch, which the job queue bounds: the
    // handlers run two, the owner FIFOs hold the rest under their permits.
    let queue = format!("prefetch@{subject}");
    within(10, "deliveries stop", async {
        while queue_depth(&queue).await > N as usize - M {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let waiting = queue_depth(&queue).await;
    assert!(
        waiting >= N as usize - (M + IN_FLIGHT),
        "only {waiting} of {N} still in the queue: more than {M} queued + {IN_FLIGHT} running were delivered"
    );
    assert!(running.pressure().in_use <= M);
    gate.open();
    until(20, "every message handled", || {
        done.load(std::sync::atomic::Ordering::SeqCst) == N
    })
    .await;
    running.shutdown().await.unwrap();
}

/// Messages ready in `queue` (not delivered to any consumer).
async fn queue_depth(queue: &str) -> usize {
    let conn = lapin::Connection::connect(&url(), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let declared = channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    declared.message_count() as usize
}

/// Closes the connections named `name` (consuming) and `name-publish` from
/// the server side, as an operator (or a broker restart) would: `rabbitmqctl
/// close_connection`. Only this test's own connections: the server is
/// shared with the other tests.
async fn close_connections_named(name: &str) {
    let pids = within(30, "the connections listed by rabbitmqctl", async {
        loop {
            let out = tokio::process::Command::new("rabbitmqctl")
                .args(["list_connections", "-s", "pid", "client_properties"])
                .output()
                .await
                .expect("rabbitmqctl runs (it comes with rabbitmq-server)");
            let listing = String::from_utf8_lossy(&out.stdout).into_owned();
            let names = [format!("\"{name}\""), format!("\"{name}-publish\"")];
            let pids: Vec<String> = listing
                .lines()
                .filter(|line| names.iter().any(|n| line.contains(n.as_str())))
                .map(|line| line.split_whitespace().next().unwrap().to_owned())
                .collect();
            if pids.len() == 2 {
                break pids;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    for pid in pids {
        let status = tokio::process::Command::new("rabbitmqctl")
            .args(["close_connection", &pid, "ruststream reconnect test"])
            .status()
            .await
            .unwrap();
        assert!(
            status.success(),
            "rabbitmqctl close_connection {pid} failed"
        );
    }
}

fn body(delivery: &impl Delivery) -> String {
    String::from_utf8(delivery.envelope().payload().to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_by_the_server_is_recovered_and_loses_nothing() {
    let subject = unique("rs.reconnect.");
    let name = unique("rs-reconnect-");
    let consuming = builder()
        .connection_name(name.as_str())
        .prefetch(4)
        .ack_window(1)
        .connect(&url())
        .await
        .unwrap();
    let publisher = rabbit().await;
    let mut sub = consuming
        .subscribe(SubscribeOptions::new(subject.as_str()).queue_group("w"))
        .await
        .unwrap();
    for i in 0..10 {
        publisher
            .publish_message(&subject, Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    // A responder on the other connection; a request before the loss
    // starts the consumer of direct reply-to replies.
    let rpc = format!("{subject}.rpc");
    let mut service = publisher
        .subscribe(SubscribeOptions::new(rpc.as_str()))
        .await
        .unwrap();
    let responder = publisher.clone();
    tokio::spawn(async move {
        while let Some(d) = service.next().await {
            let env = d.envelope();
            let mut reply = Message::new(format!("re: {}", body(&d)));
            if let Some(id) = env.correlation_id() {
                reply = reply.with_correlation_id(id.clone());
            }
            let to = env.reply_to().unwrap().clone();
            responder.publish_message(&to, reply, None).await.unwrap();
            d.ack().await.unwrap();
        }
    });
    let ask = |what: &'static str| {
        let (consuming, rpc) = (consuming.clone(), rpc.clone());
        async move {
            let reply = consuming
                .request_message(&rpc, Message::new(what), std::time::Duration::from_secs(10))
                .await
                .unwrap();
            String::from_utf8(reply.payload().to_vec()).unwrap()
        }
    };
    assert_eq!(ask("before").await, "re: before");

    let mut handled = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let d = within(10, "a delivery", sub.next()).await.unwrap();
        handled.insert(body(&d));
        d.ack().await.unwrap();
    }
    let held = within(10, "a delivery to hold", sub.next()).await.unwrap();
    let held_body = body(&held);

    close_connections_named(&name).await;

    // Published while the consumer's connection is down or coming back.
    for i in 10..15 {
        publisher
            .publish_message(&subject, Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    // The consumer is re-created on the new connection: everything not
    // acked before the loss arrives, the held one again with attempt 2.
    let mut held_again = false;
    within(60, "every message after the recovery", async {
        while handled.len() < 15 {
            let d = sub.next().await.expect("the subscription survives");
            let b = body(&d);
            if b == held_body {
                assert_eq!(d.envelope().attempt(), 2, "redelivered after the loss");
                held_again = true;
            }
            // A delivery read just before the loss cannot be acked any more:
            // the broker has it again, and it comes back.
            if d.ack().await.is_ok() {
                handled.insert(b);
            }
        }
    })
    .await;
    assert!(held_again, "the delivery held across the loss came back");
    // A settlement from before the loss is refused, not applied to a new
    // delivery that happens to have the same tag.
    assert!(held.ack().await.is_err(), "a stale ack must fail");
    // Replies reach the recovered connection's reply consumer.
    assert_eq!(ask("after").await, "re: after");
    // The recovered connection publishes too.
    consuming
        .publish_message(&subject, Message::new("after"), None)
        .await
        .unwrap();
    let d = within(10, "a publish after the recovery", sub.next())
        .await
        .unwrap();
    assert_eq!(body(&d), "after");
    d.ack().await.unwrap();
    consuming.close().await.unwrap();
    publisher.close().await.unwrap();
}

/// RT-8 on RabbitMQ: the broker holds a `retry_after` (a TTL'd copy in a
/// delay queue, dead-lettered back when due), so it survives the process
/// that asked for it dying before the delay is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_retry_survives_the_consumer_process_dying() {
    const DELAY: std::time::Duration = std::time::Duration::from_millis(1500);
    let subject = unique("rs.retry.");
    let config = SubscriberConfig::new(subject.as_str())
        .queue_group("retry")
        .max_attempts(3);
    let delay_queue = format!("retry@{subject}.delay.{}", DELAY.as_millis());

    // The first process: handles the message, asks for the retry, and dies
    // (no shutdown, no flush: its socket just goes).
    let asked = {
        let (subject, config, delay_queue) = (subject.clone(), config.clone(), delay_queue.clone());
        in_a_process_that_dies(async move {
            let rabbit = builder().ack_window(1).connect(&url()).await.unwrap();
            let mut app = RetryApp::start(rabbit.clone(), config, DELAY).await;
            let asked = std::time::Instant::now();
            rabbit
                .publish_message(&subject, Message::new("job"), None)
                .await
                .unwrap();
            let env = within(10, "the first run", app.seen.recv()).await.unwrap();
            assert_eq!(env.retries(), 0);
            within(10, "the ack of the first run", app.settled.recv()).await;
            within(10, "the copy waiting in the delay queue", async {
                while queue_depth(&delay_queue).await != 1 {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
            .await;
            assert!(
                asked.elapsed() < DELAY,
                "the process dies before the delay is over"
            );
            asked
        })
    };

    // The next process gets the retry once the delay is over, counted.
    let mut app = RetryApp::start(rabbit().await, config, DELAY).await;
    let env = within(20, "the retry in the next process", app.seen.recv())
        .await
        .unwrap();
    assert!(
        asked.elapsed() >= DELAY,
        "retried after {:?}, before the {DELAY:?} delay",
        asked.elapsed()
    );
    assert_eq!(env.retries(), 1, "one retry counted");
    assert_eq!(env.total_attempt(), 2);
    assert_eq!(
        env.subject().as_str(),
        subject,
        "delivered as its own subject"
    );
    assert_eq!(env.payload(), "job".as_bytes());
    app.running.shutdown().await.unwrap();
    assert!(app.seen.try_recv().is_err(), "delivered once");
}

/// The queue's own dead-letter exchange is wired to the dead-letter subject:
/// a message the broker dead-letters itself (here: a plain AMQP client
/// rejecting it without requeue) lands there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_dead_letters_to_the_dead_letter_subject_on_its_own() {
    let subject = unique("rs.dlx.");
    let dead = format!("{subject}.dead");
    let rabbit = rabbit().await;
    let mut dlq = rabbit
        .subscribe(SubscribeOptions::new(dead.as_str()))
        .await
        .unwrap();
    let sub = rabbit
        .subscribe(
            SubscribeOptions::new(subject.as_str())
                .queue_group("w")
                .dead_letter(dead.as_str()),
        )
        .await
        .unwrap();
    rabbit
        .publish_message(&subject, Message::new("poison"), None)
        .await
        .unwrap();
    let conn = lapin::Connection::connect(&url(), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let queue = format!("w@{subject}");
    let got = within(10, "the message by basic.get", async {
        loop {
            let got = channel
                .basic_get(queue.as_str().into(), Default::default())
                .await
                .unwrap();
            if let Some(got) = got {
                break got;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    got.acker
        .reject(lapin::options::BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let d = within(10, "the broker's dead letter", dlq.next())
        .await
        .unwrap();
    assert_eq!(d.envelope().payload(), "poison".as_bytes());
    assert_eq!(d.envelope().subject().as_str(), dead);
    d.ack().await.unwrap();
    drop(sub);
    rabbit.close().await.unwrap();
}

/// Changing a durable queue's settings is refused by RabbitMQ; the error
/// says which queue and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_declared_with_other_settings_is_a_clear_config_error() {
    let subject = unique("rs.redeclare.");
    let rabbit = rabbit().await;
    let first = rabbit
        .subscribe(SubscribeOptions::new(subject.as_str()).queue_group("w"))
        .await
        .unwrap();
    let err = rabbit
        .subscribe(
            SubscribeOptions::new(subject.as_str())
                .queue_group("w")
                .dead_letter("somewhere.dead"),
        )
        .await
        .err()
        .expect("a different dead-letter target cannot be declared");
    match err {
        ruststream::Error::Config(text) => {
            assert!(text.contains(&format!("w@{subject}")), "{text}");
            assert!(text.contains("delete the queue"), "{text}");
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
    drop(first);
    rabbit.close().await.unwrap();
}

/// JQ-15 on RabbitMQ: while the receive flow is PAUSED the subscription
/// takes no delivery and holds the broker's credit (at most `prefetch` sit
/// in the client; the rest stay in the queue for other members); RUNNING
/// hands out every message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_receive_flow_takes_nothing_and_resumes_exactly_once() {
    const PREFETCH: u16 = 2;
    let subject = unique("rs.flow.");
    let rabbit = builder().prefetch(PREFETCH).connect(&url()).await.unwrap();
    let mut sub = rabbit
        .subscribe(
            SubscribeOptions::new(subject.as_str())
                .queue_group("svc")
                .receive_flow(true),
        )
        .await
        .unwrap();
    let flow = sub.receive_flow().expect("a request/reply source");
    rabbit
        .publish_message(&subject, Message::new("before"), None)
        .await
        .unwrap();
    let d = within(10, "a delivery while running", sub.next())
        .await
        .unwrap();
    assert_eq!(body(&d), "before");
    d.ack().await.unwrap();

    flow.set_paused(true);
    for i in 0..5 {
        rabbit
            .publish_message(&subject, Message::new(i.to_string()), None)
            .await
            .unwrap();
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        for _ in 0..5 {
            let d = sub.next().await.unwrap();
            tx.send(body(&d)).unwrap();
            d.ack().await.unwrap();
        }
        sub
    });
    // Nothing is taken while paused (a quiet window: nothing to wait for).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "a delivery was taken while paused");
    let queue = format!("svc@{subject}");
    assert!(
        queue_depth(&queue).await >= 5 - usize::from(PREFETCH),
        "more than the prefetch left the queue while paused"
    );
    flow.set_paused(false);
    let sub = within(10, "every message after resume", reader)
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Ok(b) = rx.try_recv() {
        got.push(b);
    }
    got.sort();
    assert_eq!(got, ["0", "1", "2", "3", "4"], "each exactly once");
    drop(sub);
    rabbit.close().await.unwrap();
}

/// Exchanges of every kind that other systems publish to can be declared
/// and bound into ruststream's exchange; their messages reach subscribers
/// by routing key. A kind clash is a clear error, and the broker keeps
/// working after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_from_bound_exchanges_of_every_kind_reach_subscribers() {
    use ruststream::rabbitmq::ExchangeKind;
    let subject = unique("rs.bound.");
    let rabbit = rabbit().await;
    let mut sub = rabbit
        .subscribe(SubscribeOptions::new(format!("{subject}.>")).queue_group("w"))
        .await
        .unwrap();
    let fanout = unique("rs-fanout-");
    let direct = unique("rs-direct-");
    let headers = unique("rs-headers-");
    rabbit
        .declare_exchange(&fanout, ExchangeKind::Fanout)
        .await
        .unwrap();
    rabbit.bind_exchange(&fanout, "", &[]).await.unwrap();
    rabbit
        .declare_exchange(&direct, ExchangeKind::Direct)
        .await
        .unwrap();
    let direct_key = format!("{subject}.direct");
    rabbit
        .bind_exchange(&direct, &direct_key, &[])
        .await
        .unwrap();
    rabbit
        .declare_exchange(&headers, ExchangeKind::Headers)
        .await
        .unwrap();
    rabbit
        .bind_exchange(&headers, "", &[("x-match", "all"), ("region", "eu")])
        .await
        .unwrap();
    let clash = rabbit
        .declare_exchange(&fanout, ExchangeKind::Topic)
        .await
        .expect_err("a fan-out exchange cannot be redeclared as topic");
    assert!(
        matches!(&clash, ruststream::Error::Config(text) if text.contains(&fanout)),
        "{clash:?}"
    );

    // Another system publishes with plain AMQP.
    let conn = lapin::Connection::connect(&url(), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    // Confirmed, so each is routed before ruststream's own publish below:
    // the queue is FIFO, and a wrongly routed one would be among the first.
    channel.confirm_select(Default::default()).await.unwrap();
    let publish =
        |exchange: String, key: String, props: lapin::BasicProperties, body: &'static str| {
            let channel = channel.clone();
            async move {
                channel
                    .basic_publish(
                        exchange.as_str().into(),
                        key.as_str().into(),
                        Default::default(),
                        body.as_bytes(),
                        props,
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
        };
    let plain = lapin::BasicProperties::default;
    publish(
        fanout.clone(),
        format!("{subject}.fanout"),
        plain(),
        "from fanout",
    )
    .await;
    publish(direct.clone(), direct_key.clone(), plain(), "from direct").await;
    publish(
        direct.clone(),
        format!("{subject}.other"),
        plain(),
        "unbound key",
    )
    .await;
    let mut eu = lapin::types::FieldTable::default();
    eu.insert(
        "region".into(),
        lapin::types::AMQPValue::LongString("eu".into()),
    );
    let mut us = lapin::types::FieldTable::default();
    us.insert(
        "region".into(),
        lapin::types::AMQPValue::LongString("us".into()),
    );
    publish(
        headers.clone(),
        format!("{subject}.headers"),
        plain().with_headers(us),
        "wrong region",
    )
    .await;
    publish(
        headers.clone(),
        format!("{subject}.headers"),
        plain().with_headers(eu),
        "from headers",
    )
    .await;
    // The broker still publishes after the refused declaration.
    rabbit
        .publish_message(&format!("{subject}.own"), Message::new("own"), None)
        .await
        .unwrap();

    let mut got = Vec::new();
    while got.len() < 4 {
        let d = within(10, "the bound exchanges' messages", sub.next())
            .await
            .unwrap();
        got.push((d.envelope().subject().to_string(), body(&d)));
        d.ack().await.unwrap();
    }
    got.sort();
    let mut want = vec![
        (format!("{subject}.direct"), "from direct".to_owned()),
        (format!("{subject}.fanout"), "from fanout".to_owned()),
        (format!("{subject}.headers"), "from headers".to_owned()),
        (format!("{subject}.own"), "own".to_owned()),
    ];
    want.sort();
    assert_eq!(
        got, want,
        "the unbound key and the wrong region are not routed"
    );
    for exchange in [&fanout, &direct, &headers] {
        channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await
            .unwrap();
    }
    rabbit.close().await.unwrap();
}

/// A graceful stop with jobs still queued or prefetched (RT-9): the next
/// app gets exactly the jobs the first one did not handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_stream_acks_everything_it_handled() {
    let subject = unique("stop.mid");
    let config = SubscriberConfig::new(subject.as_str()).queue_group("stoppers");
    let publisher = rabbit().await;
    common::faults::stopped_mid_stream(rabbit, &publisher, config, 60).await;
    publisher.close().await.unwrap();
}

/// The same on `threads(4)`: dedicated threads claim prefetched jobs in
/// place, and a graceful stop still acks everything they handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_stream_on_dedicated_threads_acks_everything_it_handled() {
    let subject = unique("stop.threads");
    let config = SubscriberConfig::new(subject.as_str())
        .queue_group("stoppers")
        .threads(4);
    let publisher = rabbit().await;
    common::faults::stopped_mid_stream(rabbit, &publisher, config, 60).await;
    publisher.close().await.unwrap();
}
