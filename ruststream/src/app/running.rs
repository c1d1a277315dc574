//! A started app and its graceful stop.

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::AppHandle;
use super::register::{ErasedBroker, StartContext, StartUnit};
use crate::accept::AcceptLayer;
use crate::exec::stop::Stop;
use crate::{Error, Result};

/// A running app: its subscriber loops are live.
///
/// Stop it with [`shutdown`](RunningApp::shutdown): every loop stops taking new
/// deliveries, the delivery each loop holds is processed and settled, then the
/// brokers close in reverse registration order.
pub struct RunningApp {
    stop: Stop,
    app: AppHandle,
    loops: Vec<JoinHandle<()>>,
    brokers: Vec<Arc<dyn ErasedBroker>>,
}

impl std::fmt::Debug for RunningApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningApp")
            .field("loops", &self.loops.len())
            .field(
                "brokers",
                &self.brokers.iter().map(|b| b.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RunningApp {
    pub(super) async fn start(
        brokers: Vec<Arc<dyn ErasedBroker>>,
        units: Vec<Box<dyn StartUnit>>,
        layers: Arc<[Arc<dyn AcceptLayer>]>,
    ) -> Result<RunningApp> {
        for unit in &units {
            unit.config().validate()?;
        }
        let stop = Stop::default();
        let app = AppHandle::current();
        let mut running = RunningApp {
            stop: stop.clone(),
            app: app.clone(),
            loops: Vec::with_capacity(units.len()),
            brokers,
        };
        for unit in units {
            let subject = unit.config().subject().to_string();
            let cx = StartContext {
                layers: Arc::clone(&layers),
                stop: stop.clone(),
                app: app.clone(),
            };
            match unit.start(cx).await {
                Ok(handle) => running.loops.push(handle),
                Err(err) => {
                    tracing::error!(subject, error = %err, "subscribe failed; stopping");
                    // Stop what already started, then report the first error.
                    let _ = running.shutdown().await;
                    return Err(err);
                }
            }
        }
        tracing::info!(subscribers = running.loops.len(), "app started");
        Ok(running)
    }

    /// Graceful stop: loops stop taking new deliveries and settle the one in
    /// hand; then brokers close in reverse registration order. Returns the
    /// first error met; every step still runs.
    pub async fn shutdown(mut self) -> Result<()> {
        self.stop.stop();
        let mut first_error = None;
        for handle in self.loops.drain(..) {
            if let Err(err) = handle.await {
                tracing::error!(error = %err, "subscriber loop ended abnormally");
                first_error.get_or_insert(Error::App(err.into()));
            }
        }
        // Work handed to the app runtime (`Ctx<MainRuntime>`) finishes
        // before brokers close (RT-9).
        self.app.drain().await;
        for broker in self.brokers.iter().rev() {
            if let Err(err) = broker.close().await {
                tracing::warn!(broker = broker.name(), error = %err, "broker close failed");
                first_error.get_or_insert(err);
            }
        }
        tracing::info!("app stopped");
        first_error.map_or(Ok(()), Err)
    }
}
