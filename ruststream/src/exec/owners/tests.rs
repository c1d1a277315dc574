//! Unit tests of the owner FIFOs.
use std::time::Duration;

use super::*;

/// What the tests look at, and a turn taken outside a worker.
impl<T, P> OwnerSet<T, P> {
    /// One turn, through a fresh [`waiter`](OwnerSet::waiter).
    pub(super) async fn next_turn(&self) -> Option<Turn<T, P>> {
        let mut wait = self.waiter();
        poll_fn(|cx| wait.poll(cx)).await
    }

    /// `(count, bytes, next_seq)` of one owner.
    pub(super) fn owner_stats(&self, owner: u64) -> Option<(usize, usize, u64)> {
        let state = self.lock();
        let o = &state.slots[*state.index.get(&owner)?];
        Some((o.count, o.bytes, o.next_seq))
    }

    /// The key of the owner in `slot`.
    pub(super) fn key(&self, slot: Slot) -> u64 {
        self.lock().slots[slot].key
    }

    /// Items held by all owners.
    pub(super) fn total(&self) -> usize {
        self.lock().total
    }
}

/// Items are numbers; a permit is a marker whose return the tests see.
type Set = OwnerSet<u32, ()>;

fn set(max_count: usize, max_bytes: usize, max_total: usize) -> Set {
    OwnerSet::new(OwnerLimits {
        max_count,
        max_bytes,
        max_total,
    })
}

/// a refused admission changes no counter, no
/// sequence and no queue, and says which structural limit refused it.
#[test]
fn refused_admission_leaves_owner_unchanged() {
    let owners = set(2, 100, 10);
    assert_eq!(owners.try_admit(7, 1, (), 40).unwrap(), (0, true));
    assert_eq!(owners.try_admit(7, 2, (), 40).unwrap(), (1, true));
    let before = owners.owner_stats(7).unwrap();
    assert_eq!(before, (2, 80, 2));

    let (why, back, ()) = owners.try_admit(7, 3, (), 10).unwrap_err();
    assert_eq!((why, back), (Refusal::OwnerCount, 3));
    let err = crate::Error::from(why);
    assert!(
        matches!(err, crate::Error::StructuralLimit(_)) && !err.is_deadline(),
        "a structural limit, distinct from a deadline: {err:?}"
    );
    assert_eq!(owners.owner_stats(7).unwrap(), before);
    assert_eq!(owners.total(), 2);

    let bytes = set(10, 100, 10);
    bytes.try_admit(1, 1, (), 90).unwrap();
    let before = bytes.owner_stats(1).unwrap();
    let (why, ..) = bytes.try_admit(1, 2, (), 20).unwrap_err();
    assert_eq!(why, Refusal::OwnerBytes);
    assert_eq!(bytes.owner_stats(1).unwrap(), before);

    let total = set(10, 100, 1);
    total.try_admit(1, 1, (), 1).unwrap();
    let (why, ..) = total.try_admit(2, 2, (), 1).unwrap_err();
    assert_eq!(why, Refusal::Total);
    assert!(
        total.owner_stats(2).is_none(),
        "no owner created by a refusal"
    );
}

/// an owner is ready once, runs one item at a time, and comes back
/// while it has work.
#[tokio::test(start_paused = true)]
async fn one_turn_per_owner_in_order() {
    let owners = set(10, 1000, 10);
    for i in 0..3 {
        owners.try_admit(1, i, (), 1).unwrap();
    }
    owners.try_admit(2, 100, (), 1).unwrap();
    let a = owners.next_turn().await.unwrap();
    let b = owners.next_turn().await.unwrap();
    assert_eq!((owners.key(a.owner), a.item), (1, 0));
    assert_eq!((owners.key(b.owner), b.item), (2, 100));
    // Owner 1 is running: nothing else is ready until it finishes (the
    // paused clock makes this wait instant and deterministic).
    let blocked = tokio::time::timeout(Duration::from_secs(1), owners.next_turn()).await;
    assert!(blocked.is_err(), "owner 1 must not run twice at once");
    owners.finish(a.owner, a.bytes);
    let c = owners.next_turn().await.unwrap();
    assert_eq!((owners.key(c.owner), c.item), (1, 1));
    owners.finish(b.owner, b.bytes);
    assert_eq!(
        owners.owner_stats(2),
        Some((0, 0, 1)),
        "an idle owner is kept for its key's next delivery"
    );
}

/// An admission says whether the total has room left, so the receive loop
/// looks again only when it has none; a finished turn makes room.
#[tokio::test]
async fn an_admission_says_whether_room_is_left() {
    let owners = set(10, 1000, 2);
    assert!(matches!(
        owners.admit(1, 1, (), 1),
        Ok((Admitted::Queued, true))
    ));
    assert_eq!(owners.try_admit(2, 2, (), 1).unwrap(), (0, false));
    assert_eq!(owners.capacity_now(), None, "full: the loop waits");
    let turn = owners.next_turn().await.unwrap();
    owners.finish(turn.owner, turn.bytes);
    assert_eq!(owners.capacity_now(), Some(true));
}

/// Idle owners are kept only while they do not outnumber what the set may
/// hold (`max_total`): then they all go, so keys that come and go never
/// pile up.
#[tokio::test]
async fn idle_owners_go_once_they_outnumber_the_limit() {
    let owners = set(10, 1000, 3);
    for key in 1..=3 {
        owners.try_admit(key, 0, (), 1).unwrap();
        let turn = owners.next_turn().await.unwrap();
        owners.finish(turn.owner, turn.bytes);
    }
    assert!((1..=3).all(|key| owners.owner_stats(key).is_some()));
    // Key 1 again: its idle owner is reused and busy, then idle again.
    owners.try_admit(1, 0, (), 1).unwrap();
    assert_eq!(owners.owner_stats(1), Some((1, 1, 2)));
    let turn = owners.next_turn().await.unwrap();
    owners.finish(turn.owner, turn.bytes);
    // A fourth idle owner is one too many: every idle one goes.
    owners.try_admit(4, 0, (), 1).unwrap();
    let turn = owners.next_turn().await.unwrap();
    owners.finish(turn.owner, turn.bytes);
    assert!((1..=4).all(|key| owners.owner_stats(key).is_none()));
    assert_eq!(owners.total(), 0);
}

/// A one-way record for a full key is held (its permit comes back), a
/// request for that key is refused, other keys still go in; the held
/// record moves in, in order, once its key has room and a new permit
/// is given for it.
#[tokio::test(start_paused = true)]
async fn a_full_key_holds_its_records_and_blocks_no_other_key() {
    let owners: OwnerSet<u32, &str> = OwnerSet::new(OwnerLimits {
        max_count: 1,
        max_bytes: usize::MAX,
        max_total: 10,
    });
    assert!(matches!(
        owners.admit(1, 10, "a", 1),
        Ok((Admitted::Queued, true))
    ));
    assert!(matches!(
        owners.admit(1, 11, "b", 1),
        Ok((Admitted::Held("b"), true))
    ));
    assert!(matches!(
        owners.admit(1, 12, "c", 1),
        Ok((Admitted::Held("c"), true))
    ));
    let (why, ..) = owners.try_admit(1, 13, "r", 1).unwrap_err();
    assert_eq!(why, Refusal::OwnerCount, "a request for a full key");
    assert!(matches!(
        owners.admit(2, 20, "d", 1),
        Ok((Admitted::Queued, true))
    ));
    assert_eq!(owners.total(), 4, "held records count in the total");
    assert!(!owners.has_promotable());

    let first = owners.next_turn().await.unwrap();
    assert_eq!((first.item, first.permit), (10, Some("a")));
    let other = owners.next_turn().await.unwrap();
    assert_eq!((other.item, other.permit), (20, Some("d")));
    owners.finish(first.owner, first.bytes);
    assert!(owners.has_promotable(), "key 1 has room for a held record");
    // Nothing of key 1 runs until the loop gives the held record a permit.
    let idle = tokio::time::timeout(Duration::from_secs(1), owners.next_turn()).await;
    assert!(idle.is_err(), "a held record waits for its new permit");
    owners.promote("e").unwrap();
    assert!(!owners.has_promotable(), "the key is full again");
    let second = owners.next_turn().await.unwrap();
    assert_eq!((second.item, second.permit), (11, Some("e")));
    assert_eq!(owners.promote("x"), Err("x"), "nothing to promote");

    // Closing moves what is still held into the FIFOs, without permits.
    owners.close();
    owners.finish(second.owner, second.bytes);
    let third = owners.next_turn().await.unwrap();
    assert_eq!((third.item, third.permit), (12, None));
    owners.finish(third.owner, third.bytes);
    owners.finish(other.owner, other.bytes);
    assert!(owners.next_turn().await.is_none(), "drained and closed");
}

/// No lost wake-up: many waiting workers, admissions from another thread;
/// every item is taken exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_wakeup_under_stress() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    const ITEMS: u32 = 20_000;
    let owners = Arc::new(set(64, usize::MAX, 64));
    let taken = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let owners = Arc::clone(&owners);
            let taken = Arc::clone(&taken);
            tokio::spawn(async move {
                let mut next = owners.next_turn().await;
                while let Some(turn) = next {
                    taken.fetch_add(u64::from(turn.item), Ordering::Relaxed);
                    next = match owners.finish_and_next(turn.owner, turn.bytes) {
                        Some(turn) => Some(turn),
                        None => owners.next_turn().await,
                    };
                }
            })
        })
        .collect();
    for i in 0..ITEMS {
        assert!(owners.wait_capacity().await);
        assert!(matches!(
            owners.admit(u64::from(i % 97), i, (), 1),
            Ok((Admitted::Queued, _))
        ));
    }
    owners.close();
    for w in workers {
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("workers drain and stop: no lost wake-up")
            .unwrap();
    }
    let expected: u64 = (0..u64::from(ITEMS)).sum();
    assert_eq!(taken.load(Ordering::Relaxed), expected);
    assert_eq!(owners.total(), 0);
}
