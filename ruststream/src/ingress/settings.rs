//! Job-queue settings.

use super::permits::MAX_PERMITS;
use crate::{Error, Result};

/// Named sizes of the application job queue. Default `Balanced`.
///
/// | profile | `MaxQueuedApplicationJobs` |
/// |---|---|
/// | `Small` | 256 |
/// | `Balanced` | 1,024 |
/// | `Large` | 8,192 |
///
/// The queue counts jobs, not bytes: for large payloads lower
/// `max_queued_jobs` and bound single messages by size; the Core HWM stays the
/// last memory guard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobQueueProfile {
    /// Small hosts.
    Small,
    /// The default.
    #[default]
    Balanced,
    /// Many concurrent sources with small payloads.
    Large,
}

impl JobQueueProfile {
    /// Job permits of this profile.
    pub const fn max_queued_jobs(self) -> usize {
        match self {
            JobQueueProfile::Small => 256,
            JobQueueProfile::Balanced => 1024,
            JobQueueProfile::Large => 8192,
        }
    }
}

/// Settings of an app's job queue.
///
/// ```
/// use ruststream::ingress::{JobQueueProfile, JobQueueSettings};
///
/// let settings = JobQueueSettings::profile(JobQueueProfile::Small).pause_resume(90, 50);
/// assert_eq!(settings.effective_max(), 256);
/// assert!(settings.validate().is_ok());
/// assert!(JobQueueSettings::default().pause_resume(60, 60).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobQueueSettings {
    profile: JobQueueProfile,
    max_queued_jobs: Option<usize>,
    pause_percent: u32,
    resume_percent: u32,
}

impl Default for JobQueueSettings {
    fn default() -> Self {
        JobQueueSettings::profile(JobQueueProfile::Balanced)
    }
}

impl JobQueueSettings {
    /// Default pause percent.
    pub const DEFAULT_PAUSE_PERCENT: u32 = 80;
    /// Default resume percent.
    pub const DEFAULT_RESUME_PERCENT: u32 = 60;

    /// Settings from a profile.
    pub const fn profile(profile: JobQueueProfile) -> Self {
        JobQueueSettings {
            profile,
            max_queued_jobs: None,
            pause_percent: Self::DEFAULT_PAUSE_PERCENT,
            resume_percent: Self::DEFAULT_RESUME_PERCENT,
        }
    }

    /// The same settings on another profile, overrides kept.
    pub const fn with_profile(mut self, profile: JobQueueProfile) -> Self {
        self.profile = profile;
        self
    }

    /// Exact permit count (`MaxQueuedApplicationJobs`), overriding the
    /// profile: at least 1, at most 2³¹ − 1 on a 64-bit target (checked by
    /// [`validate`](Self::validate)).
    pub const fn max_queued_jobs(mut self, max: usize) -> Self {
        self.max_queued_jobs = Some(max);
        self
    }

    /// Pause at `pause` percent of the permits in use, resume at `resume`
    /// percent (P in 1..=100, R in 0..=99, R < P; checked by
    /// [`validate`](Self::validate)).
    pub const fn pause_resume(mut self, pause: u32, resume: u32) -> Self {
        self.pause_percent = pause;
        self.resume_percent = resume;
        self
    }

    /// The profile.
    pub const fn get_profile(&self) -> JobQueueProfile {
        self.profile
    }

    /// Permits after the override.
    pub const fn effective_max(&self) -> usize {
        match self.max_queued_jobs {
            Some(max) => max,
            None => self.profile.max_queued_jobs(),
        }
    }

    /// `(pause, resume)` percents.
    pub const fn percents(&self) -> (u32, u32) {
        (self.pause_percent, self.resume_percent)
    }

    /// A clear startup error for values outside the spec's ranges.
    pub fn validate(&self) -> Result<()> {
        let (p, r) = self.percents();
        let max = self.effective_max();
        if max == 0 {
            return Err(Error::Config("max_queued_jobs must be at least 1".into()));
        }
        if max > MAX_PERMITS {
            return Err(Error::Config(format!(
                "max_queued_jobs {max} is above the most a job queue holds ({MAX_PERMITS})"
            )));
        }
        if !(1..=100).contains(&p) {
            return Err(Error::Config(format!(
                "pause percent {p} is outside 1..=100"
            )));
        }
        if r > 99 {
            return Err(Error::Config(format!(
                "resume percent {r} is outside 0..=99"
            )));
        }
        if r >= p {
            return Err(Error::Config(format!(
                "resume percent {r} must be below pause percent {p}"
            )));
        }
        Ok(())
    }
}
