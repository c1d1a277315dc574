//! The binding conformance suite (feature `conformance`): one set of
//! behaviour checks every binding must pass, parameterised by what its broker
//! can do. It runs against the memory Core and every real binding; a binding
//! of your own can run it too.
//!
//! ```
//! use ruststream::conformance::{self, Capabilities, Harness};
//! use ruststream::{MemoryBroker, Result};
//!
//! struct Memory;
//!
//! impl Harness for Memory {
//!     type Broker = MemoryBroker;
//!     fn capabilities(&self) -> Capabilities {
//!         Capabilities::all()
//!     }
//!     async fn connect(&self, _prefix: &str) -> Result<MemoryBroker> {
//!         Ok(MemoryBroker::new())
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! conformance::run(&Memory).await.assert_passed();
//! # });
//! ```

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::binding::{Broker, Delivery, Requester, RetryAfter, SubscribeOptions, Subscription};
use crate::message::header;
use crate::{Error, Message, Result};

/// What a binding's broker supports; checks that need more are skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// `nack` redelivers with attempt + 1.
    pub redelivery: bool,
    /// A delivery left unsettled by a consumer that goes away is redelivered
    /// to another member of its queue group.
    pub redelivers_unsettled: bool,
    /// Queue groups (competing consumers).
    pub queue_groups: bool,
    /// Request/reply through `Requester`.
    pub request_reply: bool,
    /// `reject` publishes to the dead-letter subject.
    pub dead_letter: bool,
    /// `*` and `>` in subscriptions.
    pub wildcards: bool,
    /// The broker counts every delivery or return as an attempt (JetStream,
    /// RabbitMQ quorum queues), including one to a consumer that is going
    /// away, so a dropped consumer's redelivery may come with more than
    /// attempt + 1.
    pub counts_returns: bool,
}

impl Capabilities {
    /// Everything.
    pub const fn all() -> Self {
        Capabilities {
            redelivery: true,
            redelivers_unsettled: true,
            queue_groups: true,
            request_reply: true,
            dead_letter: true,
            wildcards: true,
            counts_returns: false,
        }
    }

    /// With a broker that counts every return as an attempt.
    pub const fn counting_returns(mut self) -> Self {
        self.counts_returns = true;
        self
    }

    /// Without request/reply.
    pub const fn without_request_reply(mut self) -> Self {
        self.request_reply = false;
        self
    }

    /// Without redelivery of unsettled deliveries of dropped consumers.
    pub const fn without_unsettled_redelivery(mut self) -> Self {
        self.redelivers_unsettled = false;
        self
    }

    /// Without wildcards.
    pub const fn without_wildcards(mut self) -> Self {
        self.wildcards = false;
        self
    }
}

/// A binding under test.
pub trait Harness: Sync {
    /// The broker the binding provides. [`run`] needs it to be a
    /// [`Requester`] too; [`run_one_way`] does not.
    type Broker: Broker;

    /// What it supports.
    fn capabilities(&self) -> Capabilities;

    /// A fresh connection for one check. Every subject the check uses
    /// starts with `prefix` followed by `.` (a JetStream harness binds a
    /// stream to `prefix.>`).
    fn connect(&self, prefix: &str) -> impl Future<Output = Result<Self::Broker>> + Send;

    /// Runs after each check, also a failed one (delete streams, …).
    fn cleanup(&self, prefix: &str) -> impl Future<Output = ()> + Send {
        let _ = prefix;
        async {}
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Checks that passed.
    pub passed: Vec<&'static str>,
    /// Checks the capabilities ruled out.
    pub skipped: Vec<&'static str>,
    /// Checks that failed, with why.
    pub failed: Vec<(&'static str, String)>,
}

impl Report {
    /// Panics with every failure, if any.
    pub fn assert_passed(&self) {
        assert!(
            self.failed.is_empty(),
            "conformance failures:\n{}\n(passed: {:?}; skipped: {:?})",
            self.failed
                .iter()
                .map(|(name, why)| format!("  {name}: {why}"))
                .collect::<Vec<_>>()
                .join("\n"),
            self.passed,
            self.skipped,
        );
    }
}

/// How long one check may take before it fails.
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one expected delivery may take.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

type Outcome = std::result::Result<(), String>;

/// Runs every check the harness's capabilities allow, each on its own
/// connection and subjects, each bounded by a timeout.
pub async fn run<H: Harness>(harness: &H) -> Report
where
    H::Broker: Requester,
{
    let caps = harness.capabilities();
    let mut suite = Suite::new(harness);
    suite.common(caps).await;
    suite
        .check("request_reply_round_trip", caps.request_reply, |b, p| {
            Box::pin(async move { request_reply_round_trip(b, &p).await })
        })
        .await;
    suite.closing().await;
    suite.report
}

/// [`run`] for a broker without request/reply: every check but that one.
pub async fn run_one_way<H: Harness>(harness: &H) -> Report {
    let caps = harness.capabilities();
    let mut suite = Suite::new(harness);
    suite.common(caps).await;
    suite.report.skipped.push("request_reply_round_trip");
    suite.closing().await;
    suite.report
}

type CheckFuture<'a> = std::pin::Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

struct Suite<'h, H> {
    harness: &'h H,
    run: String,
    report: Report,
}

impl<'h, H: Harness> Suite<'h, H> {
    fn new(harness: &'h H) -> Self {
        static RUN: AtomicU64 = AtomicU64::new(0);
        Suite {
            harness,
            run: format!(
                "rsconf{}x{}",
                std::process::id(),
                RUN.fetch_add(1, Ordering::Relaxed)
            ),
            report: Report::default(),
        }
    }

    async fn check(
        &mut self,
        name: &'static str,
        needed: bool,
        check: impl for<'a> FnOnce(&'a H::Broker, String) -> CheckFuture<'a>,
    ) {
        if !needed {
            self.report.skipped.push(name);
            return;
        }
        let prefix = format!("{}.{name}", self.run);
        let outcome = match self.harness.connect(&prefix).await {
            Ok(broker) => {
                match tokio::time::timeout(CHECK_TIMEOUT, check(&broker, prefix.clone())).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(format!("did not finish within {CHECK_TIMEOUT:?}")),
                }
            }
            Err(err) => Err(format!("connect failed: {err}")),
        };
        self.harness.cleanup(&prefix).await;
        match outcome {
            Ok(()) => self.report.passed.push(name),
            Err(why) => self.report.failed.push((name, why)),
        }
    }

    async fn common(&mut self, caps: Capabilities) {
        macro_rules! check {
            ($name:ident, $needs:expr) => {
                self.check(stringify!($name), $needs, |b, p| {
                    Box::pin(async move { $name(b, &p).await })
                })
                .await
            };
        }
        check!(publish_order_per_subject, true);
        check!(fan_out_and_queue_groups, caps.queue_groups);
        check!(ack_never_redelivers, true);
        check!(nack_redelivers_with_attempt_plus_one, caps.redelivery);
        check!(retry_after_is_held_no_sooner_or_handed_back, true);
        check!(a_held_retry_after_a_redelivery_counts_both, caps.redelivery);
        self.check(
            "unsettled_delivery_of_a_dropped_consumer_is_redelivered",
            caps.redelivers_unsettled && caps.queue_groups,
            |b, p| {
                Box::pin(async move {
                    unsettled_delivery_of_a_dropped_consumer_is_redelivered(b, &p, caps).await
                })
            },
        )
        .await;
        check!(headers_key_and_correlation_id_round_trip, true);
        check!(reject_dead_letters_with_the_reason, caps.dead_letter);
        check!(wildcards_match_one_and_many_tokens, caps.wildcards);
    }

    async fn closing(&mut self) {
        self.check("close_then_publish_is_a_clear_error", true, |b, p| {
            Box::pin(async move { close_then_publish_is_a_clear_error(b, &p).await })
        })
        .await;
        self.check("double_close_is_fine", true, |b, p| {
            Box::pin(async move { double_close_is_fine(b, &p).await })
        })
        .await;
    }
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Outcome {
    if cond { Ok(()) } else { Err(what()) }
}

fn failed(what: &str) -> impl FnOnce(Error) -> String + '_ {
    move |err| format!("{what}: {err}")
}

async fn next<S: Subscription>(
    sub: &mut S,
    what: &str,
) -> std::result::Result<S::Delivery, String> {
    match tokio::time::timeout(RECEIVE_TIMEOUT, sub.next()).await {
        Ok(Some(delivery)) => Ok(delivery),
        Ok(None) => Err(format!("{what}: the subscription ended")),
        Err(_) => Err(format!("{what}: nothing within {RECEIVE_TIMEOUT:?}")),
    }
}

fn text(delivery: &impl Delivery) -> String {
    String::from_utf8_lossy(delivery.envelope().payload()).into_owned()
}

async fn publish<B: Broker>(broker: &B, subject: &str, payload: &str) -> Outcome {
    broker
        .publish_message(subject, Message::new(payload.to_owned()), None)
        .await
        .map_err(failed("publish"))
}

async fn subscribe<B: Broker>(
    broker: &B,
    options: SubscribeOptions,
) -> std::result::Result<B::Subscription, String> {
    broker.subscribe(options).await.map_err(failed("subscribe"))
}

/// A queue-group member of `subject`, and the delivery of one `payload`
/// published to it.
async fn one_to_a_worker<B: Broker>(
    broker: &B,
    subject: &str,
    payload: &str,
    what: &str,
) -> std::result::Result<(B::Subscription, <B::Subscription as Subscription>::Delivery), String> {
    let mut sub = subscribe(broker, SubscribeOptions::new(subject).queue_group("w")).await?;
    publish(broker, subject, payload).await?;
    let delivery = next(&mut sub, what).await?;
    Ok((sub, delivery))
}

async fn publish_order_per_subject<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.orders");
    let mut sub = subscribe(broker, SubscribeOptions::new(subject.as_str())).await?;
    for i in 0..50 {
        publish(broker, &subject, &i.to_string()).await?;
    }
    for i in 0..50 {
        let d = next(&mut sub, "an ordered message").await?;
        let got = text(&d);
        d.ack().await.map_err(failed("ack"))?;
        ensure(got == i.to_string(), || format!("expected {i}, got {got}"))?;
    }
    Ok(())
}

async fn fan_out_and_queue_groups<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.fan");
    let mut fan = Vec::new();
    for _ in 0..2 {
        fan.push(subscribe(broker, SubscribeOptions::new(subject.as_str())).await?);
    }
    let mut g1 = subscribe(
        broker,
        SubscribeOptions::new(subject.as_str()).queue_group("g"),
    )
    .await?;
    let mut g2 = subscribe(
        broker,
        SubscribeOptions::new(subject.as_str()).queue_group("g"),
    )
    .await?;
    for i in 0..20 {
        publish(broker, &subject, &i.to_string()).await?;
    }
    for sub in &mut fan {
        for i in 0..20 {
            let d = next(sub, "a fan-out copy").await?;
            let got = text(&d);
            d.ack().await.map_err(failed("ack"))?;
            ensure(got == i.to_string(), || {
                format!("fan-out subscription: expected {i}, got {got}")
            })?;
        }
    }
    let mut seen = BTreeSet::new();
    let mut count = 0;
    while count < 20 {
        let d = tokio::time::timeout(RECEIVE_TIMEOUT, async {
            tokio::select! {
                d = g1.next() => d,
                d = g2.next() => d,
            }
        })
        .await
        .map_err(|_| format!("queue group got {count} of 20 messages"))?
        .ok_or("a queue-group subscription ended")?;
        seen.insert(text(&d));
        count += 1;
        d.ack().await.map_err(failed("ack"))?;
    }
    ensure(seen.len() == 20, || {
        format!(
            "queue group: {count} deliveries but {} distinct messages",
            seen.len()
        )
    })
}

async fn ack_never_redelivers<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.ack");
    let (mut sub, d) = one_to_a_worker(broker, &subject, "once", "the message").await?;
    d.ack().await.map_err(failed("ack"))?;
    publish(broker, &subject, "marker").await?;
    let d = next(&mut sub, "the marker").await?;
    let got = text(&d);
    d.ack().await.map_err(failed("ack"))?;
    ensure(got == "marker", || {
        format!("an acked message came back: {got}")
    })
}

async fn nack_redelivers_with_attempt_plus_one<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.nack");
    let (mut sub, first) = one_to_a_worker(broker, &subject, "again", "the first delivery").await?;
    let attempt = first.envelope().attempt();
    ensure(attempt == 1, || {
        format!("first delivery has attempt {attempt}")
    })?;
    first.nack().await.map_err(failed("nack"))?;
    let second = next(&mut sub, "the redelivery").await?;
    let (got, attempt) = (text(&second), second.envelope().attempt());
    second.ack().await.map_err(failed("ack"))?;
    ensure(got == "again" && attempt == 2, || {
        format!("redelivery: payload {got:?}, attempt {attempt} (expected \"again\", 2)")
    })
}

/// `Delivery::retry_after`: a broker that holds the delay redelivers the
/// same message, as its own subject, no sooner than the delay and with one
/// more attempt counted; one that cannot hands the delivery back unsettled.
async fn retry_after_is_held_no_sooner_or_handed_back<B: Broker>(broker: &B, p: &str) -> Outcome {
    const DELAY: Duration = Duration::from_millis(500);
    let subject = format!("{p}.retry");
    let (mut sub, first) = one_to_a_worker(broker, &subject, "later", "the first delivery").await?;
    let asked = tokio::time::Instant::now();
    match first.retry_after(DELAY).await {
        RetryAfter::NotHeld(first) => {
            let got = text(&first);
            first
                .ack()
                .await
                .map_err(failed("ack of the handed-back delivery"))?;
            ensure(got == "later", || format!("handed back {got:?}"))
        }
        RetryAfter::Held(Err(err)) => Err(format!("retry_after: {err}")),
        RetryAfter::Held(Ok(())) => {
            let again = next(&mut sub, "the held retry").await?;
            let waited = asked.elapsed();
            let env = again.envelope();
            let (got, attempt) = (text(&again), env.total_attempt());
            let same_subject = env.subject().as_str() == subject;
            again.ack().await.map_err(failed("ack"))?;
            ensure(waited >= DELAY, || {
                format!("redelivered after {waited:?}, before the {DELAY:?} delay")
            })?;
            ensure(got == "later" && attempt == 2 && same_subject, || {
                format!(
                    "retry: payload {got:?}, total attempt {attempt}, own subject {same_subject} \
                     (expected \"later\", 2, true)"
                )
            })
        }
    }
}

/// Attempts never go down: a retry the broker holds after a `nack` comes
/// back as the third attempt.
async fn a_held_retry_after_a_redelivery_counts_both<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.retry2");
    let (mut sub, first) = one_to_a_worker(broker, &subject, "again", "the first delivery").await?;
    first.nack().await.map_err(failed("nack"))?;
    let second = next(&mut sub, "the redelivery").await?;
    match second.retry_after(Duration::from_millis(10)).await {
        RetryAfter::NotHeld(second) => second.ack().await.map_err(failed("ack")),
        RetryAfter::Held(Err(err)) => Err(format!("retry_after: {err}")),
        RetryAfter::Held(Ok(())) => {
            let third = next(&mut sub, "the held retry").await?;
            let attempt = third.envelope().total_attempt();
            third.ack().await.map_err(failed("ack"))?;
            ensure(attempt == 3, || {
                format!("the retry after a redelivery has total attempt {attempt} (expected 3)")
            })
        }
    }
}

async fn unsettled_delivery_of_a_dropped_consumer_is_redelivered<B: Broker>(
    broker: &B,
    p: &str,
    caps: Capabilities,
) -> Outcome {
    let subject = format!("{p}.drop");
    let options = || SubscribeOptions::new(subject.as_str()).queue_group("w");
    let mut a = subscribe(broker, options()).await?;
    let mut b = subscribe(broker, options()).await?;
    publish(broker, &subject, "orphan").await?;
    // Whichever member takes it drops it unsettled, and itself.
    let a_took = tokio::time::timeout(RECEIVE_TIMEOUT, async {
        tokio::select! {
            d = a.next() => d.map(|d| (true, d)),
            d = b.next() => d.map(|d| (false, d)),
        }
    })
    .await
    .map_err(|_| "nobody received the message".to_owned())?
    .ok_or("a subscription ended")?;
    let (took_a, delivery) = a_took;
    drop(delivery);
    let mut other = if took_a {
        drop(a);
        b
    } else {
        drop(b);
        a
    };
    let d = next(&mut other, "the redelivery to the other member").await?;
    let (got, attempt) = (text(&d), d.envelope().attempt());
    d.ack().await.map_err(failed("ack"))?;
    // A broker that counts returns may also count one from the dropped
    // consumer's channel, which can take the message back once more while
    // it closes.
    let expected = if caps.counts_returns {
        attempt >= 2
    } else {
        attempt == 2
    };
    ensure(got == "orphan" && expected, || {
        format!("redelivery: payload {got:?}, attempt {attempt} (expected \"orphan\", 2)")
    })
}

async fn headers_key_and_correlation_id_round_trip<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.meta");
    let mut sub = subscribe(broker, SubscribeOptions::new(subject.as_str())).await?;
    let message = Message::new("body")
        .with_header("x-tenant", "acme")
        .with_header("x-trace", "t-1")
        .with_key("k-7")
        .with_correlation_id("c-9");
    broker
        .publish_message(&subject, message, None)
        .await
        .map_err(failed("publish"))?;
    let d = next(&mut sub, "the message").await?;
    let env = d.envelope();
    let got = (
        env.headers().get("x-tenant").map(str::to_owned),
        env.headers().get("x-trace").map(str::to_owned),
        env.key().map(|k| k.as_str().to_owned()),
        env.correlation_id().map(|c| c.as_str().to_owned()),
        text(&d),
    );
    d.ack().await.map_err(failed("ack"))?;
    let want = (
        Some("acme".to_owned()),
        Some("t-1".to_owned()),
        Some("k-7".to_owned()),
        Some("c-9".to_owned()),
        "body".to_owned(),
    );
    ensure(got == want, || format!("got {got:?}, expected {want:?}"))
}

async fn reject_dead_letters_with_the_reason<B: Broker>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.work");
    let dlq = format!("{p}.dlq");
    let mut dead = subscribe(broker, SubscribeOptions::new(dlq.as_str())).await?;
    let mut sub = subscribe(
        broker,
        SubscribeOptions::new(subject.as_str())
            .queue_group("w")
            .dead_letter(dlq.as_str()),
    )
    .await?;
    publish(broker, &subject, "poison").await?;
    let d = next(&mut sub, "the message").await?;
    d.reject("bad input").await.map_err(failed("reject"))?;
    let d = next(&mut dead, "the dead letter").await?;
    let env = d.envelope();
    let got = (
        text(&d),
        env.headers().get(header::ERROR).map(str::to_owned),
        env.headers()
            .get(header::ORIGINAL_SUBJECT)
            .map(str::to_owned),
    );
    d.ack().await.map_err(failed("ack"))?;
    let want = (
        "poison".to_owned(),
        Some("bad input".to_owned()),
        Some(subject),
    );
    ensure(got == want, || format!("got {got:?}, expected {want:?}"))
}

async fn wildcards_match_one_and_many_tokens<B: Broker>(broker: &B, p: &str) -> Outcome {
    let mut one = subscribe(broker, SubscribeOptions::new(format!("{p}.w.*"))).await?;
    let mut many = subscribe(broker, SubscribeOptions::new(format!("{p}.w.>"))).await?;
    publish(broker, &format!("{p}.w.a"), "1").await?;
    publish(broker, &format!("{p}.w.a.b"), "2").await?;
    publish(broker, &format!("{p}.w.c"), "3").await?;
    let mut got_one = Vec::new();
    for _ in 0..2 {
        let d = next(&mut one, "a `*` match").await?;
        got_one.push(text(&d));
        d.ack().await.map_err(failed("ack"))?;
    }
    let mut got_many = Vec::new();
    for _ in 0..3 {
        let d = next(&mut many, "a `>` match").await?;
        got_many.push(text(&d));
        d.ack().await.map_err(failed("ack"))?;
    }
    ensure(got_one == ["1", "3"] && got_many == ["1", "2", "3"], || {
        format!("`*` got {got_one:?} (expected [1, 3]); `>` got {got_many:?} (expected [1, 2, 3])")
    })
}

async fn request_reply_round_trip<B: Requester>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.rpc");
    let mut service = subscribe(broker, SubscribeOptions::new(subject.as_str())).await?;
    let responder = async {
        let d = next(&mut service, "the request").await?;
        let reply_to = d
            .envelope()
            .reply_to()
            .ok_or("the request has no reply address")?
            .clone();
        let answer = format!("re: {}", text(&d));
        // A responder echoes the correlation id, as every RPC responder does
        // (and as ruststream's own replies do): some brokers route replies
        // by it.
        let mut reply = Message::new(answer);
        if let Some(id) = d.envelope().correlation_id() {
            reply = reply.with_correlation_id(id.clone());
        }
        broker
            .publish_message(&reply_to, reply, None)
            .await
            .map_err(failed("reply"))?;
        d.ack().await.map_err(failed("ack"))
    };
    let request = broker.request_message(&subject, Message::new("ping"), RECEIVE_TIMEOUT);
    let (served, reply) = tokio::join!(responder, request);
    served?;
    let reply = reply.map_err(failed("request"))?;
    let got = String::from_utf8_lossy(reply.payload()).into_owned();
    ensure(got == "re: ping", || format!("reply {got:?}"))?;
    let nobody = broker
        .request_message(
            &format!("{p}.nobody"),
            Message::new("?"),
            Duration::from_secs(2),
        )
        .await;
    ensure(
        matches!(nobody, Err(Error::NoResponders(_) | Error::Timeout(_))),
        || format!("a request nobody serves gave {nobody:?}"),
    )
}

async fn close_then_publish_is_a_clear_error<B: Broker>(broker: &B, p: &str) -> Outcome {
    broker.close().await.map_err(failed("close"))?;
    let after = broker
        .publish_message(&format!("{p}.late"), Message::new("x"), None)
        .await;
    ensure(matches!(after, Err(Error::Closed(_))), || {
        format!("publish after close gave {after:?}")
    })
}

async fn double_close_is_fine<B: Broker>(broker: &B, _p: &str) -> Outcome {
    broker.close().await.map_err(failed("first close"))?;
    broker.close().await.map_err(failed("second close"))
}
