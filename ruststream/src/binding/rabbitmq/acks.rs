//! Coalesced acknowledgements for one channel: delivery tags settle in any
//! order, and the contiguous settled prefix goes out as one
//! `basic.ack(multiple)` — when `window` acks wait, after a short linger, on
//! a nack, and before the channel or connection closes. Nothing is acked
//! that the handler has not settled, so at-least-once is unchanged.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lapin::options::BasicAckOptions;

use super::transport;
use crate::Result;

/// How long a settled ack may wait for company.
const LINGER: Duration = Duration::from_micros(500);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag {
    /// Handed out, not settled.
    Open,
    /// Acked, waiting to be sent.
    Acked,
    /// Settled on its own (nacked back to the queue): never in a multiple ack.
    Gone,
}

pub(crate) struct Acks {
    channel: lapin::Channel,
    window: usize,
    tags: Mutex<VecDeque<(u64, Tag)>>,
    /// A linger flush is scheduled.
    scheduled: AtomicBool,
    /// Taking a prefix and sending it happen under this lock, so acks reach
    /// the broker in tag order: a `multiple` ack for a lower tag sent after
    /// one for a higher tag would name an already-acked tag, and the broker
    /// closes the channel for that.
    sending: tokio::sync::Mutex<()>,
}

impl Acks {
    pub(crate) fn new(channel: lapin::Channel, window: usize) -> Arc<Acks> {
        Arc::new(Acks {
            channel,
            window: window.max(1),
            tags: Mutex::new(VecDeque::new()),
            scheduled: AtomicBool::new(false),
            sending: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<(u64, Tag)>> {
        self.tags.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A delivery with `tag` was handed out (tags arrive in order).
    pub(crate) fn delivered(&self, tag: u64) {
        self.lock().push_back((tag, Tag::Open));
    }

    /// Settles `tag` as acked; sends the ready prefix when the window is
    /// full, else within the linger.
    pub(crate) async fn ack(self: &Arc<Self>, tag: u64) -> Result<()> {
        let full = {
            let mut tags = self.lock();
            set(&mut tags, tag, Tag::Acked);
            tags.iter().take_while(|(_, s)| *s != Tag::Open).count() >= self.window
        };
        if full {
            self.flush().await
        } else {
            self.schedule();
            Ok(())
        }
    }

    /// `tag` was settled on its own (a requeue): it leaves the window.
    pub(crate) fn gone(&self, tag: u64) {
        set(&mut self.lock(), tag, Tag::Gone);
    }

    /// Sends every ack that is ready now, in tag order.
    pub(crate) async fn flush(&self) -> Result<()> {
        let _in_order = self.sending.lock().await;
        let ready = take_prefix(&mut self.lock());
        match ready {
            Some(upto) => self
                .channel
                .basic_ack(upto, BasicAckOptions { multiple: true })
                .await
                .map_err(transport),
            None => Ok(()),
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

/// Pops the settled prefix; the highest acked tag in it, if any, is what
/// one `basic.ack(multiple)` must name.
fn take_prefix(tags: &mut VecDeque<(u64, Tag)>) -> Option<u64> {
    let mut upto = None;
    while let Some(&(tag, state)) = tags.front() {
        match state {
            Tag::Open => break,
            Tag::Acked => upto = Some(tag),
            Tag::Gone => {}
        }
        tags.pop_front();
    }
    upto
}
