//! When a `threads(n)` feeder or dedicated thread stops giving its CPU
//! away (`sched_yield`) before it waits.

use std::time::{Duration, Instant};

/// The most waits skipped after snoozes that found nothing, one after
/// another.
const MAX_SKIPS: u32 = 64;

/// The most waits skipped after snoozes that lost a time slice, one after
/// another: contention from other processes lasts, and each such yield
/// costs as much as a thousand deliveries. The first skips [`MAX_SKIPS`]
/// (a stray slow yield costs little), each next one twice as many.
const MAX_SLOW_SKIPS: u32 = 4096;

/// A `sched_yield` that took this long gave the CPU to a thread that ran a
/// whole time slice — another process, when every CPU is busy. Measured on
/// 2 cores running `threads(4)`: a yield that hands the CPU to the feeder
/// or a sibling thread returns within 10–50 µs (about 1 in 1,000 takes a
/// millisecond), one that hands it to one of two CPU-bound processes
/// beside it takes a millisecond or more (6 in 100 of them there).
const SLOW_YIELD: Duration = Duration::from_millis(1);

/// Whether a snooze — a few `sched_yield` calls before a wait — pays.
/// After one that found nothing the next ones are skipped, twice as many
/// each time up to [`MAX_SKIPS`]; one that pays starts over. After one that
/// lost a whole time slice to another thread, at least [`MAX_SKIPS`] are,
/// up to [`MAX_SLOW_SKIPS`] while such snoozes follow one another.
///
/// A snooze pays when the thread it waits for is runnable on this very
/// CPU: the yield hands the CPU over and neither side pays a wake-up. Next
/// to slow handlers it finds nothing, and next to CPU-bound processes each
/// yield waits out their time slice while the work piles up unseen (a
/// snoozing thread is not parked, so nobody wakes it): `threads(4)` fell
/// from 1.7 M to 30 k deliveries/s on 2 cores beside two busy loops until
/// slow yields counted as not paying.
pub(crate) struct SnoozeBackoff {
    /// Waits left to skip the snooze for.
    skip: u32,
    /// How many the next snooze that does not pay makes it skip.
    next_skip: u32,
    /// How many the next snooze that loses a time slice makes it skip.
    next_slow_skip: u32,
}

impl SnoozeBackoff {
    pub(crate) fn new() -> Self {
        SnoozeBackoff {
            skip: 0,
            next_skip: 1,
            next_slow_skip: MAX_SKIPS,
        }
    }

    /// Gives the CPU away up to `times` times until `ready` finds what
    /// this thread waits for; nothing at all while the snooze is skipped.
    pub(crate) fn snooze<R>(
        &mut self,
        times: usize,
        ready: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        self.snooze_by(times, ready, std::thread::yield_now)
    }

    /// [`snooze`](Self::snooze) with `yield_cpu` for `sched_yield`.
    fn snooze_by<R>(
        &mut self,
        times: usize,
        mut ready: impl FnMut() -> Option<R>,
        mut yield_cpu: impl FnMut(),
    ) -> Option<R> {
        if !self.due() {
            return None;
        }
        for _ in 0..times {
            let yielded = Instant::now();
            yield_cpu();
            let found = ready();
            if yielded.elapsed() >= SLOW_YIELD {
                self.skip = self.next_slow_skip;
                self.next_slow_skip = (self.next_slow_skip * 2).min(MAX_SLOW_SKIPS);
                return found;
            }
            if found.is_some() {
                self.paid(true);
                return found;
            }
        }
        self.paid(false);
        None
    }

    /// Whether to snooze at this wait.
    fn due(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// A snooze paid (`true`) or not.
    fn paid(&mut self, found: bool) {
        if found {
            self.next_skip = 1;
            self.next_slow_skip = MAX_SKIPS;
        } else {
            self.skip = self.next_skip;
            self.next_skip = (self.next_skip * 2).min(MAX_SKIPS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SLOW_YIELD, SnoozeBackoff};

    /// While snoozes find no room, the waits between two of them double up
    /// to `MAX_SKIPS`; one that finds room starts over.
    #[test]
    fn a_snooze_that_does_not_pay_is_skipped_longer_each_time() {
        let mut backoff = SnoozeBackoff::new();
        let (mut gaps, mut gap) = (Vec::new(), 0);
        for _ in 0..400 {
            if backoff.due() {
                gaps.push(gap);
                gap = 0;
                backoff.paid(false);
            } else {
                gap += 1;
            }
        }
        assert_eq!(gaps[..10], [0, 1, 2, 4, 8, 16, 32, 64, 64, 64]);

        backoff.paid(true);
        while !backoff.due() {}
        backoff.paid(true);
        assert!(backoff.due(), "room found: the next wait snoozes");
        backoff.paid(false);
        assert!(!backoff.due(), "and the first that fails skips one wait");
        assert!(backoff.due());
    }

    /// How many waits in a row skip the snooze.
    fn skipped(backoff: &mut SnoozeBackoff) -> u32 {
        let mut n = 0;
        while !backoff.due() {
            n += 1;
        }
        n
    }

    /// A yield that loses a time slice to another process ends the snooze
    /// at once, and the snooze is skipped for 64, 128 .. 4096 waits while
    /// that goes on; one that pays starts over.
    #[test]
    fn a_yield_that_loses_a_time_slice_stops_snoozing_for_thousands_of_waits() {
        let mut backoff = SnoozeBackoff::new();
        // A 1 ms sleep stands for a yield that another process's slice held.
        let slow = || std::thread::sleep(SLOW_YIELD);
        let mut yields = 0;
        let found: Option<()> = backoff.snooze_by(
            8,
            || None,
            || {
                yields += 1;
                slow();
            },
        );
        assert_eq!((found, yields), (None, 1), "one slow yield and no more");
        let mut gaps = vec![skipped(&mut backoff)];
        for _ in 0..7 {
            backoff.snooze_by(8, || None::<()>, slow);
            gaps.push(skipped(&mut backoff));
        }
        assert_eq!(gaps, [64, 128, 256, 512, 1024, 2048, 4096, 4096]);

        // A quick yield that finds the work: snoozing goes on.
        assert_eq!(backoff.snooze_by(8, || Some(7), || {}), Some(7));
        assert_eq!(skipped(&mut backoff), 0);
        backoff.snooze_by(8, || None::<()>, slow);
        assert_eq!(skipped(&mut backoff), 64, "it starts over");
    }
}
