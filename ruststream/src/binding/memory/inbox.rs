//! The memory Core's waiting requests: one reusable slot per request
//! in flight, so a round trip allocates no waiter of its own (no channel, no
//! map entry). A request's id names its slot and the slot's generation, so a
//! late or duplicate reply never completes a later request that reuses the
//! slot: first terminal wins.

use std::task::{Context, Poll, Waker};

use parking_lot::{Mutex, MutexGuard};

use crate::text::{Part, TextArena};
use crate::{Envelope, Message, Text};

/// How id `id` reads in a reply subject: `{slot}-{generation}`, two short
/// hexadecimal numbers (the id itself, generation << 32 | slot, would run to
/// 13 decimal digits and more once a slot is reused).
fn id_parts(id: u64) -> [Part<'static>; 3] {
    [
        Part::Hex(id & u64::from(u32::MAX)),
        Part::Str("-"),
        Part::Hex(id >> 32),
    ]
}

/// The id [`id_parts`] wrote. By hand, in one pass: it runs for every
/// reply.
pub(crate) fn parse_id(text: &str) -> Option<u64> {
    // (value, digits) of the slot, then of the generation after the dash.
    let mut parts = [(0u64, 0u32); 2];
    let mut at = 0;
    for &byte in text.as_bytes() {
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            b'-' if at == 0 => {
                at = 1;
                continue;
            }
            _ => return None,
        };
        let (value, digits) = &mut parts[at];
        *value = *value << 4 | u64::from(digit);
        *digits += 1;
        if *digits > 8 {
            return None;
        }
    }
    let [(slot, slot_digits), (generation, generation_digits)] = parts;
    (at == 1 && slot_digits > 0 && generation_digits > 0).then_some(generation << 32 | slot)
}

pub(crate) struct Inbox {
    /// `_INBOX.{broker}.`: every reply subject starts with it.
    prefix: Text,
    state: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    /// Slots no request uses now.
    free: Vec<u32>,
    /// Where reply subjects are cut from: they live as long as their
    /// request, so a request needs no allocation of its own for one.
    subjects: TextArena,
}

#[derive(Default)]
struct Slot {
    /// Bumped whenever the slot is released, so old ids stop matching.
    generation: u32,
    open: bool,
    /// The request's reply subject, once someone made it: a reply carries
    /// it back.
    subject: Option<Text>,
    reply: Option<Message>,
    waker: Option<Waker>,
}

impl Inbox {
    pub(crate) fn new(prefix: Text) -> Self {
        Inbox {
            prefix,
            state: Mutex::default(),
        }
    }

    /// What every reply subject of this inbox starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.state.lock()
    }

    /// Opens a slot for a new request: its id. Its reply subject is made
    /// only if asked for ([`Inbox::subject`]).
    pub(crate) fn open(&self) -> u64 {
        let mut state = self.lock();
        let index = match state.free.pop() {
            Some(index) => index,
            None => {
                state.slots.push(Slot::default());
                (state.slots.len() - 1) as u32
            }
        };
        let slot = &mut state.slots[index as usize];
        slot.open = true;
        u64::from(slot.generation) << 32 | u64::from(index)
    }

    /// The reply subject of request `id`: `{prefix}{id}`, or
    /// `{prefix}L{queue}.{id}` when its reply comes back through the
    /// single-lane queue `lane`. Made once per request (kept by its slot)
    /// and cut from the inbox's subject arena.
    pub(crate) fn subject(&self, id: u64, lane: Option<u64>) -> Text {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(slot) = Self::slot(&mut state.slots, id) else {
            // The request ended: a reply to this subject is late.
            return subject(&mut state.subjects, &self.prefix, lane, id);
        };
        slot.subject
            .get_or_insert_with(|| subject(&mut state.subjects, &self.prefix, lane, id))
            .clone()
    }

    /// Hands `message` to the request `id` if it still waits and has no
    /// reply yet; `false` for a late, duplicate or unknown reply.
    pub(crate) fn complete(&self, id: u64, message: Message) -> bool {
        let mut state = self.lock();
        let Some(slot) = Self::slot(&mut state.slots, id) else {
            return false;
        };
        if slot.reply.is_some() {
            return false;
        }
        slot.reply = Some(message);
        let waker = slot.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// The reply of request `id`, once it arrived.
    pub(crate) fn poll_reply(&self, id: u64, cx: &mut Context<'_>) -> Poll<Envelope> {
        let mut state = self.lock();
        let Some(slot) = Self::slot(&mut state.slots, id) else {
            unreachable!("a request's slot stays open until the request ends")
        };
        if let Some(reply) = slot.reply.take() {
            // It arrived by the request's subject if one was made; straight
            // from a handler otherwise, and then it names the inbox.
            let subject = slot.subject.clone().unwrap_or_else(|| self.prefix.clone());
            return Poll::Ready(Envelope::new(subject, reply));
        }
        match &mut slot.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Releases the slot of request `id`, however the request ended.
    pub(crate) fn close(&self, id: u64) {
        let mut state = self.lock();
        let Some(slot) = Self::slot(&mut state.slots, id) else {
            return;
        };
        // Usually empty by now (the reply taken, no waker left, no subject
        // made): only what is there is moved out.
        let released = (slot.reply.is_some() || slot.waker.is_some() || slot.subject.is_some())
            .then(|| (slot.reply.take(), slot.waker.take(), slot.subject.take()));
        slot.open = false;
        slot.generation = slot.generation.wrapping_add(1);
        state.free.push(id as u32);
        drop(state);
        // Dropped outside the lock (a waker's drop may run any code).
        drop(released);
    }

    fn slot(slots: &mut [Slot], id: u64) -> Option<&mut Slot> {
        let slot = slots.get_mut(id as u32 as usize)?;
        (slot.open && u64::from(slot.generation) == id >> 32).then_some(slot)
    }
}

/// `{prefix}{id}`, or `{prefix}L{queue}.{id}` for a single-lane reply.
fn subject(arena: &mut TextArena, prefix: &str, lane: Option<u64>, id: u64) -> Text {
    let [slot, dash, generation] = id_parts(id);
    match lane {
        None => arena.concat(&[Part::Str(prefix), slot, dash, generation]),
        Some(queue) => arena.concat(&[
            Part::Str(prefix),
            Part::Str("L"),
            Part::Decimal(queue),
            Part::Str("."),
            slot,
            dash,
            generation,
        ]),
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use super::{Inbox, parse_id};
    use crate::{Message, Text};

    fn inbox() -> Inbox {
        Inbox::new(Text::from_static("_INBOX.1."))
    }

    #[test]
    fn a_reply_for_a_released_slot_never_completes_the_request_that_reuses_it() {
        let inbox = inbox();
        let old = inbox.open();
        inbox.close(old);
        let new = inbox.open();
        let reply_to = inbox.subject(new, None);
        assert_eq!(new as u32, old as u32, "the slot is reused");
        assert!(
            !inbox.complete(old, Message::new("stale")),
            "old generation"
        );
        assert!(inbox.complete(new, Message::new("fresh")));
        assert!(!inbox.complete(new, Message::new("again")), "first wins");
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(reply) = inbox.poll_reply(new, &mut cx) else {
            panic!("the reply arrived");
        };
        assert_eq!(reply.payload(), "fresh".as_bytes());
        assert_eq!(reply.subject(), &reply_to);
        inbox.close(new);
        assert!(!inbox.complete(new, Message::new("late")));
    }

    #[test]
    fn a_request_keeps_one_reply_subject_and_a_reply_without_one_names_the_inbox() {
        let inbox = inbox();
        let id = inbox.open();
        let subject = inbox.subject(id, None);
        assert!(subject.starts_with("_INBOX.1."), "{subject}");
        assert_eq!(parse_id(&subject["_INBOX.1.".len()..]), Some(id));
        assert_eq!(inbox.subject(id, None), subject, "made once per request");
        let unnamed = inbox.open();
        assert!(inbox.complete(unnamed, Message::new("direct")));
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(reply) = inbox.poll_reply(unnamed, &mut cx) else {
            panic!("the reply arrived");
        };
        assert_eq!(reply.subject().as_str(), "_INBOX.1.");
    }

    #[test]
    fn ids_read_back_from_their_subject_text() {
        for id in [0, 7, 1 << 32, (41 << 32) | 12, u64::MAX] {
            let text = crate::text::TextArena::default().concat(&super::id_parts(id));
            assert_eq!(parse_id(&text), Some(id), "{text}");
        }
        assert_eq!(parse_id("12"), None);
        assert_eq!(parse_id("x-1"), None);
    }
}
