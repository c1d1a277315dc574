//! The binding conformance suite on the memory Core, in both its one- and
//! several-connection forms.

use ruststream::conformance::{self, Capabilities, Harness};
use ruststream::{MemoryBroker, Result};

/// A fresh in-process server per check.
struct Memory;

impl Harness for Memory {
    type Broker = MemoryBroker;

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    async fn connect(&self, _prefix: &str) -> Result<MemoryBroker> {
        Ok(MemoryBroker::new())
    }
}

/// One shared server; each check gets its own connection to it.
struct MemoryConnections(MemoryBroker);

impl Harness for MemoryConnections {
    type Broker = MemoryBroker;

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    async fn connect(&self, _prefix: &str) -> Result<MemoryBroker> {
        Ok(self.0.connect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_core_conforms() {
    let report = conformance::run(&Memory).await;
    report.assert_passed();
    assert!(report.skipped.is_empty(), "skipped: {:?}", report.skipped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_connections_to_one_server_conform() {
    conformance::run(&MemoryConnections(MemoryBroker::new()))
        .await
        .assert_passed();
}
