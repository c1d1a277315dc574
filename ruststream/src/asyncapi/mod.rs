//! AsyncAPI 3.0 documents of an app (feature `asyncapi`): what
//! [`App::asyncapi`](crate::App::asyncapi) returns.
//!
//! The document has one server per broker (with its protocol), one channel
//! per subject (wildcard tokens become channel parameters), a `receive`
//! operation per subscriber — with its `reply` when the handler returns a
//! value, and a `send` to its dead-letter subject when it has one — and a
//! `send` operation per publisher declared with
//! [`App::publishes`](crate::App::publishes). Payload schemas come from
//! `schemars::JsonSchema`; a type without it is documented by name with an
//! empty schema.

pub(crate) mod build;

pub(crate) use self::build::{Publication, Reception, Server};

/// An AsyncAPI 3.0 document.
///
/// ```
/// use ruststream::prelude::*;
///
/// #[subscriber("orders.created")]
/// async fn confirm(order: String) -> String {
///     order
/// }
///
/// let doc = App::new().broker(MemoryBroker::new()).subscriber(confirm).asyncapi();
/// let json: serde_json::Value = serde_json::from_str(&doc.to_json()).unwrap();
/// assert_eq!(json["asyncapi"], "3.0.0");
/// assert_eq!(json["operations"]["confirm"]["action"], "receive");
/// assert!(doc.to_yaml().starts_with("asyncapi: 3.0.0"));
/// ```
#[derive(Clone, Debug)]
pub struct AsyncApi(serde_json::Value);

impl AsyncApi {
    /// Sets `info.title` and `info.version` (default: the app's name and
    /// `0.0.0`; a `#[ruststream::app]` binary puts its package's).
    pub fn info(mut self, title: &str, version: &str) -> Self {
        self.0["info"]["title"] = title.into();
        self.0["info"]["version"] = version.into();
        self
    }

    /// The document as a JSON value.
    pub fn as_value(&self) -> &serde_json::Value {
        &self.0
    }

    /// The document as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.0).expect("a JSON value serializes")
    }

    /// The document as YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(&self.0).expect("a JSON value serializes as YAML")
    }
}
