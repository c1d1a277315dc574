//! When a `threads(n)` feeder stops giving its CPU away before it waits
//! for room in its rings.

/// The most full-ring waits a feeder skips its snooze for in a row.
const MAX_SKIPS: u32 = 64;

/// Whether a `threads(n)` feeder's snooze (`Rings::snooze_for_space`)
/// pays. After one that found no room, the next ones are skipped, twice as
/// many each time up to [`MAX_SKIPS`]; one that finds room starts over. A feeder of slow handlers (rings full for long)
/// thus almost never gives its runtime thread away — a `sched_yield` next
/// to a CPU-bound thread can hold it for a scheduler tick, and the app's
/// other tasks with it — while a feeder of quick handlers keeps snoozing.
pub(crate) struct SnoozeBackoff {
    /// Waits left to skip the snooze for.
    skip: u32,
    /// How many the next snooze that finds no room makes it skip.
    next_skip: u32,
}

impl SnoozeBackoff {
    pub(crate) fn new() -> Self {
        SnoozeBackoff {
            skip: 0,
            next_skip: 1,
        }
    }

    /// Whether to snooze at this wait.
    pub(crate) fn due(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// A snooze found room (`true`) or not.
    pub(crate) fn paid(&mut self, found: bool) {
        if found {
            self.next_skip = 1;
        } else {
            self.skip = self.next_skip;
            self.next_skip = (self.next_skip * 2).min(MAX_SKIPS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SnoozeBackoff;

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
}
