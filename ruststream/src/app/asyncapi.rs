//! The app as an AsyncAPI document (feature `asyncapi`).

use super::App;
use crate::asyncapi::{self, AsyncApi, Publication, Server};
use crate::describe::MessageTypes;

impl<B> App<B> {
    /// Declares that the app publishes `T` messages (JSON) on `subject`,
    /// through the broker registered last: a `send` operation in
    /// [`asyncapi`](Self::asyncapi). Documentation only; it changes
    /// nothing at run time.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// #[derive(Serialize, schemars::JsonSchema)]
    /// struct Shipped {
    ///     id: u64,
    /// }
    ///
    /// let doc = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .publishes::<Shipped>("orders.shipped")
    ///     .asyncapi();
    /// let json = doc.as_value();
    /// assert_eq!(json["operations"]["publish_orders_shipped"]["action"], "send");
    /// assert_eq!(json["components"]["schemas"]["Shipped"]["properties"]["id"]["type"], "integer");
    /// ```
    pub fn publishes<T: schemars::JsonSchema>(mut self, subject: &str) -> Self {
        let server = self.brokers.last().map(|broker| Server {
            broker: broker.name(),
            host: broker.host(),
        });
        let types = MessageTypes::of::<T, ()>()
            .with_schemas(Some(|generator| generator.subschema_for::<T>()), None);
        self.published.push(Publication {
            subject: subject.to_owned(),
            server,
            message: types.body,
            content_type: <crate::Json as crate::Codec>::CONTENT_TYPE,
        });
        self
    }

    /// The app's AsyncAPI 3.0 document: a server per broker, a channel per
    /// subject, a `receive` operation per subscriber (its `reply` when the
    /// handler returns a value; a `send` to its dead-letter subject), a
    /// `send` per [declared publisher](Self::publishes). Settings apply
    /// first: call it on the app as it would run.
    pub fn asyncapi(&self) -> AsyncApi {
        let servers: Vec<Server> = (self.brokers.iter())
            .map(|broker| Server {
                broker: broker.name(),
                host: broker.host(),
            })
            .collect();
        let receptions: Vec<_> = self.units.iter().map(|unit| unit.reception()).collect();
        asyncapi::build::document(&self.name, &servers, &receptions, &self.published)
    }
}
