//! A broker server of a test's own, for fault tests: on a free loopback
//! port, with its own data directory, stopped by its pid — the shared
//! service is never touched.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{unique, until};

/// A server's arguments: `{port}` stands for the port, and the data
/// directory is appended last (so the list ends with its flag).
pub type Args = &'static [&'static str];

/// A running server; killed (and its directory removed) when dropped.
pub struct OwnServer {
    child: Child,
    program: &'static str,
    args: Args,
    pub port: u16,
    dir: PathBuf,
}

impl OwnServer {
    /// Starts `program` on a free loopback port and waits until it accepts
    /// connections; fails loudly (with how to install it) when it cannot run.
    pub async fn start(program: &'static str, args: Args) -> OwnServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(unique(&format!("rs-{program}-")));
        std::fs::create_dir_all(&dir).unwrap();
        let server = OwnServer {
            child: spawn(program, args, port, &dir),
            program,
            args,
            port,
            dir,
        };
        server.wait_up().await;
        server
    }

    async fn wait_up(&self) {
        let port = self.port;
        until(
            10,
            &format!("the test's {} accepts connections", self.program),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        )
        .await;
    }

    /// Kills the server and starts it again on the same port and directory.
    pub async fn restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = spawn(self.program, self.args, self.port, &self.dir);
        self.wait_up().await;
    }
}

fn spawn(program: &'static str, args: Args, port: u16, dir: &Path) -> Child {
    let port = port.to_string();
    let mut argv: Vec<OsString> = args
        .iter()
        .map(|arg| arg.replace("{port}", &port).into())
        .collect();
    argv.push(dir.into());
    Command::new(program)
        .args(argv)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| {
            panic!("cannot run {program} ({err}); install it: apt-get install {program}")
        })
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
