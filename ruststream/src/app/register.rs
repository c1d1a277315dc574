//! Type erasure at registration: each subscriber becomes a [`StartUnit`] whose
//! loop is compiled for its concrete broker and handler.

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::Result;
use crate::accept::AcceptLayer;
use crate::binding::erased::BoxFuture;
use crate::binding::{Broker, Subscription};
use crate::exec;

use crate::host::{Abort, AppHandle, Stop};
use crate::ingress::PressureState;
use crate::ingress::SourceRegistration;
use crate::middleware::{HandlerService, SharedMiddleware};
use crate::pipeline::{Unit, stack};
use crate::subscriber::{Mode, SendSubscriber, StateKey, Subscriber, SubscriberConfig};

/// What a starting unit gets from the app.
pub(crate) struct StartContext {
    pub(crate) layers: Arc<[Arc<dyn AcceptLayer>]>,
    /// The app's middleware, outermost first: around every subscriber's own.
    pub(crate) middleware: Arc<[SharedMiddleware]>,
    pub(crate) stop: Stop,
    /// Set when the shutdown timeout expires: handlers in hand are dropped.
    pub(crate) abort: Abort,
    pub(crate) app: AppHandle,
}

/// A subscriber bound to its broker, ready to subscribe and spawn its loop.
pub(crate) trait StartUnit: Send {
    fn config(&self) -> &SubscriberConfig;
    /// The configuration, to change before start (settings).
    #[cfg(feature = "config")]
    fn config_mut(&mut self) -> &mut SubscriberConfig;
    /// The handler's name and the shared state types it takes.
    fn requires(&self) -> (&'static str, Vec<StateKey>);
    /// What [`start`](Self::start) refuses beyond the configuration's own
    /// checks — the handler's mode, middleware its mode does not take — so
    /// `App::check` refuses it too.
    fn refusal(&self) -> Result<()>;
    /// The name of the broker it is bound to.
    fn broker_name(&self) -> &'static str;
    /// What it receives and replies, for an AsyncAPI document.
    #[cfg(feature = "asyncapi")]
    fn reception(&self) -> crate::asyncapi::Reception;
    fn start(self: Box<Self>, cx: StartContext) -> BoxFuture<'static, Result<JoinHandle<()>>>;
    /// The same subscriber bound to an in-process broker instead (tests).
    #[cfg(feature = "testing")]
    fn rebind(self: Box<Self>, broker: crate::MemoryBroker) -> Box<dyn StartUnit>;
}

#[cfg(feature = "asyncapi")]
fn reception<B: Broker, S: Subscriber>(
    broker: &B,
    subscriber: &S,
    config: &SubscriberConfig,
) -> crate::asyncapi::Reception {
    crate::asyncapi::Reception {
        handler: subscriber.name(),
        subject: config.subject.to_string(),
        queue_group: config.queue_group.as_ref().map(ToString::to_string),
        dead_letter: config.dead_letter.as_ref().map(ToString::to_string),
        server: crate::asyncapi::Server {
            broker: broker.name(),
            host: broker.host(),
        },
        types: subscriber
            .message_types()
            .with_content_types(subscriber.content_type(), subscriber.reply_content_type()),
    }
}

/// A subscriber bound to its broker (opaque; made by [`IntoSubscriber`]).
#[doc(hidden)]
pub struct BoundSubscriber(pub(crate) Box<dyn StartUnit>);

/// Subscribes, registers a request/reply source's receive-flow switch with
/// the job queue (it gets the current pressure state first), and
/// builds the shared [`Unit`].
async fn open<B: Broker, S: Subscriber>(
    broker: B,
    subscriber: Arc<S>,
    service: Option<HandlerService>,
    traced: bool,
    config: SubscriberConfig,
    cx: StartContext,
) -> Result<Opened<B, S>> {
    // JQ-17: a request/reply source joins in the current pressure state;
    // registering its switch below applies the state again, in case it
    // changed since.
    let mut options = config.subscribe_options();
    options.start_paused =
        options.receive_flow && cx.app.jobs().pressure().state == PressureState::Paused;
    let mut subscription = broker.subscribe(options).await?;
    subscription.use_job_queue(cx.app.jobs());
    let registration = subscription
        .receive_flow()
        .map(|flow| cx.app.jobs().register(flow));
    // The default loop alone counts its acks, one delivery after another.
    let one_counter =
        config.mode == Mode::Sequential && config.batch.is_none() && service.is_none();
    let metrics = Arc::new(crate::metrics::UnitMetrics::new(
        cx.app.metrics().app(),
        subscriber.name(),
        config.subject(),
        one_counter,
    ));
    cx.app.metrics().add(&metrics);
    let unit = Unit {
        after_ack: cx.app.has_after_ack(),
        metrics,
        traced,
        broker,
        subscriber,
        config,
        service,
        layers: cx.layers,
        app: cx.app,
        abort: cx.abort,
    };
    Ok(Opened {
        unit,
        subscription,
        stop: cx.stop,
        registration,
    })
}

/// A subscribed unit, ready for its loop.
struct Opened<B: Broker, S> {
    unit: Unit<B, S>,
    subscription: B::Subscription,
    stop: Stop,
    registration: Option<SourceRegistration>,
}

/// Runs a loop, then takes its source out of the receive registry. (A
/// binding's switch ignores transitions that race the close.)
fn spawn_loop(
    registration: Option<SourceRegistration>,
    run: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        run.await;
        drop(registration);
    })
}

/// A subscriber whose handler future is `Send`: every mode.
struct SendUnit<B, S> {
    broker: B,
    subscriber: S,
    config: SubscriberConfig,
}

impl<B: Broker, S: SendSubscriber> StartUnit for SendUnit<B, S> {
    fn config(&self) -> &SubscriberConfig {
        &self.config
    }

    #[cfg(feature = "config")]
    fn config_mut(&mut self) -> &mut SubscriberConfig {
        &mut self.config
    }

    fn requires(&self) -> (&'static str, Vec<StateKey>) {
        (self.subscriber.name(), self.subscriber.required_state())
    }

    fn refusal(&self) -> Result<()> {
        if self.config.batch.is_some() {
            refuse_middleware(&self.config, BATCH)?;
        }
        Ok(())
    }

    fn broker_name(&self) -> &'static str {
        Broker::name(&self.broker)
    }

    #[cfg(feature = "asyncapi")]
    fn reception(&self) -> crate::asyncapi::Reception {
        reception(&self.broker, &self.subscriber, &self.config)
    }

    #[cfg(feature = "testing")]
    fn rebind(self: Box<Self>, broker: crate::MemoryBroker) -> Box<dyn StartUnit> {
        Box::new(SendUnit {
            broker,
            subscriber: self.subscriber,
            config: self.config,
        })
    }

    fn start(self: Box<Self>, cx: StartContext) -> BoxFuture<'static, Result<JoinHandle<()>>> {
        Box::pin(async move {
            self.refusal()?;
            let mode = self.config.mode;
            let batch = self.config.batch.is_some();
            if batch {
                warn_app_middleware(&self.config, &cx, BATCH);
            }
            let subscriber = Arc::new(self.subscriber);
            let middleware: Vec<SharedMiddleware> = if batch {
                Vec::new()
            } else {
                (cx.middleware.iter())
                    .chain(&self.config.middleware)
                    .cloned()
                    .collect()
            };
            // Timed and traced handlers take the stack path, which reads
            // the clock and runs in the delivery's span.
            let traced = crate::spans::enabled();
            let service = stack::stack(
                &subscriber,
                &middleware,
                traced || crate::metrics::timings_on(),
            );
            let Opened {
                unit,
                subscription: sub,
                stop,
                registration: reg,
            } = open(self.broker, subscriber, service, traced, self.config, cx).await?;
            Ok(match mode {
                Mode::Sequential if batch => spawn_loop(reg, exec::batch::run(unit, sub, stop)),
                Mode::Sequential => spawn_loop(reg, exec::sequential::run(unit, sub, stop)),
                Mode::Workers { n, by_key: false } => {
                    spawn_loop(reg, exec::workers::run(Arc::new(unit), sub, stop, n))
                }
                Mode::Workers { n, by_key: true } => {
                    spawn_loop(reg, exec::by_key::run(Arc::new(unit), sub, stop, n))
                }
                Mode::Threads { n, by_key } => spawn_loop(
                    reg,
                    exec::threads::run(Arc::new(unit), sub, stop, n, by_key),
                ),
            })
        })
    }
}

/// A mode whose handlers take no middleware, and why: middleware wraps one
/// `Send` handler call per delivery. A subscriber's own on such a mode is a
/// startup error (and a `check` error); the app's skips it, with a warning.
type NoMiddleware = (&'static str, &'static str);

const BATCH: NoMiddleware = ("batch(..)", "they take whole batches, not one delivery");
const THREADS: NoMiddleware = (
    "threads(n)",
    "their futures may be `!Send`: use `workers(n)`",
);

/// A subscriber's own middleware on a mode that takes none is a mistake.
fn refuse_middleware(config: &SubscriberConfig, (mode, why): NoMiddleware) -> Result<()> {
    if config.middleware.is_empty() {
        return Ok(());
    }
    Err(crate::Error::Config(format!(
        "subscriber `{}` runs on `{mode}`, whose handlers take no middleware \
         ({why}); remove `.middleware(..)`",
        config.subject
    )))
}

/// The app's middleware passes such a subscriber by: said once, at start.
fn warn_app_middleware(config: &SubscriberConfig, cx: &StartContext, (mode, why): NoMiddleware) {
    if !cx.middleware.is_empty() {
        tracing::warn!(
            subject = %config.subject,
            "the app's middleware does not wrap `{mode}` subscribers ({why})"
        );
    }
}

/// A subscriber whose handler future may be `!Send`: dedicated threads only.
struct LocalUnit<B, S> {
    broker: B,
    subscriber: S,
    config: SubscriberConfig,
}

impl<B: Broker, S: Subscriber> StartUnit for LocalUnit<B, S> {
    fn config(&self) -> &SubscriberConfig {
        &self.config
    }

    #[cfg(feature = "config")]
    fn config_mut(&mut self) -> &mut SubscriberConfig {
        &mut self.config
    }

    fn requires(&self) -> (&'static str, Vec<StateKey>) {
        (self.subscriber.name(), self.subscriber.required_state())
    }

    fn refusal(&self) -> Result<()> {
        if !matches!(self.config.mode, Mode::Threads { .. }) {
            return Err(crate::Error::Config(format!(
                "subscriber `{}` has a `!Send` handler: it can only run on `threads(n)`",
                self.config.subject
            )));
        }
        refuse_middleware(&self.config, THREADS)
    }

    fn broker_name(&self) -> &'static str {
        Broker::name(&self.broker)
    }

    #[cfg(feature = "asyncapi")]
    fn reception(&self) -> crate::asyncapi::Reception {
        reception(&self.broker, &self.subscriber, &self.config)
    }

    #[cfg(feature = "testing")]
    fn rebind(self: Box<Self>, broker: crate::MemoryBroker) -> Box<dyn StartUnit> {
        Box::new(LocalUnit {
            broker,
            subscriber: self.subscriber,
            config: self.config,
        })
    }

    fn start(self: Box<Self>, cx: StartContext) -> BoxFuture<'static, Result<JoinHandle<()>>> {
        Box::pin(async move {
            self.refusal()?;
            let Mode::Threads { n, by_key } = self.config.mode else {
                unreachable!("refused above: a `!Send` handler runs on `threads(n)` only")
            };
            warn_app_middleware(&self.config, &cx, THREADS);
            let subscriber = Arc::new(self.subscriber);
            let traced = crate::spans::enabled();
            let opened = open(self.broker, subscriber, None, traced, self.config, cx).await?;
            Ok(spawn_loop(
                opened.registration,
                exec::threads::run(
                    Arc::new(opened.unit),
                    opened.subscription,
                    opened.stop,
                    n,
                    by_key,
                ),
            ))
        })
    }
}

/// What [`App::subscriber`](crate::App::subscriber) accepts: a `#[subscriber]`
/// function or a [`SendSubscriber`] value. `M` only tells the forms apart.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a subscriber",
    label = "expected a function annotated with `#[subscriber(...)]` or a `Subscriber` value",
    note = "annotate the handler with `#[subscriber(\"subject\")]` and pass the function itself: `.subscriber(my_handler)`"
)]
pub trait IntoSubscriber<M> {
    #[doc(hidden)]
    fn into_unit<B: Broker>(self, broker: B) -> BoundSubscriber;
}

#[doc(hidden)]
pub enum Direct {}

impl<S: SendSubscriber> IntoSubscriber<Direct> for S {
    fn into_unit<B: Broker>(self, broker: B) -> BoundSubscriber {
        send_unit(broker, self)
    }
}

fn send_unit<B: Broker, S: SendSubscriber>(broker: B, subscriber: S) -> BoundSubscriber {
    let config = subscriber.config();
    send_unit_with(broker, subscriber, config)
}

fn send_unit_with<B: Broker, S: SendSubscriber>(
    broker: B,
    subscriber: S,
    config: SubscriberConfig,
) -> BoundSubscriber {
    BoundSubscriber(Box::new(SendUnit {
        broker,
        subscriber,
        config,
    }))
}

fn local_unit<B: Broker, S: Subscriber>(broker: B, subscriber: S) -> BoundSubscriber {
    let config = subscriber.config();
    local_unit_with(broker, subscriber, config)
}

fn local_unit_with<B: Broker, S: Subscriber>(
    broker: B,
    subscriber: S,
    config: SubscriberConfig,
) -> BoundSubscriber {
    BoundSubscriber(Box::new(LocalUnit {
        broker,
        subscriber,
        config,
    }))
}

/// A subscriber whose configuration was changed before it was added (see
/// [`Configure::configure`]).
pub struct Configured<S, K> {
    subscriber: S,
    config: SubscriberConfig,
    _kind: std::marker::PhantomData<fn() -> K>,
}

/// Changes a subscriber's configuration where it is added: settings that
/// come from the environment or a file, with the same handler.
///
/// ```
/// use ruststream::prelude::*;
///
/// #[subscriber("orders", workers(2))]
/// async fn confirm(_order: Bytes) {}
///
/// let workers: usize = std::env::var("ORDER_WORKERS")
///     .ok()
///     .and_then(|n| n.parse().ok())
///     .unwrap_or(8);
/// let app = App::new()
///     .broker(MemoryBroker::new())
///     .subscriber(confirm.configure(|c| c.workers(workers).max_attempts(5)));
/// # drop(app);
/// ```
pub trait Configure<M>: Sized {
    /// The subscriber it stands for.
    #[doc(hidden)]
    type Subscriber;
    /// How it runs (`Send` futures, or dedicated threads only).
    #[doc(hidden)]
    type Kind;

    /// This subscriber with `change` applied to its configuration.
    fn configure(
        self,
        change: impl FnOnce(SubscriberConfig) -> SubscriberConfig,
    ) -> Configured<Self::Subscriber, Self::Kind>;
}

impl<S: SendSubscriber> Configure<Direct> for S {
    type Subscriber = S;
    type Kind = crate::__private::Pooled;

    fn configure(
        self,
        change: impl FnOnce(SubscriberConfig) -> SubscriberConfig,
    ) -> Configured<S, Self::Kind> {
        let config = change(self.config());
        Configured {
            subscriber: self,
            config,
            _kind: std::marker::PhantomData,
        }
    }
}

#[diagnostic::do_not_recommend]
impl<S: SendSubscriber> IntoSubscriber<Configured<(), crate::__private::Pooled>>
    for Configured<S, crate::__private::Pooled>
{
    fn into_unit<B: Broker>(self, broker: B) -> BoundSubscriber {
        send_unit_with(broker, self.subscriber, self.config)
    }
}

#[diagnostic::do_not_recommend]
impl<S: Subscriber> IntoSubscriber<Configured<(), crate::__private::Local>>
    for Configured<S, crate::__private::Local>
{
    fn into_unit<B: Broker>(self, broker: B) -> BoundSubscriber {
        local_unit_with(broker, self.subscriber, self.config)
    }
}

macro_rules! handler_fn {
    ($($arg:ident),+) => {
        impl<F, S, Fut, $($arg),+> IntoSubscriber<(Direct, fn($($arg),+))> for F
        where
            F: Fn($($arg),+) -> crate::__private::Handler<S, Fut, crate::__private::Pooled>,
            S: SendSubscriber + Default,
        {
            fn into_unit<B: Broker>(self, broker: B) -> BoundSubscriber {
                send_unit(broker, S::default())
            }
        }

        impl<F, S, Fut, $($arg),+> Configure<(Direct, fn($($arg),+))> for F
        where
            F: Fn($($arg),+) -> crate::__private::Handler<S, Fut, crate::__private::Pooled>,
            S: SendSubscriber + Default,
        {
            type Subscriber = S;
            type Kind = crate::__private::Pooled;

            fn configure(
                self,
                change: impl FnOnce(SubscriberConfig) -> SubscriberConfig,
            ) -> Configured<S, Self::Kind> {
                S::default().configure(change)
            }
        }

        impl<F, S, Fut, $($arg),+> Configure<(Local, fn($($arg),+))> for F
        where
            F: Fn($($arg),+) -> crate::__private::Handler<S, Fut, crate::__private::Local>,
            S: Subscriber + Default,
        {
            type Subscriber = S;
            type Kind = crate::__private::Local;

            fn configure(
                self,
                change: impl FnOnce(SubscriberConfig) -> SubscriberConfig,
            ) -> Configured<S, Self::Kind> {
                let subscriber = S::default();
                let config = change(subscriber.config());
                Configured {
                    subscriber,
                    config,
                    _kind: std::marker::PhantomData,
                }
            }
        }

        impl<F, S, Fut, $($arg),+> IntoSubscriber<(Local, fn($($arg),+))> for F
        where
            F: Fn($($arg),+) -> crate::__private::Handler<S, Fut, crate::__private::Local>,
            S: Subscriber + Default,
        {
            fn into_unit<B: Broker>(self, broker: B) -> BoundSubscriber {
                local_unit(broker, S::default())
            }
        }
    };
}

#[doc(hidden)]
pub enum Local {}

handler_fn!(A1);
handler_fn!(A1, A2);
handler_fn!(A1, A2, A3);
handler_fn!(A1, A2, A3, A4);
handler_fn!(A1, A2, A3, A4, A5);
handler_fn!(A1, A2, A3, A4, A5, A6);
handler_fn!(A1, A2, A3, A4, A5, A6, A7);
handler_fn!(A1, A2, A3, A4, A5, A6, A7, A8);
handler_fn!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
handler_fn!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
handler_fn!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
handler_fn!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);
handler_fn!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13);
handler_fn!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14);
handler_fn!(
    A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15
);
handler_fn!(
    A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, A16
);
