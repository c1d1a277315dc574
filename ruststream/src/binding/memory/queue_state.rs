//! The state of one receive queue under its lock: the lanes (one per
//! publishing peer), where the current fair round stands, and the readers
//! waiting for a frame.

use tokio::time::Instant;

use super::lanes::{Lane, Popped, ROUND_RECORDS, ReceiveRound, Round};
use crate::waiters::Waiters;
use crate::{Envelope, Text};

pub(super) struct State {
    /// Never empty: the last lane stays (with its buffer) when it drains.
    pub(super) lanes: Vec<Lane>,
    /// The lane the current round reads.
    pub(super) cursor: usize,
    pub(super) round: Round,
    pub(super) closed: bool,
    /// Members whose receive flow is paused.
    pub(super) paused_members: usize,
    /// Consumers waiting for a frame: one is woken per admitted frame.
    pub(super) readers: Waiters,
}

impl State {
    /// The lane of `peer`, made if needed.
    #[inline]
    pub(super) fn lane(&mut self, peer: u64) -> &mut Lane {
        if let [only] = &mut self.lanes[..]
            && (only.peer == peer || only.items.is_empty())
        {
            // The common case: one peer (or an empty queue) — no search.
            only.peer = peer;
            return &mut self.lanes[0];
        }
        self.other_lane(peer)
    }

    #[cold]
    fn other_lane(&mut self, peer: u64) -> &mut Lane {
        let at = match self.lanes.iter().position(|l| l.peer == peer) {
            Some(at) => at,
            None if self.lanes.len() == 1 && self.lanes[0].items.is_empty() => {
                self.lanes[0].peer = peer;
                0
            }
            None => {
                self.lanes.push(Lane::new(peer));
                self.lanes.len() - 1
            }
        };
        &mut self.lanes[at]
    }

    /// Removes the single-lane replies at the head of every lane (they never
    /// become deliveries), with the bytes they were charged.
    #[cold]
    pub(super) fn take_head_replies(&mut self, prefix: &Text) -> (Vec<Envelope>, usize) {
        let mut replies = Vec::new();
        let mut bytes = 0;
        for lane in &mut self.lanes {
            while lane
                .items
                .front()
                .is_some_and(|env| env.subject().starts_with(prefix.as_str()))
            {
                if let Some(reply) = lane.pop() {
                    bytes += reply.len;
                    replies.push(reply.env);
                }
            }
        }
        if self.lanes.len() > 1 {
            let cursor_lane = self.lanes[self.cursor].peer;
            self.lanes.retain(|lane| !lane.items.is_empty());
            if self.lanes.is_empty() {
                self.lanes.push(Lane::new(0));
            }
            self.cursor = self
                .lanes
                .iter()
                .position(|lane| lane.peer == cursor_lane)
                .unwrap_or(0);
        }
        (replies, bytes)
    }

    /// Takes the next frame in fair order.
    #[inline]
    pub(super) fn pop(&mut self, budget: &ReceiveRound) -> Option<Popped> {
        if let [only] = &mut self.lanes[..] {
            // One peer: rounds change nothing, so they cost nothing.
            return only.pop();
        }
        self.pop_fair(budget)
    }

    // Out of line: the one-peer path stays small.
    #[inline(never)]
    fn pop_fair(&mut self, budget: &ReceiveRound) -> Option<Popped> {
        let n = self.lanes.len();
        let at = (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&at| !self.lanes[at].items.is_empty())?;
        // An empty lane passes the round on to the next one.
        self.cursor = at;
        let popped = self.lanes[at].pop()?;
        let len = popped.len;
        let now = Instant::now();
        let round = &mut self.round;
        round.records += 1;
        round.bytes += len;
        let started = *round.started.get_or_insert(now);
        if round.records >= ROUND_RECORDS
            || round.bytes >= budget.bytes
            || now.duration_since(started) >= budget.time
        {
            // The next round starts after the lane where this one stopped.
            self.round = Round::default();
            self.cursor = at + 1;
        }
        if self.lanes[at].items.is_empty() {
            self.lanes.remove(at);
            if self.cursor > at {
                self.cursor -= 1;
            }
            if self.lanes.len() == 1 {
                // Back to one peer: the next multi-peer round starts fresh.
                self.round = Round::default();
            }
        }
        if self.cursor >= self.lanes.len() {
            self.cursor = 0;
        }
        Some(popped)
    }
}
