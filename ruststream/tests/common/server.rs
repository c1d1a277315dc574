//! A broker server of a test's own, for fault tests: on a free loopback
//! port, with its own data directory, stopped by its pid — the shared
//! service is never touched.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{unique, until};

/// A server's arguments: `{port}` stands for the port and `{dir}` for the
/// server's own directory, which is also appended last (so the list ends
/// with the data directory's flag).
pub type Args = &'static [&'static str];

/// How a server is started on a port, with a directory of its own.
type Launch = Box<dyn Fn(u16, &Path) -> Command + Send + Sync>;

/// A running server; killed (and its directory removed) when dropped.
pub struct OwnServer {
    child: Option<Child>,
    program: &'static str,
    launch: Launch,
    pub port: u16,
    dir: PathBuf,
    /// How long starting may take.
    start_secs: u64,
    /// What the server says first to a new connection, when it speaks
    /// first (NATS's `INFO`): up means it greets, not only that the port
    /// takes connections.
    greeting: Option<&'static [u8]>,
}

/// A loopback port for a server of a test's own: free now, below the
/// kernel's ephemeral range, and never the same twice in one process.
///
/// A port bound with `:0` comes from the ephemeral range, and until the
/// server binds it (a RabbitMQ node takes ~10 s) an outgoing connection
/// may take it as its source port, or a test starting another server may
/// be given it too. Once, a RabbitMQ node found its port taken
/// (`eaddrinuse`) while its test, seeing another server's listener there,
/// went on and connected to that one.
fn free_port() -> u16 {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    /// Read once per process: where its ports start (random, as nextest
    /// runs a process per test), how many ports the range has, and its
    /// lowest port. Computed per call, the start moved with each call and
    /// two calls could meet on one port.
    static RANGE: OnceLock<(u32, u32, u32)> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let &(start, span, below) = RANGE.get_or_init(|| {
        use std::hash::BuildHasher;
        let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768);
        let span = 10_000.min(ephemeral_low.saturating_sub(1_024)).max(1);
        let start = std::hash::RandomState::new().hash_one(std::process::id()) as u32;
        (start, span, ephemeral_low.saturating_sub(span))
    });
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(below + start.wrapping_add(n) % span).unwrap();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl OwnServer {
    /// Starts `program` on a free loopback port and waits until it accepts
    /// connections (a nats-server: until it greets them with its `INFO`);
    /// fails loudly (with how to install it) when it cannot run.
    pub async fn start(program: &'static str, args: Args) -> OwnServer {
        let greeting = (program == "nats-server").then_some(&b"INFO"[..]);
        let launch = move |port: u16, dir: &Path| {
            let port = port.to_string();
            let mut argv: Vec<OsString> = args
                .iter()
                .map(|arg| {
                    let arg = arg.replace("{port}", &port);
                    arg.replace("{dir}", &dir.to_string_lossy()).into()
                })
                .collect();
            argv.push(dir.into());
            let mut command = Command::new(program);
            command.args(argv);
            command
        };
        OwnServer::launch(program, Box::new(launch), 10, greeting).await
    }

    /// `program` started by `launch` (given the port and the server's own
    /// directory, for a config file).
    pub async fn custom(
        program: &'static str,
        launch: impl Fn(u16, &Path) -> Command + Send + Sync + 'static,
    ) -> OwnServer {
        OwnServer::launch(program, Box::new(launch), 10, None).await
    }

    /// A redis-server whose streams survive `kill -9`: an append-only file
    /// with `appendfsync always`.
    pub async fn redis() -> OwnServer {
        OwnServer::start(
            "redis-server",
            &[
                "--bind",
                "127.0.0.1",
                "--port",
                "{port}",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--dir",
            ],
        )
        .await
    }

    /// A nats-server with JetStream on file storage, its log in its
    /// directory.
    pub async fn nats() -> OwnServer {
        OwnServer::start(
            "nats-server",
            &[
                "-a",
                "127.0.0.1",
                "-p",
                "{port}",
                "-l",
                "{dir}/server.log",
                "-js",
                "-sd",
            ],
        )
        .await
    }

    /// A RabbitMQ node of the test's own: its own node name, AMQP and
    /// distribution ports on loopback, data, logs and cookie in its
    /// directory, no plugins. It boots in 5–20 s.
    pub async fn rabbitmq() -> OwnServer {
        let node = unique("rsfault");
        let dist_port = free_port();
        let launch = move |port: u16, dir: &Path| {
            let config = dir.join("rabbitmq.conf");
            std::fs::write(
                &config,
                format!(
                    "listeners.tcp.default = 127.0.0.1:{port}\n\
                     distribution.listener.interface = 127.0.0.1\n\
                     distribution.listener.port_range.min = {dist_port}\n\
                     distribution.listener.port_range.max = {dist_port}\n"
                ),
            )
            .unwrap();
            std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
            // The script itself, not the wrapper that switches users.
            let mut command = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
            command
                .current_dir(dir)
                .env("HOME", dir)
                .env("RABBITMQ_NODENAME", format!("{node}@localhost"))
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", port.to_string())
                .env("RABBITMQ_DIST_PORT", dist_port.to_string())
                .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.join("log"))
                .env("RABBITMQ_CONFIG_FILE", &config)
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
                .env("RABBITMQ_PID_FILE", dir.join("pid"))
                .env("ERL_EPMD_ADDRESS", "127.0.0.1");
            command
        };
        OwnServer::launch("rabbitmq-server", Box::new(launch), 60, None).await
    }

    async fn launch(
        program: &'static str,
        launch: Launch,
        start_secs: u64,
        greeting: Option<&'static [u8]>,
    ) -> OwnServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(unique(&format!("rs-{program}-")));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = OwnServer {
            child: None,
            program,
            launch,
            port,
            dir,
            start_secs,
            greeting,
        };
        server.start_again().await;
        server
    }

    /// Waits until the server takes connections; fails loudly, with where
    /// its logs are, if it exits first (a port taken meanwhile, say).
    async fn wait_up(&mut self) {
        let (port, greeting, program) = (self.port, self.greeting, self.program);
        let dir = self.dir.clone();
        let child = self.child.as_mut().expect("the server was started");
        until(
            self.start_secs,
            &format!("the test's {program} accepts connections"),
            || {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "the test's {program} exited ({status}) before it took connections \
                         on port {port}; its logs are in {}",
                        dir.display()
                    );
                }
                is_up(port, greeting)
            },
        )
        .await;
    }

    /// `kill -9` of the server (its whole process group), by its pid.
    pub async fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        kill_group(&child);
        let _ = child.wait();
        let port = self.port;
        until(10, "the killed server's port to close", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        })
        .await;
    }

    /// Freezes the server (SIGSTOP) or lets it go on (SIGCONT): its port
    /// stays open, but it reads nothing, so clients' buffers fill.
    #[allow(dead_code)]
    pub fn freeze(&self, frozen: bool) {
        let Some(child) = &self.child else { return };
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let _ = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status();
    }

    /// A graceful stop: SIGTERM to the server's pid (it saves what it
    /// persists), then waits for it to exit and its port to close.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let port = self.port;
        until(10, "the stopped server's port to close", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        })
        .await;
    }

    /// Starts the server again on the same port and directory.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let mut command = (self.launch)(self.port, &self.dir);
        use std::os::unix::process::CommandExt;
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot run {} ({err}); install it: apt-get install {}",
                    self.program, self.program
                )
            });
        self.child = Some(child);
        self.wait_up().await;
    }

    /// Kills the server and starts it again on the same port and directory.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.start_again().await;
    }

    /// Kills the server, keeps it down for `downtime`, and starts it again.
    pub async fn down_for(&mut self, downtime: Duration) {
        self.kill().await;
        tokio::time::sleep(downtime).await;
        self.start_again().await;
    }
}

/// Whether the server on `port` takes a connection (and greets with
/// `greeting`, when given). A probe that found nobody listening can be
/// connected to itself (its ephemeral port the one probed): that is not up.
fn is_up(port: u16, greeting: Option<&[u8]>) -> bool {
    use std::io::Read;
    let Ok(mut probe) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    if probe.local_addr().ok() == probe.peer_addr().ok() {
        return false;
    }
    let Some(greeting) = greeting else {
        return true;
    };
    let mut first = vec![0; greeting.len()];
    probe
        .set_read_timeout(Some(Duration::from_millis(500)))
        .is_ok()
        && probe.read_exact(&mut first).is_ok()
        && first == greeting
}

/// SIGKILL to the process group the server leads (a RabbitMQ node's
/// script and its Erlang VM, say).
fn kill_group(child: &Child) {
    let group = format!("-{}", child.id());
    let killed = Command::new("kill").args(["-9", "--", &group]).status();
    if !killed.is_ok_and(|status| status.success()) {
        let _ = Command::new("kill")
            .args(["-9", &child.id().to_string()])
            .status();
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&child);
            let _ = child.wait();
        }
        // A failed test keeps the server's directory: its logs say what
        // the server did (`log/` for RabbitMQ).
        if std::thread::panicking() {
            eprintln!("kept {} (the server's data and logs)", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
