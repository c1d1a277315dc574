//! A `threads(n)` ring between the feeder and its thread.

use std::collections::VecDeque;
use std::sync::Arc;

use loom::future::block_on;
use loom::thread;

use super::check;
use crate::exec::ring::RING_SLOTS;
use crate::exec::threads::Rings;

/// The feeder (the only producer) pushes only into a ring with room and
/// never misses the wake-up that says a full ring has room again (it
/// would deadlock); the thread takes every item once, in order, and a
/// slot stays counted until its item is in hand.
#[test]
fn the_feeder_never_overfills_a_ring_and_never_misses_its_room() {
    check(|| {
        let rings = Arc::new(Rings::<usize>::new(1));
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
                let at = rings.wait_space(false, &mut cursor).await;
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
