//! A `threads(n)` ring between the feeder and its thread.

use std::collections::VecDeque;
use std::sync::Arc;

use loom::future::block_on;
use loom::thread;

use super::check;
use crate::exec::ring::RING_SLOTS;
use crate::exec::rings::{Fill, Rings};
use crate::exec::shared_subscription::Shared;

/// By key: the feeder (the only producer) pushes only into a ring with room
/// and never misses the wake-up that says a full ring has room again (it
/// would deadlock); the thread takes every item once, in order, and a slot
/// stays counted until its item is in hand.
#[test]
fn the_feeder_never_overfills_a_ring_and_never_misses_its_room() {
    check(|| {
        let rings = Arc::new(Rings::<usize>::new(1, Fill::AllHaveRoom));
        let items = RING_SLOTS + 1;
        let thread = {
            let rings = Arc::clone(&rings);
            thread::spawn(move || {
                block_on(async {
                    let ring = &rings.rings[0];
                    let mut taken = VecDeque::new();
                    let mut got = Vec::new();
                    while ring.take_all(&mut taken).await {
                        while let Some(item) = taken.pop_front() {
                            ring.start(|| rings.freed());
                            got.push(item);
                        }
                    }
                    got
                })
            })
        };
        block_on(async {
            let mut cursor = 0;
            for item in 0..items {
                let at = rings.wait_space(Fill::AllHaveRoom, &mut cursor).await;
                assert!(rings.rings[at].has_space());
                if let Some(reader) = rings.rings[at].push(item) {
                    reader.wake();
                }
            }
            rings.rings[0].close();
        });
        assert_eq!(thread.join().unwrap(), (0..items).collect::<Vec<_>>());
    });
}

/// Without `by_key`: a busy thread claims from the shared source in place,
/// and turns idle only when it finds nothing; the feeder fills only an idle
/// thread's ring. Every item reaches the thread once, the two never fill
/// the ring's slots together (the debug assertions of `push_all` and
/// `claimed` would fire), and neither misses the other's wake-up (a lost
/// one deadlocks).
#[test]
fn the_feeder_fills_only_an_idle_threads_ring_and_never_misses_it() {
    check(|| {
        let rings = Arc::new(Rings::<usize>::new(1, Fill::Idle));
        let items = RING_SLOTS + 1;
        let source = Arc::new(Shared::new((0..items).collect::<VecDeque<_>>()));
        let take = |queue: &mut VecDeque<usize>, room: usize| -> Vec<usize> {
            (0..room).map_while(|_| queue.pop_front()).collect()
        };
        let thread = {
            let rings = Arc::clone(&rings);
            let source = Arc::clone(&source);
            thread::spawn(move || {
                block_on(async {
                    let ring = &rings.rings[0];
                    let mut taken = VecDeque::new();
                    let mut got = Vec::new();
                    loop {
                        if taken.is_empty() && !ring.take_all(&mut taken).await {
                            break;
                        }
                        while let Some(item) = taken.pop_front() {
                            ring.start(|| {});
                            got.push(item);
                        }
                        if ring.has_items() {
                            continue;
                        }
                        let room = ring.room();
                        let claimed = source.with(|q| take(q, room)).unwrap_or_default();
                        ring.claimed(claimed.len());
                        taken.extend(claimed);
                        if taken.is_empty() {
                            ring.set_idle();
                            rings.freed();
                        }
                    }
                    got
                })
            })
        };
        block_on(async {
            let mut cursor = 0;
            loop {
                let at = rings.wait_space(Fill::Idle, &mut cursor).await;
                let ring = &rings.rings[at];
                let batch = source.with(|q| take(q, ring.room())).unwrap();
                if batch.is_empty() {
                    break;
                }
                if let Some(reader) = ring.push_all(batch) {
                    reader.wake();
                }
            }
            rings.rings[0].close();
        });
        let mut got = thread.join().unwrap();
        got.sort_unstable();
        assert_eq!(got, (0..items).collect::<Vec<_>>());
    });
}
