//! The app's HTTP endpoints (feature `prometheus`): `/metrics` in the
//! Prometheus text format, `/health` (the process answers) and `/ready`
//! (every subscription started and no shutdown begun).
//!
//! A small HTTP/1.1 responder on a tokio listener: one request per
//! connection, `GET` only, bounded in size and time, so a slow or hostile
//! client holds nothing for long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::host::AppHandle;
use crate::{Error, Result};

/// Longest request head read, and how long a client may take to send it.
const MAX_REQUEST: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The process-wide Prometheus recorder, installed by the first app that
/// serves `/metrics`; `None` when another recorder was installed first.
static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Bucket bounds of every timing histogram, in seconds: from half a
/// millisecond (an in-process handler or send) to ten seconds.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn recorder() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            // Histograms with buckets, as Prometheus expects them (without
            // buckets the exporter renders summaries).
            let builder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .expect("the bucket list is not empty");
            match builder.install_recorder() {
            Ok(handle) => Some(handle),
            Err(err) => {
                tracing::warn!(error = %err, "another metrics recorder is installed: /metrics serves nothing");
                None
            }
            }
        })
        .as_ref()
}

/// Installs the recorder and turns timings on: before anything of the app
/// that serves is built, so what it registers and times at construction
/// (its job gauges, its send timings) reaches the recorder too.
pub(crate) fn prepare() {
    recorder();
    crate::metrics::record_handler_timings();
}

/// Whether the app is ready: set once every subscription started, cleared
/// when the shutdown begins.
#[derive(Clone, Default)]
pub(crate) struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub(crate) fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }
}

/// A bound listener, serving once spawned.
pub(crate) struct Endpoints {
    listener: TcpListener,
    readiness: Readiness,
}

impl Endpoints {
    /// Binds `addr` (a startup error names it when it cannot) and installs
    /// the recorder.
    pub(crate) async fn bind(addr: SocketAddr) -> Result<Endpoints> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|err| Error::Config(format!("cannot serve metrics on {addr}: {err}")))?;
        prepare();
        if let Ok(local) = listener.local_addr() {
            tracing::info!(%local, "serving /metrics, /health and /ready");
        }
        Ok(Endpoints {
            listener,
            readiness: Readiness::default(),
        })
    }

    /// The address it listens on (the port the system picked for port 0).
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    pub(crate) fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// Serves until the task is aborted.
    pub(crate) fn spawn(self, app: AppHandle) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = self.listener.accept().await else {
                    continue;
                };
                let readiness = self.readiness.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(READ_TIMEOUT, answer(stream, &readiness, &app)).await;
                });
            }
        })
    }
}

/// Reads one request head and answers it.
async fn answer(
    mut stream: TcpStream,
    readiness: &Readiness,
    app: &AppHandle,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            )
            .await;
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n",
        )
        .await;
    }
    match path.split('?').next().unwrap_or("") {
        "/metrics" => match recorder() {
            Some(handle) => {
                app.metrics().sync();
                let body = handle.render();
                respond(&mut stream, "200 OK", "text/plain; version=0.0.4", &body).await
            }
            None => {
                respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain",
                    "another metrics recorder is installed in this process\n",
                )
                .await
            }
        },
        "/health" => respond(&mut stream, "200 OK", "text/plain", "ok\n").await,
        "/ready" => {
            let shutting_down = app.shutdown_requested().is_cancelled();
            if readiness.0.load(Ordering::Acquire) && !shutting_down {
                respond(&mut stream, "200 OK", "text/plain", "ready\n").await
            } else if shutting_down {
                respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain",
                    "shutting down\n",
                )
                .await
            } else {
                respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain",
                    "starting\n",
                )
                .await
            }
        }
        _ => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "try /metrics, /health or /ready\n",
            )
            .await
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
