//! What a subscriber's messages are, for documents (AsyncAPI): the types of
//! its body and reply, their content types, and — with the `asyncapi`
//! feature, for types that implement `schemars::JsonSchema` — their JSON
//! Schemas. Types without one are documented by name with an empty schema.

/// The messages a subscriber takes and replies with
/// ([`Subscriber::message_types`](crate::subscriber::Subscriber::message_types)).
///
/// ```
/// use ruststream::subscriber::MessageTypes;
///
/// let types = MessageTypes::of::<String, ()>();
/// assert_eq!(types.body_name(), "String");
/// assert_eq!(types.reply_name(), None);
/// assert_eq!(MessageTypes::of::<String, u32>().reply_name(), Some("u32"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MessageTypes {
    pub(crate) body: TypeInfo,
    pub(crate) reply: Option<TypeInfo>,
    pub(crate) content_type: Option<&'static str>,
    pub(crate) reply_content_type: Option<&'static str>,
}

/// One message type: its name and, where known, how to make its schema.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TypeInfo {
    pub(crate) name: &'static str,
    #[cfg(feature = "asyncapi")]
    pub(crate) schema: Option<SchemaFn>,
}

/// Makes a type's JSON Schema (feature `asyncapi`).
#[cfg(feature = "asyncapi")]
pub type SchemaFn = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

impl TypeInfo {
    fn of<T: ?Sized>() -> Self {
        TypeInfo {
            name: short_type_name(std::any::type_name::<T>()),
            #[cfg(feature = "asyncapi")]
            schema: None,
        }
    }
}

impl MessageTypes {
    /// A body of type `B` and replies of type `R` (`()`: no reply), named
    /// only.
    pub fn of<B: ?Sized, R: ?Sized>() -> Self {
        let reply = (std::any::type_name::<R>() != "()").then(TypeInfo::of::<R>);
        MessageTypes {
            body: TypeInfo::of::<B>(),
            reply,
            content_type: None,
            reply_content_type: None,
        }
    }

    /// With the schemas of the body and the reply (feature `asyncapi`).
    #[cfg(feature = "asyncapi")]
    pub fn with_schemas(mut self, body: Option<SchemaFn>, reply: Option<SchemaFn>) -> Self {
        self.body.schema = body;
        if let Some(info) = &mut self.reply {
            info.schema = reply;
        }
        self
    }

    /// With the content types of the body and the reply.
    pub fn with_content_types(
        mut self,
        body: Option<&'static str>,
        reply: Option<&'static str>,
    ) -> Self {
        self.content_type = body;
        self.reply_content_type = reply;
        self
    }

    /// The body type's name, without its module path.
    pub fn body_name(&self) -> &'static str {
        self.body.name
    }

    /// The reply type's name, if the subscriber replies.
    pub fn reply_name(&self) -> Option<&'static str> {
        self.reply.map(|info| info.name)
    }
}

/// `alloc::string::String` → `String`, `app::Wrapper<app::Order>` →
/// `Wrapper<Order>`.
fn short_type_name(full: &'static str) -> &'static str {
    if full.contains('<') {
        // Generic: shortened where it is cheap, else kept whole.
        return full;
    }
    crate::text::last_segment(full)
}

/// Picks a type's schema without requiring one (autoref specialization,
/// expanded where the type is concrete): raw payloads are binary, a
/// `JsonSchema` type has its own, any other type none.
#[cfg(feature = "asyncapi")]
pub mod schema_kind {
    use std::marker::PhantomData;

    use super::SchemaFn;

    /// The selector.
    pub struct SchemaKind<T: ?Sized>(PhantomData<fn() -> Box<T>>);

    impl<T: ?Sized> SchemaKind<T> {
        /// The selector for `T`.
        #[allow(clippy::new_without_default)]
        pub const fn new() -> Self {
            SchemaKind(PhantomData)
        }
    }

    /// Raw payloads (`Bytes`, `Vec<u8>`): any bytes.
    pub trait RawSchema {
        /// The schema maker.
        fn schema_fn(&self) -> Option<SchemaFn> {
            Some(|_| schemars::json_schema!({ "type": "string", "format": "binary" }))
        }
    }

    impl RawSchema for &&SchemaKind<bytes::Bytes> {}
    impl RawSchema for &&SchemaKind<Vec<u8>> {}

    /// Types with a schema of their own.
    pub trait HasSchema {
        /// The schema maker.
        fn schema_fn(&self) -> Option<SchemaFn>;
    }

    impl<T: schemars::JsonSchema> HasSchema for &SchemaKind<T> {
        fn schema_fn(&self) -> Option<SchemaFn> {
            Some(|generator| generator.subschema_for::<T>())
        }
    }

    /// Every other type: none.
    pub trait NoSchema {
        /// No schema maker.
        fn schema_fn(&self) -> Option<SchemaFn> {
            None
        }
    }

    impl<T: ?Sized> NoSchema for SchemaKind<T> {}
}
