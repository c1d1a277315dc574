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

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod connection;
mod helpers;
mod metadata;
mod routing;
mod settlement;

use connection::*;
use metadata::*;
use routing::*;
use settlement::*;

use crate::Result;
use crate::binding::{Broker, Requester};

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
        check!(
            acks_of_a_consumer_that_leaves_are_kept,
            caps.redelivers_unsettled && caps.queue_groups
        );
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
