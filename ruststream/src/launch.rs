//! What a `#[ruststream::app]` binary does with the `App` its `main`
//! returns: applies the settings, then runs it, checks it or writes its
//! AsyncAPI document, as the command line asked.

use std::process::ExitCode;

use crate::{App, Broker};

/// Runtime settings from `#[ruststream::app(...)]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct RuntimeConfig {
    /// `flavor = "current_thread"`.
    pub current_thread: bool,
    /// `worker_threads = n` (multi-thread only).
    pub worker_threads: Option<usize>,
    /// `shutdown_timeout = "30s"`: the default of every `App` the binary
    /// builds (its code, a settings file or the environment may set another).
    pub shutdown_timeout: Option<std::time::Duration>,
    /// The binary's name (`CARGO_BIN_NAME`), for its AsyncAPI document.
    pub binary: Option<&'static str>,
    /// Its package's version (`CARGO_PKG_VERSION`).
    pub version: Option<&'static str>,
}

/// What the command line asked for (feature `cli`).
pub(crate) struct CommandLine {
    pub(crate) task: Task,
    pub(crate) config: Option<std::path::PathBuf>,
}

/// What the app is asked to do.
#[derive(Clone, Debug, Default)]
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) enum Task {
    /// Run until a signal.
    #[default]
    Run,
    /// Validate, reach the brokers, exit.
    Check,
    /// Write the AsyncAPI document.
    #[cfg(feature = "asyncapi")]
    AsyncApi {
        yaml: bool,
        output: Option<std::path::PathBuf>,
    },
}

/// How a `#[ruststream::app]` binary was started: the macro's settings,
/// the command line's task and the loaded settings.
#[doc(hidden)]
pub struct Launch {
    pub(crate) runtime: RuntimeConfig,
    pub(crate) task: Task,
    #[cfg(feature = "config")]
    pub(crate) settings: Option<crate::settings::Settings>,
}

impl Launch {
    /// A plain run.
    pub(crate) fn run(runtime: RuntimeConfig) -> Self {
        Launch {
            runtime,
            task: Task::Run,
            #[cfg(feature = "config")]
            settings: None,
        }
    }
}

/// The launch a command line asks for, with the settings loaded (feature
/// `config`) when `main` takes them or returns the app. A settings
/// mistake is reported here: the exit code to end with.
pub(crate) fn prepare(
    runtime: RuntimeConfig,
    command_line: Option<CommandLine>,
    takes_settings: bool,
) -> Result<Launch, ExitCode> {
    if let Some(timeout) = runtime.shutdown_timeout {
        let _ = DEFAULT_SHUTDOWN_TIMEOUT.set(timeout);
    }
    #[allow(unused_mut)]
    let mut launch = Launch::run(runtime);
    let returns_app = command_line.is_some();
    let file = command_line.and_then(|line| {
        launch.task = line.task;
        line.config
    });
    #[cfg(feature = "config")]
    if takes_settings || returns_app {
        match crate::settings::Settings::load(file.as_deref()) {
            Ok(settings) => launch.settings = Some(settings),
            Err(err) => {
                eprintln!("Error: {err}");
                return Err(ExitCode::FAILURE);
            }
        }
    }
    let _ = (takes_settings, returns_app, file);
    Ok(launch)
}

/// `#[ruststream::app(shutdown_timeout = ..)]`, once `main` runs.
static DEFAULT_SHUTDOWN_TIMEOUT: std::sync::OnceLock<std::time::Duration> =
    std::sync::OnceLock::new();

/// The shutdown timeout an `App` starts with: the `#[ruststream::app]`
/// binary's, if it set one.
pub(crate) fn default_shutdown_timeout() -> Option<std::time::Duration> {
    DEFAULT_SHUTDOWN_TIMEOUT.get().copied()
}

/// Does the task with `app`.
pub(crate) async fn finish_app<B: Broker>(app: App<B>, launch: Launch) -> ExitCode {
    #[cfg(feature = "config")]
    let app = match &launch.settings {
        Some(settings) => app.settings(settings),
        None => app,
    };
    match launch.task {
        Task::Run => exit(app.run().await),
        Task::Check => match app.check().await {
            Ok(()) => {
                println!("check passed: the settings are valid and every broker was reached");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("check failed: {err}");
                ExitCode::FAILURE
            }
        },
        #[cfg(feature = "asyncapi")]
        Task::AsyncApi { yaml, output } => {
            let mut doc = app.asyncapi();
            let title = match doc.as_value()["info"]["title"].as_str() {
                Some("app") | None => launch.runtime.binary.unwrap_or("app").to_owned(),
                Some(name) => name.to_owned(),
            };
            doc = doc.info(&title, launch.runtime.version.unwrap_or("0.0.0"));
            let text = if yaml {
                doc.to_yaml()
            } else {
                doc.to_json() + "\n"
            };
            let written = match &output {
                Some(path) => std::fs::write(path, text).map_err(|err| {
                    crate::Error::Config(format!("cannot write {}: {err}", path.display()))
                }),
                None => {
                    print!("{text}");
                    Ok(())
                }
            };
            // Nothing ran: the brokers only close.
            let _ = app.check().await;
            exit(written)
        }
    }
}

/// `Ok` exits 0; an error is printed and exits 1.
pub(crate) fn exit(result: crate::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("Error: {err}");
            ExitCode::FAILURE
        }
    }
}
