//! What the settings hold, as read: every key optional, unknown keys refused.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::ingress::{JobQueueProfile, JobQueueSettings};
use crate::subscriber::{Mode, SubscriberConfig};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Values {
    #[serde(default)]
    pub(super) brokers: BTreeMap<String, BrokerSettings>,
    #[serde(default)]
    pub(super) job_queue: JobQueueOverrides,
    #[serde(default, deserialize_with = "duration")]
    pub(super) shutdown_timeout: Option<Duration>,
    #[serde(default)]
    pub(super) subscribers: BTreeMap<String, SubscriberOverrides>,
}

/// One broker's settings (`[brokers.<name>]`): its URL, publish timeout and
/// binding-specific options for the code that connects it.
///
/// ```
/// use ruststream::settings::Settings;
/// # let dir = std::env::temp_dir().join(format!("rs-broker-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let file = dir.join("app.toml");
/// std::fs::write(&file, r#"
/// [brokers.kafka]
/// url = "127.0.0.1:9092"
/// options = { "compression.type" = "lz4", linger_ms = 5 }
/// "#).unwrap();
/// let kafka = Settings::from_sources(Some(&file), std::iter::empty::<(String, String)>())?.broker("kafka");
/// assert_eq!(kafka.url(), Some("127.0.0.1:9092"));
/// assert_eq!(kafka.option("compression.type"), Some("lz4"));
/// assert_eq!(kafka.option("linger_ms"), Some("5"));
/// # Ok::<_, ruststream::Error>(())
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerSettings {
    url: Option<String>,
    #[serde(default, deserialize_with = "duration")]
    publish_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "scalars")]
    options: BTreeMap<String, String>,
}

impl BrokerSettings {
    /// The URL, if set.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The URL, or `default` (the code's) when none is set.
    pub fn url_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.url().unwrap_or(default)
    }

    /// The publish timeout (`publish_timeout = "5s"`), if set.
    pub fn publish_timeout(&self) -> Option<Duration> {
        self.publish_timeout
    }

    /// A binding-specific option (`options = { key = value }`), as text.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.get(key).map(String::as_str)
    }

    /// Every option, e.g. to pass to Kafka's `property(key, value)`.
    pub fn options(&self) -> impl Iterator<Item = (&str, &str)> {
        self.options.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// The job queue's settings (`[job_queue]`): each one set replaces the
/// code's.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobQueueOverrides {
    profile: Option<Profile>,
    max_queued_jobs: Option<usize>,
    pause_percent: Option<u32>,
    resume_percent: Option<u32>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Profile {
    Small,
    Balanced,
    Large,
}

impl JobQueueOverrides {
    /// `code` with the settings applied.
    pub fn apply(&self, code: JobQueueSettings) -> JobQueueSettings {
        let mut out = match self.profile {
            Some(Profile::Small) => code.with_profile(JobQueueProfile::Small),
            Some(Profile::Balanced) => code.with_profile(JobQueueProfile::Balanced),
            Some(Profile::Large) => code.with_profile(JobQueueProfile::Large),
            None => code,
        };
        if let Some(max) = self.max_queued_jobs {
            out = out.max_queued_jobs(max);
        }
        let (pause, resume) = out.percents();
        out.pause_resume(
            self.pause_percent.unwrap_or(pause),
            self.resume_percent.unwrap_or(resume),
        )
    }
}

/// One subscriber's settings (`[subscribers.<handler name>]`): each one set
/// replaces what its `#[subscriber(..)]` (or `.configure(..)`) says.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriberOverrides {
    workers: Option<usize>,
    threads: Option<usize>,
    max_pending: Option<usize>,
    max_attempts: Option<u32>,
    #[serde(default, deserialize_with = "text")]
    dead_letter: Option<String>,
    #[serde(default, deserialize_with = "text")]
    queue_group: Option<String>,
    batch_max: Option<usize>,
    #[serde(default, deserialize_with = "duration")]
    batch_wait: Option<Duration>,
}

impl SubscriberOverrides {
    /// `workers = n`, if set.
    pub fn workers(&self) -> Option<usize> {
        self.workers
    }

    /// `code` with the settings applied. `workers` and `threads` keep the
    /// code's `by_key`.
    pub fn apply(&self, mut code: SubscriberConfig) -> SubscriberConfig {
        let by_key = matches!(
            code.mode(),
            Mode::Workers { by_key: true, .. } | Mode::Threads { by_key: true, .. }
        );
        if let Some(n) = self.workers {
            code.mode = Mode::Workers { n, by_key };
        }
        if let Some(n) = self.threads {
            code.mode = Mode::Threads { n, by_key };
        }
        if let Some(n) = self.max_pending {
            code = code.max_pending(n);
        }
        if let Some(n) = self.max_attempts {
            code = code.max_attempts(n);
        }
        if let Some(subject) = &self.dead_letter {
            code = code.dead_letter(subject.as_str());
        }
        if let Some(group) = &self.queue_group {
            code = code.queue_group(group.as_str());
        }
        if let Some(batch) = &mut code.batch {
            batch.max = self.batch_max.unwrap_or(batch.max);
            batch.wait = self.batch_wait.unwrap_or(batch.wait);
        }
        code
    }

    /// Settings that contradict one another, or the subscriber's code
    /// (`code`): a batch size for a handler that takes one message. The
    /// key at fault, where it is one, and what is wrong.
    pub(crate) fn conflict(
        &self,
        code: &SubscriberConfig,
    ) -> Option<(Option<&'static str>, &'static str)> {
        if self.workers.is_some() && self.threads.is_some() {
            return Some((None, "set `workers` or `threads`, not both"));
        }
        // The mode the settings leave it in (they may change it).
        let mode = self.apply(code.clone()).mode;
        if self.max_pending.is_some() && !matches!(mode, Mode::Workers { by_key: true, .. }) {
            return Some((
                Some("max_pending"),
                "bounds the owner FIFOs of `workers(n, by_key)` only: this subscriber has none",
            ));
        }
        let batch_key = match (self.batch_max, self.batch_wait) {
            (Some(_), _) => "batch_max",
            (None, Some(_)) => "batch_wait",
            (None, None) => return None,
        };
        code.batch.is_none().then_some((
            Some(batch_key),
            "applies to batch handlers (`batch(..)`) only",
        ))
    }
}

/// `"30s"`-style durations.
fn duration<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(de)?;
    super::parse_duration(&text).map(Some).ok_or_else(|| {
        serde::de::Error::invalid_value(
            serde::de::Unexpected::Str(&text),
            &"a duration such as \"500ms\", \"30s\", \"2m\" or \"1h\"",
        )
    })
}

/// A scalar as written, kept as text: an environment variable's value is
/// read as a number or a boolean when it looks like one, and a name such as
/// a queue group may well look like a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl From<Scalar> for String {
    fn from(scalar: Scalar) -> String {
        match scalar {
            Scalar::Text(s) => s,
            Scalar::Int(n) => n.to_string(),
            Scalar::Float(x) => x.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

/// A text setting, also when it was written as a number or a boolean.
fn text<'de, D: Deserializer<'de>>(de: D) -> Result<Option<String>, D::Error> {
    Ok(Some(Scalar::deserialize(de)?.into()))
}

/// A table of scalars, each kept as text.
fn scalars<'de, D: Deserializer<'de>>(de: D) -> Result<BTreeMap<String, String>, D::Error> {
    let table = BTreeMap::<String, Scalar>::deserialize(de)?;
    Ok(table.into_iter().map(|(k, v)| (k, v.into())).collect())
}
