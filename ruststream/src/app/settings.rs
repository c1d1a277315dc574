//! [`Settings`] applied over the app's code (feature `config`).

use super::App;
use crate::settings::Settings;
use crate::text::{last_segment, names};
use crate::{Error, Result};

impl<B> App<B> {
    /// Applies `settings` over what the code set: the job queue, the
    /// shutdown timeout and each `[subscribers.<name>]` section, where
    /// `<name>` is the handler function's name (or its full path,
    /// `"orders::confirm"`, when two share a name). Call it after the last
    /// subscriber. A section that names no subscriber, or a
    /// `[brokers.<name>]` section the code never read
    /// ([`Settings::broker`]), is a startup error naming the key and its
    /// source. A `#[ruststream::app]` binary with the `cli` feature applies
    /// its settings to the `App` its `main` returns by itself.
    ///
    /// ```
    /// use ruststream::prelude::*;
    /// use ruststream::settings::Settings;
    ///
    /// #[subscriber("orders", workers(2))]
    /// async fn confirm(_order: Bytes) {}
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let settings = Settings::from_sources(None, [("RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKERS", "8")])?;
    /// let app = App::new().broker(MemoryBroker::new()).subscriber(confirm).settings(&settings);
    /// app.check().await?;
    ///
    /// let typo = Settings::from_sources(None, [("RUSTSTREAM__SUBSCRIBERS__CONFIRMM__WORKERS", "8")])?;
    /// let app = App::new().broker(MemoryBroker::new()).subscriber(confirm).settings(&typo);
    /// let err = app.check().await.unwrap_err().to_string();
    /// assert!(err.contains("RUSTSTREAM__SUBSCRIBERS__CONFIRMM"), "{err}");
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    pub fn settings(mut self, settings: &Settings) -> Self {
        if let Err(err) = self.apply(settings) {
            self.mistakes.push(err);
        }
        self
    }

    fn apply(&mut self, settings: &Settings) -> Result<()> {
        if let Some((name, from)) = settings.unread_brokers().into_iter().next() {
            let read = settings.brokers_read();
            return Err(Error::Config(format!(
                "settings: `brokers.{name}` in {from}: the app reads no broker named `{name}` (it reads: {})",
                if read.is_empty() {
                    "none".to_owned()
                } else {
                    read.join(", ")
                }
            )));
        }
        self.jobs = settings.job_queue().apply(self.jobs);
        if let Some(timeout) = settings.shutdown_timeout() {
            self.shutdown_timeout = Some(timeout);
        }
        for (name, overrides) in settings.subscribers() {
            let key = format!("subscribers.{name}");
            let bad = |what: String| {
                Error::Config(format!(
                    "settings: `{key}` in {}: {what}",
                    settings.source_of(&key)
                ))
            };
            let handlers: Vec<&'static str> = self.units.iter().map(|u| u.requires().0).collect();
            let mut distinct: Vec<&'static str> = handlers
                .iter()
                .copied()
                .filter(|n| names(n, name))
                .collect();
            distinct.sort_unstable();
            distinct.dedup();
            match distinct.len() {
                0 => {
                    let known: Vec<&str> = handlers.iter().map(|n| last_segment(n)).collect();
                    return Err(bad(format!(
                        "no subscriber is named `{name}` (the app has: {})",
                        known.join(", ")
                    )));
                }
                1 => {}
                _ => {
                    return Err(bad(format!(
                        "`{name}` names several subscribers ({}): use the full path, e.g. `[subscribers.\"{}\"]`",
                        distinct.join(", "),
                        distinct[0]
                    )));
                }
            }
            for unit in &mut self.units {
                let unit_name = unit.requires().0;
                if names(unit_name, name) {
                    let config = unit.config_mut();
                    if let Some((field, what)) = overrides.conflict(config) {
                        let key = field.map_or(key.clone(), |field| format!("{key}.{field}"));
                        return Err(Error::Config(format!(
                            "settings: `{key}` in {}: {what}",
                            settings.source_of(&key)
                        )));
                    }
                    *config = overrides.apply(config.clone());
                }
            }
        }
        Ok(())
    }
}
