//! Testing services (feature `testing`, for dev-dependencies).
//!
//! - [`TestApp`] runs the real app — its subscribers, hooks, state,
//!   middleware and modes — on an in-process broker, drives it, and shows
//!   what it sent, dead-lettered and handled.
//! - [`TestCtx`] is a [`Ctx`](crate::Ctx) for calling a handler directly
//!   in a unit test; it records what the handler published and what it
//!   scheduled.
//!
//! ```
//! use std::time::Duration;
//! use ruststream::prelude::*;
//! use ruststream::testing::TestCtx;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Order { id: u64 }
//!
//! #[subscriber("orders")]
//! async fn confirm(order: Order, ctx: Ctx) -> Result<(), HandlerError> {
//!     if ctx.attempt() < 3 && order.id == 0 {
//!         ctx.retry_after(Duration::from_secs(5));
//!         return Ok(());
//!     }
//!     ctx.publish("orders.confirmed", &order.id).await?;
//!     ctx.and_after(async { /* e-mail the customer */ });
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let test = TestCtx::new("orders").attempt(1).build();
//! confirm(Order { id: 7 }, test.ctx()).await.unwrap();
//! assert_eq!(test.published_as::<u64>("orders.confirmed"), [7]);
//! assert_eq!(test.and_after_count(), 1);
//!
//! let test = TestCtx::new("orders").build();
//! confirm(Order { id: 0 }, test.ctx()).await.unwrap();
//! assert_eq!(test.retry_requested(), Some(Duration::from_secs(5)));
//! assert!(test.published().is_empty());
//! # }
//! ```

mod app;
mod ctx;
mod record;

pub use app::{Call, DeadLetter, TestApp};
pub use ctx::{TestCtx, TestCtxBuilder};
