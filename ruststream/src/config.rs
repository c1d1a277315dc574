//! Core settings: the byte high-water mark of a binding's receive
//! queues. These belong to the Core alone; the application job queue has its
//! own settings and never derives one from the other.

/// Named sizes for a Core's byte high-water marks. Default `Balanced`.
///
/// | profile | budget per receive queue | memory limit per broker |
/// |---|---|---|
/// | `Small` | 1 MiB | 32 MiB |
/// | `Balanced` | 8 MiB | 256 MiB |
/// | `Large` | 64 MiB | 2 GiB |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CoreHwmProfile {
    /// For small hosts or many subscriptions.
    Small,
    /// The default.
    #[default]
    Balanced,
    /// For large payloads or bursty producers on a big host.
    Large,
}

impl CoreHwmProfile {
    const fn budget_bytes(self) -> usize {
        match self {
            CoreHwmProfile::Small => 1 << 20,
            CoreHwmProfile::Balanced => 8 << 20,
            CoreHwmProfile::Large => 64 << 20,
        }
    }

    const fn memory_limit_bytes(self) -> usize {
        match self {
            CoreHwmProfile::Small => 32 << 20,
            CoreHwmProfile::Balanced => 256 << 20,
            CoreHwmProfile::Large => 2 << 30,
        }
    }
}

/// Core HWM settings: `CoreHwmProfile`, `CoreHwmBudgetBytes` (bytes one
/// receive queue may own from one publishing connection: each has its own
/// lane) and `CoreHwmMemoryLimitBytes` (bytes all receive
/// queues of one broker may own together). Overrides win over the profile.
///
/// ```
/// use ruststream::binding::memory::{CoreHwm, CoreHwmProfile};
///
/// let hwm = CoreHwm::profile(CoreHwmProfile::Small).budget_bytes(64 * 1024);
/// assert_eq!(hwm.effective_budget_bytes(), 64 * 1024);
/// assert_eq!(hwm.effective_memory_limit_bytes(), 32 << 20);
/// assert_eq!(CoreHwm::default().effective_budget_bytes(), 8 << 20);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreHwm {
    profile: CoreHwmProfile,
    budget_bytes: Option<usize>,
    memory_limit_bytes: Option<usize>,
}

impl CoreHwm {
    /// Settings from a profile, without overrides.
    pub const fn profile(profile: CoreHwmProfile) -> Self {
        CoreHwm {
            profile,
            budget_bytes: None,
            memory_limit_bytes: None,
        }
    }

    /// Overrides the bytes one receive queue may own from one publishing
    /// connection (`CoreHwmBudgetBytes`).
    pub const fn budget_bytes(mut self, bytes: usize) -> Self {
        self.budget_bytes = Some(bytes);
        self
    }

    /// Overrides the bytes all receive queues may own (`CoreHwmMemoryLimitBytes`).
    pub const fn memory_limit_bytes(mut self, bytes: usize) -> Self {
        self.memory_limit_bytes = Some(bytes);
        self
    }

    /// The profile in use.
    pub const fn get_profile(&self) -> CoreHwmProfile {
        self.profile
    }

    /// Per-queue byte budget after overrides.
    pub const fn effective_budget_bytes(&self) -> usize {
        match self.budget_bytes {
            Some(b) => b,
            None => self.profile.budget_bytes(),
        }
    }

    /// Broker-wide byte limit after overrides.
    pub const fn effective_memory_limit_bytes(&self) -> usize {
        match self.memory_limit_bytes {
            Some(b) => b,
            None => self.profile.memory_limit_bytes(),
        }
    }
}
