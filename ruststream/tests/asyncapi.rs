//! AsyncAPI documents (feature `asyncapi`): a service with three
//! subscribers — one of them request/reply with a dead-letter subject, one
//! on a wildcard subject — and a declared publisher gives the channels and
//! operations expected, with schemas from `schemars`; the JSON and the YAML
//! are both valid for the official AsyncAPI parser (`@asyncapi/parser`, run
//! with node: `scripts/asyncapi/validate.mjs`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ruststream::prelude::*;
use serde_json::Value;

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
    sku: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Confirmed {
    id: u64,
}

/// No `JsonSchema`: documented by name, with an empty schema.
#[derive(Serialize, Deserialize)]
struct Shipment {
    id: u64,
}

#[derive(Serialize, schemars::JsonSchema)]
struct Shipped {
    id: u64,
    carrier: String,
}

#[subscriber("orders.created", queue_group = "billing", dead_letter = "orders.dead")]
async fn confirm(order: Order) -> Result<Confirmed, HandlerError> {
    Ok(Confirmed { id: order.id })
}

#[subscriber("orders.*")]
async fn audit(_order: Order) {}

#[subscriber("shipments.ready")]
async fn ship(_shipment: Shipment) {}

fn service() -> App<MemoryBroker> {
    App::new()
        .name("orders")
        .broker(MemoryBroker::new())
        .subscriber(confirm)
        .subscriber(audit)
        .subscriber(ship)
        .publishes::<Shipped>("orders.shipped")
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

#[test]
fn three_subscribers_a_reply_and_a_publisher_give_the_expected_document() {
    let doc = service().asyncapi();
    let json = doc.as_value();
    assert_eq!(json["asyncapi"], "3.0.0");
    assert_eq!(json["info"]["title"], "orders");
    assert_eq!(json["servers"]["memory"]["protocol"], "memory");
    assert_eq!(
        keys(&json["channels"]),
        [
            "confirm_reply",
            "orders_X",
            "orders_created",
            "orders_dead",
            "orders_shipped",
            "shipments_ready"
        ]
    );
    assert_eq!(
        keys(&json["operations"]),
        [
            "audit",
            "confirm",
            "confirm_dead_letter",
            "publish_orders_shipped",
            "ship"
        ]
    );
    let ops = &json["operations"];
    for receive in ["audit", "confirm", "ship"] {
        assert_eq!(ops[receive]["action"], "receive", "{receive}");
    }
    for send in ["confirm_dead_letter", "publish_orders_shipped"] {
        assert_eq!(ops[send]["action"], "send", "{send}");
    }

    // Request/reply: the reply goes to a dynamic address, with its schema.
    let confirm = &ops["confirm"];
    assert_eq!(confirm["channel"]["$ref"], "#/channels/orders_created");
    assert_eq!(
        confirm["messages"][0]["$ref"],
        "#/channels/orders_created/messages/Order"
    );
    assert_eq!(
        confirm["reply"]["channel"]["$ref"],
        "#/channels/confirm_reply"
    );
    assert!(json["channels"]["confirm_reply"]["address"].is_null());
    let reply = &json["channels"]["confirm_reply"]["messages"]["Confirmed"];
    assert_eq!(reply["payload"]["$ref"], "#/components/schemas/Confirmed");
    assert_eq!(reply["contentType"], "application/json");
    assert!(reply["headers"]["properties"]["ruststream-status"].is_object());
    assert!(
        ops["confirm"]["description"]
            .as_str()
            .unwrap()
            .contains("billing")
    );

    // Payload schemas from `schemars`, shared in components.
    let schemas = &json["components"]["schemas"];
    assert_eq!(keys(schemas), ["Confirmed", "Order", "Shipped"]);
    assert_eq!(schemas["Order"]["properties"]["sku"]["type"], "string");
    let order = &json["channels"]["orders_created"]["messages"]["Order"];
    assert_eq!(
        order["headers"]["properties"]["content-type"]["const"],
        "application/json"
    );

    // A wildcard becomes a channel parameter.
    let wildcard = &json["channels"]["orders_X"];
    assert_eq!(wildcard["address"], "orders.{wildcard1}");
    assert!(wildcard["parameters"]["wildcard1"].is_object());

    // A body without `JsonSchema`: named, an empty schema, and why.
    let shipment = &json["channels"]["shipments_ready"]["messages"]["Shipment"];
    assert_eq!(shipment["payload"], serde_json::json!({}));
    assert!(
        shipment["description"]
            .as_str()
            .unwrap()
            .contains("JsonSchema")
    );

    // The dead letter carries the reason headers.
    let dead = &json["channels"]["orders_dead"]["messages"]["Order"];
    assert!(dead["headers"]["properties"]["ruststream-error"].is_object());

    let shipped = &json["channels"]["orders_shipped"]["messages"]["Shipped"];
    assert_eq!(shipped["payload"]["$ref"], "#/components/schemas/Shipped");
}

/// Where the parser is installed (`npm ci` there; scripts/test.sh does it);
/// fails with how to install it when it is not.
fn validator() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/asyncapi");
    assert!(
        dir.join("node_modules/@asyncapi/parser").is_dir(),
        "the AsyncAPI parser is not installed: run `npm ci` in {} (scripts/test.sh does)",
        dir.display()
    );
    dir
}

#[test]
fn the_official_parser_accepts_the_json_and_the_yaml() {
    let dir = validator();
    let doc = service().asyncapi();
    let out = std::env::temp_dir().join(common::unique("ruststream-asyncapi"));
    std::fs::create_dir_all(&out).unwrap();
    let json = out.join("orders.json");
    let yaml = out.join("orders.yaml");
    std::fs::write(&json, doc.to_json()).unwrap();
    std::fs::write(&yaml, doc.to_yaml()).unwrap();
    let run = Command::new("node")
        .arg(dir.join("validate.mjs"))
        .arg(&json)
        .arg(&yaml)
        .output()
        .expect("node runs (install Node.js)");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.status.success(),
        "the parser refused the document:\n{report}"
    );
    assert!(
        report.contains("orders.json: valid AsyncAPI 3.0.0 (6 channels, 5 operations)"),
        "{report}"
    );
    assert!(
        report.contains("orders.yaml: valid AsyncAPI 3.0.0"),
        "{report}"
    );
}

/// The parser is a real check: a broken document is refused.
#[test]
fn the_parser_refuses_a_broken_document() {
    let dir = validator();
    let doc = service().asyncapi();
    let mut broken = doc.as_value().clone();
    broken["operations"]["confirm"]["channel"]["$ref"] = "#/channels/nowhere".into();
    let file = std::env::temp_dir().join(common::unique("ruststream-asyncapi-broken.json"));
    std::fs::write(&file, broken.to_string()).unwrap();
    let run = Command::new("node")
        .arg(dir.join("validate.mjs"))
        .arg(&file)
        .output()
        .expect("node runs (install Node.js)");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "the parser took a broken document");
    assert!(stderr.contains("INVALID"), "{stderr}");
}
