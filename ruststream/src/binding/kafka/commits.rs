//! What a group member's commits say about the records it handed out, so
//! that attempts survive a crash.
//!
//! Every commit of a partition carries, in its metadata, a *hand-out
//! bound*: no record at or past it was handed out to a handler. A member
//! hands a record out only below a bound some confirmed commit recorded,
//! and moves the bound [`LEASE`] records past the record at hand with a
//! commit of its own (started early, a quarter into the lease, so a
//! steady stream rarely waits for it).
//!
//! After a crash, the records between the committed offset and the bound
//! may have been in handlers when the member died: the next owner hands
//! them out *one at a time*, each counted in a confirmed commit (offset =
//! the record, metadata = its attempt) before it goes to a handler. A
//! record that crashes its consumer each time is then the committed one
//! at every restart, and its count grows by one per crash until the
//! runtime dead-letters it as exhausted (past `max_attempts`). The other
//! records of that stretch come back as their attempt + 1 (they may have
//! been handed out before).
//!
//! A commit the group refuses (a rebalance in progress) leaves the record
//! unhanded: the partition is rewound to it and read again, or, when the
//! rebalance takes the partition away, its next owner reads it from the
//! committed offset.

use std::sync::Arc;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;

use super::group;
use super::offsets::{Commit, PartitionAcks};
use super::subscription::Shared;

/// How far past the record at hand a commit moves the hand-out bound: at
/// most this many records are handed out one at a time after a crash.
pub(crate) const LEASE: i64 = 512;

/// Records handed out under a bound after which the commit moving it on
/// starts, so it is answered before the bound is reached.
const EARLY: i64 = LEASE / 4;

const PREFIX: &str = "ruststream:";

/// A commit's metadata: the hand-out bound, and how often the record at
/// the committed offset was handed out (0: not counted one at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    pub upto: i64,
    pub attempts: u32,
}

impl Default for Mark {
    fn default() -> Self {
        Mark {
            upto: -1,
            attempts: 0,
        }
    }
}

impl Mark {
    pub(crate) fn encode(self) -> String {
        format!("{PREFIX}upto={};attempts={}", self.upto, self.attempts)
    }

    /// The mark a commit's metadata records (nothing: no bound, no count).
    pub(crate) fn decode(metadata: &str) -> Mark {
        let mut mark = Mark::default();
        let Some(fields) = metadata.strip_prefix(PREFIX) else {
            return mark;
        };
        for field in fields.split(';') {
            match field.split_once('=') {
                Some(("upto", n)) => mark.upto = n.parse().unwrap_or(-1),
                Some(("attempts", n)) => mark.attempts = n.parse().unwrap_or(0),
                _ => {}
            }
        }
        mark
    }
}

/// Whether a record may go to a handler now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Yes, as this attempt.
    Open(u32),
    /// Not yet: a commit must be confirmed, or (one at a time) the record
    /// before it settled. The subscription is woken when either happens.
    Wait,
    /// A commit was refused: read the partition again from this offset
    /// (the record at hand is dropped, unhanded).
    Rewind(i64),
    /// The partition was revoked: drop the record.
    Sealed,
}

/// The hand-out side of one partition's window.
#[derive(Debug)]
pub(crate) struct HandOut {
    /// Records below it may be handed out: a confirmed commit says so.
    confirmed: i64,
    /// The largest bound any commit carried (confirmed or not): every
    /// commit carries it, so none lowers the bound another recorded.
    pub(crate) asked: i64,
    /// Records below it belonged to a member that died holding them: one
    /// at a time, each counted.
    suspect: i64,
    /// The assignment's start and how often its record was counted.
    start: Option<(i64, u32)>,
    /// A commit of this window started and not yet answered.
    in_flight: bool,
    /// The subscription waits on the commit in flight.
    blocking: bool,
    /// A commit counting a record before it goes out (offset, attempt);
    /// `confirmed` once the group took it.
    counting: Option<(i64, u32, bool)>,
    /// The record the partition was rewound to after a refusal.
    rewound: Option<i64>,
    /// A commit the subscription waited on was refused.
    refused: bool,
    /// Coalesced commits taken and not yet passed to librdkafka: a commit
    /// made now could be overtaken by one of them, older.
    pub(crate) enqueuing: usize,
    /// The subscription waits for a settlement or an enqueued commit.
    pub(crate) waiting: bool,
}

impl HandOut {
    /// The hand-out side of an assignment starting at `start` whose
    /// commit recorded `mark`.
    pub(crate) fn new(start: Option<i64>, mark: Mark) -> Self {
        let at = start.unwrap_or(-1);
        let bound = at.max(mark.upto);
        HandOut {
            confirmed: bound,
            asked: bound,
            suspect: if start.is_some() { mark.upto } else { -1 },
            start: start.map(|s| (s, mark.attempts)),
            in_flight: false,
            blocking: false,
            counting: None,
            rewound: None,
            refused: false,
            enqueuing: 0,
            waiting: false,
        }
    }

    /// Whether the record at `offset` may go out, and the commit to send
    /// first (or meanwhile). `next` is the window's settled prefix,
    /// `quiet` that nothing handed out is unsettled, `attempts_at_next`
    /// what a commit of `next` records now.
    pub(crate) fn gate(
        &mut self,
        offset: i64,
        attempt: u32,
        next: i64,
        quiet: bool,
        attempts_at_next: u32,
    ) -> (Gate, Option<Commit>) {
        self.waiting = false;
        if let Some(at) = self.stale(offset) {
            return (Gate::Rewind(at), None);
        }
        if offset < self.suspect {
            return self.one_at_a_time(offset, attempt, quiet);
        }
        if offset < self.confirmed {
            let early =
                !self.in_flight && self.enqueuing == 0 && offset + LEASE - EARLY >= self.confirmed;
            let commit = early.then(|| self.extend(offset, next, attempts_at_next, false));
            return (Gate::Open(attempt), commit);
        }
        if self.in_flight || self.enqueuing > 0 {
            self.waiting = true;
            return (Gate::Wait, None);
        }
        if std::mem::take(&mut self.refused) {
            return self.rewind(offset);
        }
        let commit = self.extend(offset, next, attempts_at_next, true);
        self.waiting = true;
        (Gate::Wait, Some(commit))
    }

    /// After a rewind to `at`, a record other than the one at `at` was
    /// read before the rewind took: `Some(at)`, rewind again. Checked
    /// before anything else, so a stale record never looks like a gap.
    pub(crate) fn stale(&mut self, offset: i64) -> Option<i64> {
        let at = self.rewound?;
        if offset != at {
            return Some(at);
        }
        self.rewound = None;
        None
    }

    /// A record of a dead member's stretch: out once the one before it
    /// settled and a confirmed commit counted it.
    fn one_at_a_time(&mut self, offset: i64, attempt: u32, quiet: bool) -> (Gate, Option<Commit>) {
        if !quiet || self.in_flight || self.enqueuing > 0 {
            self.waiting = true;
            return (Gate::Wait, None);
        }
        match self.counting {
            Some((at, counted, true)) if at == offset => {
                self.counting = None;
                return (Gate::Open(counted), None);
            }
            _ => {}
        }
        if std::mem::take(&mut self.refused) {
            return self.rewind(offset);
        }
        let before = match self.start {
            Some((start, attempts)) if start == offset => attempts,
            _ => 0,
        };
        // Handed out before (it is below the bound), maybe more often
        // than the commit counted.
        let counted = attempt.max(before).saturating_add(1);
        self.counting = Some((offset, counted, false));
        self.in_flight = true;
        self.blocking = true;
        self.waiting = true;
        let commit = Commit {
            offset,
            metadata: self.mark(counted).encode(),
        };
        (Gate::Wait, Some(commit))
    }

    fn rewind(&mut self, offset: i64) -> (Gate, Option<Commit>) {
        self.rewound = Some(offset);
        self.counting = None;
        (Gate::Rewind(offset), None)
    }

    /// A commit of the settled prefix moving the bound past `offset`.
    fn extend(&mut self, offset: i64, next: i64, attempts_at_next: u32, blocking: bool) -> Commit {
        self.asked = self.asked.max(offset + LEASE);
        self.in_flight = true;
        self.blocking = blocking;
        Commit {
            offset: next.max(0),
            metadata: self.mark(attempts_at_next).encode(),
        }
    }

    /// The metadata of a commit now.
    pub(crate) fn mark(&self, attempts: u32) -> Mark {
        Mark {
            upto: self.asked,
            attempts,
        }
    }

    /// How often the record at `offset` was counted, if it is the one
    /// being counted now.
    pub(crate) fn counted(&self, offset: i64) -> Option<u32> {
        match self.counting {
            Some((at, counted, _)) if at == offset => Some(counted),
            _ => None,
        }
    }

    /// The answer to a commit this side started.
    pub(crate) fn answered(&mut self, commit: &Commit, ok: bool) {
        self.in_flight = false;
        if ok {
            self.confirmed = self.confirmed.max(Mark::decode(&commit.metadata).upto);
            if let Some((at, counted, false)) = self.counting
                && at == commit.offset
            {
                self.counting = Some((at, counted, true));
            }
        } else {
            self.counting = None;
            if std::mem::take(&mut self.blocking) {
                self.refused = true;
            }
        }
    }
}

/// Sends a commit a window asked for, waiting for the group's answer off
/// the async threads; the window learns it and the subscription is woken.
/// The task holds the consumer only weakly (it never keeps a consumer
/// open past its subscription), and the broker's close waits for it.
pub(crate) fn send(
    shared: &Arc<Shared>,
    topic: Arc<str>,
    partition: i32,
    window: Arc<PartitionAcks>,
    commit: Commit,
) {
    let consumer = Arc::downgrade(&shared.consumer);
    let wake = Arc::clone(&shared.handout);
    shared.broker.handouts().spawn(async move {
        let mut tpl = TopicPartitionList::new();
        group::add_commit(&mut tpl, &topic, partition, &commit);
        let result = super::blocking(move || match consumer.upgrade() {
            Some(consumer) => consumer.commit(&tpl, CommitMode::Sync),
            None => Err(KafkaError::Canceled),
        })
        .await;
        if let Err(err) = &result {
            tracing::debug!(topic = %topic, partition, error = %err, "Kafka: a hand-out commit was refused");
            crate::metrics::connection_event("kafka", "commit_failed");
        }
        window.answered(&commit, result.is_ok());
        wake.notify_one();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_back_what_they_wrote() {
        let mark = Mark {
            upto: 812,
            attempts: 3,
        };
        assert_eq!(Mark::decode(&mark.encode()), mark);
        assert_eq!(
            Mark::decode(""),
            Mark {
                upto: -1,
                attempts: 0
            }
        );
        assert_eq!(
            Mark::decode("someone else's"),
            Mark {
                upto: -1,
                attempts: 0
            }
        );
    }

    #[test]
    fn nothing_goes_out_before_a_commit_records_the_bound() {
        let mut hand = HandOut::new(Some(0), Mark::decode(""));
        let (gate, commit) = hand.gate(0, 1, 0, true, 0);
        assert_eq!(gate, Gate::Wait);
        let commit = commit.expect("a commit moving the bound");
        assert_eq!(commit.offset, 0);
        assert_eq!(Mark::decode(&commit.metadata).upto, LEASE);
        assert_eq!(hand.gate(0, 1, 0, true, 0), (Gate::Wait, None), "in flight");
        hand.answered(&commit, true);
        assert_eq!(hand.gate(0, 1, 0, true, 0), (Gate::Open(1), None));
        // A quarter of the lease on, the bound moves ahead without waiting.
        assert_eq!(hand.gate(EARLY - 1, 1, 10, false, 0), (Gate::Open(1), None));
        let (gate, early) = hand.gate(EARLY, 1, 10, false, 0);
        assert_eq!(gate, Gate::Open(1));
        let early = early.expect("an early commit");
        assert_eq!(early.offset, 10);
        assert_eq!(Mark::decode(&early.metadata).upto, EARLY + LEASE);
    }

    #[test]
    fn a_dead_members_stretch_goes_out_one_at_a_time_each_counted() {
        // Committed 5, bound 8, the record at 5 counted twice.
        let mut hand = HandOut::new(
            Some(5),
            Mark {
                upto: 8,
                attempts: 2,
            },
        );
        let (gate, commit) = hand.gate(5, 1, 5, true, 0);
        assert_eq!(gate, Gate::Wait);
        let commit = commit.unwrap();
        assert_eq!(
            (commit.offset, Mark::decode(&commit.metadata)),
            (
                5,
                Mark {
                    upto: 8,
                    attempts: 3
                }
            )
        );
        hand.answered(&commit, true);
        assert_eq!(hand.gate(5, 1, 5, true, 0), (Gate::Open(3), None));
        // 6 waits for 5 to settle.
        assert_eq!(hand.gate(6, 1, 5, false, 3), (Gate::Wait, None));
        let (_, commit) = hand.gate(6, 1, 6, true, 0);
        let commit = commit.unwrap();
        assert_eq!(
            Mark::decode(&commit.metadata).attempts,
            2,
            "read ahead: attempt + 1"
        );
        // Refused: the partition is read again from 6.
        hand.answered(&commit, false);
        assert_eq!(hand.gate(6, 1, 6, true, 0), (Gate::Rewind(6), None));
        assert_eq!(
            hand.gate(7, 1, 6, true, 0),
            (Gate::Rewind(6), None),
            "stale read-ahead"
        );
        let (gate, again) = hand.gate(6, 1, 6, true, 0);
        assert_eq!(gate, Gate::Wait);
        hand.answered(&again.unwrap(), true);
        assert_eq!(hand.gate(6, 1, 6, true, 0), (Gate::Open(2), None));
        // Past the bound: the ordinary way again.
        assert_eq!(hand.gate(8, 1, 7, false, 0).0, Gate::Wait);
    }
}
