//! Pressure state with hysteresis.

use std::time::Duration;

/// Absolute receive-flow state of the app.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PressureState {
    /// Sources receive.
    #[default]
    Running,
    /// Request/reply sources are paused.
    Paused,
}

/// `pause = ceil(M*P/100)`, `resume = floor(M*R/100)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Permits in use at or above which RUNNING turns PAUSED.
    pub pause: usize,
    /// Permits in use at or below which PAUSED turns RUNNING.
    pub resume: usize,
}

impl Thresholds {
    /// Thresholds for `max` permits and the given percents.
    ///
    /// ```
    /// use ruststream::ingress::Thresholds;
    ///
    /// let t = Thresholds::new(10, 80, 60);
    /// assert_eq!((t.pause, t.resume), (8, 6));
    /// let t = Thresholds::new(7, 80, 60); // 5.6 -> 6, 4.2 -> 4
    /// assert_eq!((t.pause, t.resume), (6, 4));
    /// ```
    pub fn new(max: usize, pause_percent: u32, resume_percent: u32) -> Self {
        let scaled = |percent: u32| max as u128 * u128::from(percent);
        Thresholds {
            pause: scaled(pause_percent).div_ceil(100) as usize,
            resume: (scaled(resume_percent) / 100) as usize,
        }
    }

    /// The next state: RUNNING → PAUSED at `in_use >= pause`, PAUSED →
    /// RUNNING at `in_use <= resume`; between them the state holds.
    pub fn next(&self, current: PressureState, in_use: usize) -> PressureState {
        match current {
            PressureState::Running if in_use >= self.pause => PressureState::Paused,
            PressureState::Paused if in_use <= self.resume => PressureState::Running,
            state => state,
        }
    }
}

/// What [`RunningApp::pressure`](crate::RunningApp) reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pressure {
    /// Current state.
    pub state: PressureState,
    /// Permits in use: reserved supply plus queued jobs.
    pub in_use: usize,
    /// Effective maximum.
    pub max: usize,
    /// Receive loops waiting for a permit now: the shared-cap wait.
    pub waiters: usize,
    /// RUNNING → PAUSED transitions so far.
    pub pause_count: u64,
    /// Time spent PAUSED, including the current pause.
    pub paused_for: Duration,
}
