//! Settings from a TOML file and the environment (feature `config`), layered
//! over what the code says: **code < file < environment**.
//!
//! ```toml
//! shutdown_timeout = "30s"
//!
//! [brokers.nats]
//! url = "nats://nats.internal:4222"
//! publish_timeout = "5s"
//!
//! [job_queue]
//! profile = "small"          # small | balanced | large
//! max_queued_jobs = 512
//! pause_percent = 90
//! resume_percent = 50
//!
//! [subscribers.confirm]       # the handler function's name
//! workers = 8
//! max_attempts = 5
//! dead_letter = "orders.dead"
//! ```
//!
//! Every key has an environment variable: `RUSTSTREAM__` and the key's path
//! in capitals, `__` between levels — `RUSTSTREAM__SHUTDOWN_TIMEOUT=10s`,
//! `RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKERS=16`,
//! `RUSTSTREAM__BROKERS__NATS__URL=nats://10.0.0.5:4222`. A key the
//! settings do not know, or a value of the wrong type, is an error that
//! names the key and where it came from (the file's path or the variable).
//!
//! ```
//! use ruststream::settings::Settings;
//!
//! let settings = Settings::from_sources(
//!     None,
//!     [("RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKERS", "16")],
//! )?;
//! assert_eq!(settings.subscriber("confirm").unwrap().workers(), Some(16));
//!
//! let err = Settings::from_sources(None, [("RUSTSTREAM__SHUTDOWN_TIMOUT", "5s")]).unwrap_err();
//! assert!(err.to_string().contains("RUSTSTREAM__SHUTDOWN_TIMOUT"));
//! # Ok::<_, ruststream::Error>(())
//! ```

mod env;
mod values;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml};

use self::values::Values;
pub use self::values::{BrokerSettings, JobQueueOverrides, SubscriberOverrides};
use crate::{Error, Result};

/// The prefix of every settings variable.
pub const ENV_PREFIX: &str = "RUSTSTREAM__";

/// An app's settings, loaded once at start (by the command line of a
/// `#[ruststream::app]` binary, or by [`Settings::load`]) and applied to the
/// app with [`App::settings`](crate::App::settings). Cloning is cheap.
#[derive(Clone, Debug)]
pub struct Settings(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    values: Values,
    /// Where each value came from, for error messages.
    figment: Figment,
    /// The broker sections the app asked for ([`Settings::broker`]).
    brokers_read: Mutex<BTreeSet<String>>,
}

impl Settings {
    /// The settings of `file` (TOML; it must exist) if given, then of the
    /// process's `RUSTSTREAM__…` environment variables.
    pub fn load(file: Option<&Path>) -> Result<Settings> {
        Settings::from_sources(file, std::env::vars())
    }

    /// [`load`](Self::load), with `vars` in place of the process's
    /// environment (variables without the [`ENV_PREFIX`] are ignored).
    pub fn from_sources<K, V>(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Settings>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let mut figment = Figment::new();
        if let Some(file) = file {
            if !file.is_file() {
                return Err(Error::Config(format!(
                    "settings: the file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file_exact(file));
        }
        let vars = vars.into_iter().map(|(k, v)| (k.into(), v.into()));
        figment = figment.merge(env::EnvVars::new(vars));
        let values: Values = figment.extract().map_err(|err| describe(&figment, err))?;
        Ok(Settings(Arc::new(Inner {
            values,
            figment,
            brokers_read: Mutex::default(),
        })))
    }

    /// No settings: the code's values stand.
    pub fn empty() -> Settings {
        Settings::from_sources(None, std::iter::empty::<(String, String)>())
            .expect("no settings are valid settings")
    }

    /// The settings of broker `name` (`[brokers.<name>]`; empty when there
    /// are none). A section the app never asks for is an error when the
    /// settings are applied: it is most likely a typo.
    ///
    /// ```
    /// use ruststream::settings::Settings;
    ///
    /// let settings = Settings::from_sources(None, [("RUSTSTREAM__BROKERS__NATS__URL", "nats://10.0.0.5:4222")])?;
    /// let nats = settings.broker("nats");
    /// assert_eq!(nats.url_or("nats://127.0.0.1:4222"), "nats://10.0.0.5:4222");
    /// assert_eq!(settings.broker("redis").url_or("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    /// # Ok::<_, ruststream::Error>(())
    /// ```
    pub fn broker(&self, name: &str) -> BrokerSettings {
        self.0
            .brokers_read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        self.0.values.brokers.get(name).cloned().unwrap_or_default()
    }

    /// The graceful shutdown's bound (`shutdown_timeout = "30s"`), if set.
    pub fn shutdown_timeout(&self) -> Option<Duration> {
        self.0.values.shutdown_timeout
    }

    /// The job queue's settings (`[job_queue]`).
    pub fn job_queue(&self) -> &JobQueueOverrides {
        &self.0.values.job_queue
    }

    /// The overrides of the subscriber named `name` (`[subscribers.<name>]`).
    pub fn subscriber(&self, name: &str) -> Option<&SubscriberOverrides> {
        self.0.values.subscribers.get(name)
    }

    /// Every `[subscribers.<name>]` section.
    pub(crate) fn subscribers(&self) -> impl Iterator<Item = (&str, &SubscriberOverrides)> {
        (self.0.values.subscribers.iter()).map(|(name, overrides)| (name.as_str(), overrides))
    }

    /// The broker sections no one asked for, each with where it came from.
    pub(crate) fn unread_brokers(&self) -> Vec<(String, String)> {
        let read = self
            .0
            .brokers_read
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        (self.0.values.brokers.keys())
            .filter(|name| !read.contains(*name))
            .map(|name| (name.clone(), self.source_of(&format!("brokers.{name}"))))
            .collect()
    }

    /// The broker sections the app asked for.
    pub(crate) fn brokers_read(&self) -> Vec<String> {
        let read = self
            .0
            .brokers_read
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        read.iter().cloned().collect()
    }

    /// Where the value at `key` (a dotted path) came from: `file <path>` or
    /// `environment variable <NAME>`.
    pub(crate) fn source_of(&self, key: &str) -> String {
        let path: Vec<&str> = key.split('.').collect();
        match self.0.figment.find_metadata(key) {
            Some(metadata) => source(metadata, &path),
            None => "the code".to_owned(),
        }
    }
}

/// `file <path>`, or `environment variable <NAME>` for the key at `path`.
fn source(metadata: &figment::Metadata, path: &[&str]) -> String {
    match &metadata.source {
        Some(figment::Source::File(file)) => format!("file {}", file.display()),
        _ if metadata.name == env::NAME => {
            format!("environment variable {}", env::var_name(path))
        }
        _ => metadata.name.to_string(),
    }
}

/// A figment error as a startup error that names the key and its source.
fn describe(figment: &Figment, err: figment::Error) -> Error {
    let messages: Vec<String> = err
        .into_iter()
        .map(|err| {
            let mut path: Vec<&str> = err.path.iter().map(String::as_str).collect();
            let what = match &err.kind {
                figment::error::Kind::UnknownField(field, expected) => {
                    if path.last() != Some(&field.as_str()) {
                        path.push(field);
                    }
                    format!("unknown key; expected one of: {}", expected.join(", "))
                }
                other => other.to_string(),
            };
            let key = path.join(".");
            let from = match figment.find_metadata(&key).or(err.metadata.as_ref()) {
                Some(metadata) => source(metadata, &path),
                None => "the settings".to_owned(),
            };
            format!("settings: `{key}` in {from}: {what}")
        })
        .collect();
    Error::Config(messages.join("; "))
}

/// `"500ms"`, `"30s"`, `"2m"`, `"1h"`.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let ms = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    number.checked_mul(ms).map(Duration::from_millis)
}
