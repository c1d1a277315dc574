//! Coalesced acknowledgements for one channel: delivery tags settle in any
//! order, and the contiguous settled prefix goes out as one
//! `basic.ack(multiple)` — when `window` acks wait, after a short linger, on
//! a nack, and before the channel or connection closes. Nothing is acked
//! that the handler has not settled, so at-least-once is unchanged.
//!
//! A connection loss starts a new epoch: the broker requeues everything the
//! old channel held, and the recovered channel numbers its tags from 1 again
//! (that is how a new epoch is recognised), so settlements of deliveries
//! from before the loss are refused rather than mistaken for new ones.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lapin::Acker;
use lapin::options::BasicAckOptions;

use super::transport;
use crate::{Error, Result};

/// How long a settled ack may wait for company.
const LINGER: Duration = Duration::from_micros(500);

enum Tag {
    /// Handed out, not settled.
    Open,
    /// Acked, waiting to be sent with its delivery's acker (which refuses to
    /// send once its channel has broken).
    Acked(Acker),
    /// Settled on its own (nacked back to the queue): never in a multiple ack.
    Gone,
}

#[derive(Default)]
struct Window {
    /// Bumped by every connection loss.
    epoch: u64,
    /// The last tag delivered.
    last: u64,
    tags: VecDeque<(u64, Tag)>,
}

pub(crate) struct Acks {
    window: usize,
    state: Mutex<Window>,
    /// A linger flush is scheduled.
    scheduled: AtomicBool,
    /// Taking a prefix and sending it happen under this lock, so acks reach
    /// the broker in tag order: a `multiple` ack for a lower tag sent after
    /// one for a higher tag would name an already-acked tag, and the broker
    /// closes the channel for that.
    sending: tokio::sync::Mutex<()>,
}

impl Window {
    fn new_epoch(&mut self) {
        self.epoch += 1;
        self.last = 0;
        self.tags.clear();
    }
}

fn stale() -> Error {
    Error::Transport(
        "the RabbitMQ connection was lost before this settlement; the broker redelivers the message"
            .into(),
    )
}

impl Acks {
    pub(crate) fn new(window: usize) -> Arc<Acks> {
        Arc::new(Acks {
            window: window.max(1),
            state: Mutex::new(Window::default()),
            scheduled: AtomicBool::new(false),
            sending: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Window> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A delivery with `tag` was handed out (tags arrive in order); returns
    /// the epoch it belongs to.
    pub(crate) fn delivered(&self, tag: u64) -> u64 {
        let mut state = self.lock();
        if tag <= state.last {
            // Numbered from 1 again: the channel was re-created.
            state.new_epoch();
        }
        state.last = tag;
        state.tags.push_back((tag, Tag::Open));
        state.epoch
    }

    /// The channel broke: what it held goes back to the queue on the broker.
    pub(crate) fn reset(&self) {
        self.lock().new_epoch();
    }

    /// Settles `tag` as acked; sends the ready prefix when the window is
    /// full, else within the linger.
    pub(crate) async fn ack(self: &Arc<Self>, epoch: u64, tag: u64, acker: Acker) -> Result<()> {
        let full = {
            let mut state = self.lock();
            if state.epoch != epoch || !acker.usable() {
                return Err(stale());
            }
            set(&mut state.tags, tag, Tag::Acked(acker));
            state
                .tags
                .iter()
                .take_while(|(_, s)| !matches!(s, Tag::Open))
                .count()
                >= self.window
        };
        if full {
            self.flush().await
        } else {
            self.schedule();
            Ok(())
        }
    }

    /// `tag` was settled on its own (a requeue): it leaves the window.
    pub(crate) fn gone(&self, epoch: u64, tag: u64) {
        let mut state = self.lock();
        if state.epoch == epoch {
            set(&mut state.tags, tag, Tag::Gone);
        }
    }

    /// Sends every ack that is ready now, in tag order.
    pub(crate) async fn flush(&self) -> Result<()> {
        let _in_order = self.sending.lock().await;
        let ready = take_prefix(&mut self.lock().tags);
        let Some(acker) = ready else {
            return Ok(());
        };
        match acker.ack(BasicAckOptions { multiple: true }).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(stale()),
            Err(err) => Err(transport(err)),
        }
    }

    fn schedule(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let acks = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(LINGER).await;
            acks.scheduled.store(false, Ordering::Release);
            if let Err(err) = acks.flush().await {
                tracing::warn!(error = %err, "RabbitMQ coalesced ack failed; the broker redelivers");
            }
        });
    }
}

/// Marks `tag`. A channel's tags are consecutive and all pass through
/// [`Acks::delivered`] in order, so its place is its distance from the front.
fn set(tags: &mut VecDeque<(u64, Tag)>, tag: u64, state: Tag) {
    let Some(&(front, _)) = tags.front() else {
        return;
    };
    let at = tag
        .checked_sub(front)
        .and_then(|at| usize::try_from(at).ok());
    if let Some(entry) = at.and_then(|at| tags.get_mut(at))
        && entry.0 == tag
    {
        entry.1 = state;
    }
}

/// Pops the settled prefix; the acker of the highest acked tag in it, if
/// any, is what one `basic.ack(multiple)` must go through.
fn take_prefix(tags: &mut VecDeque<(u64, Tag)>) -> Option<Acker> {
    let mut upto = None;
    while let Some((_, state)) = tags.front() {
        if matches!(state, Tag::Open) {
            break;
        }
        if let Some((_, Tag::Acked(acker))) = tags.pop_front() {
            upto = Some(acker);
        }
    }
    upto
}
