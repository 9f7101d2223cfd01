//! A generic desired-state / actual-state reconciliation engine.
//!
//! You describe what should exist (the **desired** state), a [`Driver`] reports and changes what
//! does exist (the **actual** state), and a [`Reconciler`] — a plain synchronous function —
//! compares the two for one key at a time and plans an [`Operation`]. The engine runs the plan
//! through an [`Executor`] that keeps at most one operation in flight per key, backs off per key
//! after failures, times operations out, cancels the ones desired state no longer wants, and
//! bounds concurrency. Only completions (and start-up reconstruction, and what an [`Observer`]
//! reports) write the actual state.
//!
//! ```text
//!  your source ──▶ Writer<K, D> ──▶ desired Store<K, D> ──┐ changed keys
//!  (populator)                                            ▼
//!                                      Reconciler::reconcile(View) ──▶ Plan::Run(op)
//!                                            ▲                                │
//!                          actual Store<K, A>│                                ▼
//!                                            │            Executor (per key: one in flight,
//!                          Update<A> ◀── Outcome ◀──────── backoff, timeout, cancel) ──▶ Driver
//!                                                                                  (the world)
//! ```
//!
//! # Start here
//! 1. Create the desired store with [`store()`]; keep its [`Writer`] in your populator.
//! 2. Implement [`Reconciler`] (two methods, and `type Inputs = ()` until it reads other pairs'
//!    stores) and [`Driver`] (one method; [`Driver::reconstruct`]
//!    to recover state after a restart).
//! 3. Build an [`Engine`] with [`Engine::builder`], take what you need from it (its
//!    [`actual`](Engine::actual) store, an [`observer`](Engine::observer)), and spawn
//!    [`run`](Engine::run), which consumes the engine, with a shutdown future. Metrics go to a
//!    [`prometheus::Registry`][Registry] through [`Metrics`].
//! 4. If the reconciler depends on another pair, make its stores the reconciler's
//!    [`Inputs`](Reconciler::Inputs) (given to [`build_with`](EngineBuilder::build_with)) and
//!    declare on the builder what plans keys again ([`watches`](EngineBuilder::watches)) or what
//!    must have loaded first ([`waits_for`](EngineBuilder::waits_for)).
//! 5. If the world changes without operations (a process dies), report it through an
//!    [`Observer`].
//!
//! The [`guide`] explains each part of the program below and what the engine does around it
//! (outcomes and backoff, cancellation, observations, when a key is planned again, testing).
//! `examples/minimal.rs` fits on one screen; `examples/files.rs` keeps a directory equal to a
//! desired map with a driver that fails and times out.
//!
//! # A complete program
//!
//! It keeps an in-memory "world" equal to a desired map: the stores, a reconciler, a driver, the
//! engine run on its own task until a shutdown future completes, desired state fed and actual
//! state read, and the metrics printed. Its dependencies: `reconcile-engine`, `tokio` (features
//! `rt-multi-thread`, `macros`, `sync`, `time`) and `prometheus` 0.14 (see the [`guide`]).
//!
//! <!-- complete example: main.rs -->
//! ```rust
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//!
//! use reconcile_engine::{
//!     CancellationToken, Driver, Engine, Metrics, Operation, Outcome, Plan, Reconciler, Store,
//!     Update, View,
//! };
//!
//! /// The actual value of a key: what the world holds, or "unknown" after an uncertain write.
//! #[derive(Clone, Debug, PartialEq)]
//! enum Entry {
//!     Present(String),
//!     Unknown,
//! }
//!
//! /// The operations: data that the driver carries out.
//! #[derive(Clone, Debug, PartialEq)]
//! enum Op {
//!     Write(String),
//!     Remove,
//! }
//!
//! impl Operation for Op {
//!     fn kind(&self) -> &'static str {
//!         match self {
//!             Op::Write(_) => "write",
//!             Op::Remove => "remove",
//!         }
//!     }
//!
//!     fn is_teardown(&self) -> bool {
//!         matches!(self, Op::Remove)
//!     }
//! }
//!
//! /// The reconciler: a pure function from one key's desired and actual values to a plan.
//! struct Mirror;
//!
//! impl Reconciler<String, Entry> for Mirror {
//!     type Key = String;
//!     type Op = Op;
//!     type Inputs = ();
//!
//!     fn reconcile(&self, v: &View<'_, String, String, Entry>) -> Plan<Op> {
//!         match (v.desired, v.actual) {
//!             (Some(want), Some(Entry::Present(have))) if want == have => Plan::Idle,
//!             (Some(want), _) => Plan::Run(Op::Write(want.clone())),
//!             (None, Some(_)) => Plan::Run(Op::Remove),
//!             (None, None) => Plan::Idle,
//!         }
//!     }
//!
//!     fn uncertain(&self, _key: &String, _op: &Op, _actual: Option<&Entry>) -> Update<Entry> {
//!         Update::Set(Entry::Unknown) // the next pass writes or removes it again
//!     }
//! }
//!
//! /// The driver: the only code that touches the world (here a map in memory).
//! struct World {
//!     entries: Mutex<HashMap<String, String>>,
//! }
//!
//! impl Driver<String, Op, Entry> for World {
//!     type Error = std::io::Error;
//!
//!     async fn execute(
//!         &self,
//!         key: &String,
//!         op: &Op,
//!         _cancel: &CancellationToken,
//!     ) -> Outcome<Entry, Self::Error> {
//!         let Ok(mut entries) = self.entries.lock() else {
//!             return Outcome::Failed(std::io::Error::other("the world's lock is poisoned"));
//!         };
//!         match op {
//!             Op::Write(value) => {
//!                 entries.insert(key.clone(), value.clone());
//!                 Outcome::Done(Update::Set(Entry::Present(value.clone())))
//!             }
//!             Op::Remove => {
//!                 entries.remove(key);
//!                 Outcome::Done(Update::Remove)
//!             }
//!         }
//!     }
//!
//!     /// What exists already when the engine starts, before anything is planned.
//!     async fn reconstruct(&self) -> Result<Vec<(String, Entry)>, Self::Error> {
//!         let entries = self
//!             .entries
//!             .lock()
//!             .map_err(|_| std::io::Error::other("the world's lock is poisoned"))?;
//!         Ok(entries.iter().map(|(k, v)| (k.clone(), Entry::Present(v.clone()))).collect())
//!     }
//! }
//!
//! /// Whether `actual` holds exactly the entries of `want`.
//! fn converged(actual: &Store<String, Entry>, want: &[(&str, &str)]) -> bool {
//!     actual.len() == want.len()
//!         && want.iter().all(|&(key, value)| {
//!             actual.get(&key.to_owned()).as_deref() == Some(&Entry::Present(value.to_owned()))
//!         })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // The world as the engine finds it: one entry that nobody wants any more.
//!     let world =
//!         Arc::new(World { entries: Mutex::new(HashMap::from([("stale".into(), "old".into())])) });
//!
//!     // The desired store: the engine reads it, your populator keeps its single writer.
//!     let (desired, mut writer) = reconcile_engine::store::<String, String>();
//!
//!     // The engine, with its metrics in a registry you serve.
//!     let registry = prometheus::Registry::new();
//!     let metrics = Metrics::new(&registry)?;
//!     let engine = Engine::builder("mirror", Mirror, world, desired).metrics(&metrics).build();
//!     let actual = engine.actual(); // take readers before `run`: it consumes the engine
//!
//!     // Run it on its own task until `stop` is cancelled.
//!     let stop = CancellationToken::new();
//!     let running = tokio::spawn(engine.run(stop.clone().cancelled_owned()));
//!
//!     // Feed desired state, then say it is complete: only then may teardown ("stale") run.
//!     writer.insert("greeting".into(), "hello".into());
//!     writer.insert("target".into(), "world".into());
//!     writer.mark_synced();
//!
//!     // Read actual state: wait until it matches the desired state.
//!     let want = [("greeting", "hello"), ("target", "world")];
//!     let changes = actual.subscribe();
//!     tokio::time::timeout(Duration::from_secs(10), async {
//!         while !converged(&actual, &want) {
//!             changes.changed().await;
//!             changes.drain();
//!         }
//!     })
//!     .await?;
//!     for (key, value) in actual.entries() {
//!         println!("{key} = {value:?}");
//!     }
//!
//!     // Stop: `run` lets running operations finish (within the shutdown deadline) and reports.
//!     stop.cancel();
//!     let report = running.await?;
//!     println!("operations: {}, found at start-up: {}", report.operations, report.reconstructed);
//!     assert_eq!(report.reconstructed, 1);
//!
//!     // The metrics in Prometheus' text format (what a /metrics endpoint serves).
//!     let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather())?;
//!     print!("{text}");
//!     assert!(text.contains(
//!         r#"reconcile_engine_operations_total{kind="remove",reconciler="mirror",result="done"} 1"#
//!     ));
//!     Ok(())
//! }
//! ```
//!
//! # Guarantees
//! - **One operation per key.** Never two at once on a key, nor on a key and its ancestor (see
//!   [`Key::parent`]). A request for a busy key is coalesced (the latest wins) and runs after the
//!   current one; it is never lost.
//! - **Backoff per key**, exponential with jitter ([`BackoffConfig`], kubelet-like defaults),
//!   reset on success and when the kind of operation for the key changes.
//! - **Tri-state outcomes.** [`Outcome::Done`], [`Outcome::Failed`] (nothing changed), and
//!   [`Outcome::Uncertain`] (timed out or unknown): the reconciler records uncertainty and plans
//!   cleanup; nothing is assumed absent.
//! - **Cancellation.** When a re-plan no longer asks for the running operation, its
//!   [`CancellationToken`] fires. An [`Outcome::Failed`] returned after that counts as
//!   `result="cancelled"` and is no failure: no backoff, no [`OpStatus`].
//! - **Incremental** planning of changed keys only, plus a periodic full resync: [`Engine`] lists
//!   every way a key is planned again.
//! - **Safe start-up.** The driver reconstructs what exists before anything is planned, and
//!   teardown waits until the desired store has synced once ([`Writer::mark_synced`]).
//! - **Graceful shutdown** with a deadline.
//! - **Observations.** Changes of the world that no operation made (a process died) reach the
//!   actual store through an [`Observer`] (a PLEG-style relist); observations made before the
//!   key's last completion (a tie keeps the observation), or handled while an operation runs on
//!   it, are dropped.
//! - **Typed side inputs, relations and gates.** A reconciler reads other pairs' stores,
//!   read-only, through its [`View`]: its own [`Reconciler::Inputs`] type, given to
//!   [`EngineBuilder::build_with`], so an input cannot be left out. A relation
//!   ([`EngineBuilder::watches`]) maps every change of such a store, deletions included, to keys
//!   the engine plans again, coalesced and without polling; a gate ([`EngineBuilder::waits_for`])
//!   holds all planning until a store has loaded. A source that is not a store (a registry of
//!   plugins) is copied into one by a small task of its own, and watched like any other.
//! - **Time from the view.** [`View::now`] (tokio's clock) and [`View::wall`] (a [`WallClock`],
//!   the system clock unless [`EngineBuilder::wall_clock`] gives another): reconcilers read no
//!   clock of their own, so tests on paused time cover their decisions on time.
//! - **Status.** [`Engine::op_status`] shows, per key, the last failed operation, its error and
//!   when it retries.
//! - **Observability.** Prometheus metrics per reconciler ([`metrics`] lists them; print them
//!   with [`prometheus::TextEncoder`][TextEncoder], as above) and a `tracing` span `operation`
//!   with `op.kind` and `op.key` around every operation.
//!
//! With the `testing` feature, [`testing`] offers a recording fake driver with scripted faults,
//! an overlap checker and paused-time helpers.
//!
//! [Registry]: https://docs.rs/prometheus/0.14/prometheus/struct.Registry.html
//! [TextEncoder]: https://docs.rs/prometheus/0.14/prometheus/struct.TextEncoder.html

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod clock;
mod driver;
mod engine;
pub mod executor;
mod key;
pub mod metrics;
mod reconciler;
mod relation;
mod store;
mod timers;

// Documented with or without the feature, so that the docs and the guide can link to it.
#[cfg(any(feature = "testing", doc))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

#[doc = include_str!("../docs/guide.md")]
pub mod guide {}

pub use backoff::BackoffConfig;
pub use clock::{WallClock, from_unix_nanos, unix_nanos};
pub use driver::{Driver, Outcome};
pub use engine::{Engine, EngineBuilder, EngineConfig, Observer, OpStatus, RunReport};
pub use executor::{Executor, ExecutorConfig, OpError, Submitted};
pub use key::Key;
pub use metrics::{Metrics, OpResult};
pub use reconciler::{Operation, Plan, Reconciler, Update, View};
pub use store::{Store, Subscription, SyncWatch, Writer, WriterDropped, store};
pub use tokio_util::sync::CancellationToken;

/// Hash maps and sets of the engine's internals: a fast keyed hasher (keys are hashed many times
/// per operation), still randomly seeded against collision attacks.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
pub(crate) type Set<K> = std::collections::HashSet<K, ahash::RandomState>;
