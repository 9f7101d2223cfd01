//! A generic desired-state / actual-state reconciliation engine.
//!
//! You describe what should exist (the **desired** state), a [`Driver`] reports and changes what
//! does exist (the **actual** state), and a [`Reconciler`] — a plain synchronous function —
//! compares the two for one key at a time and plans an [`Operation`]. The engine runs the plan
//! through an [`Executor`] that keeps at most one operation in flight per key, backs off per key
//! after failures, times operations out, cancels the ones desired state no longer wants, and
//! bounds concurrency. Only completions (and start-up reconstruction, and observations a driver
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
//! 2. Implement [`Reconciler`] (two methods) and [`Driver`] (one method; [`Driver::reconstruct`]
//!    to recover state after a restart).
//! 3. Build an [`Engine`] with [`Engine::builder`] and [`run`](Engine::run) it. Read the actual
//!    state through [`Engine::actual`], metrics through [`Metrics`].
//! 4. If the reconciler depends on another pair, declare it on the builder
//!    ([`reads`](EngineBuilder::reads), [`watches`](EngineBuilder::watches)).
//!
//! The [`guide`] walks through a complete reconciler; `examples/minimal.rs` fits on one screen and
//! `examples/files.rs` keeps a directory equal to a desired map with a driver that fails and
//! times out.
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
//!   [`CancellationToken`] fires.
//! - **Incremental** planning of changed keys only, plus a periodic full resync.
//! - **Safe start-up.** The driver reconstructs what exists before anything is planned, and
//!   teardown waits until the desired store has synced once ([`Writer::mark_synced`]).
//! - **Graceful shutdown** with a deadline.
//! - **Observations.** Changes of the world that no operation made (a process died) reach the
//!   actual store through an [`Observer`] (a PLEG-style relist); observations older than the
//!   key's last completion, or made while an operation runs on it, are dropped.
//! - **Relations and side inputs.** A reconciler reads other pairs' stores, read-only, through
//!   its [`View`] ([`View::input`], registered with [`EngineBuilder::reads`]); a relation
//!   ([`EngineBuilder::watches`]) maps every change of such a store, deletions included, to keys
//!   the engine plans again, coalesced and without polling. A [`Waker`] plans a key again for
//!   sources that are not stores.
//! - **Status.** [`Engine::op_status`] shows, per key, the last failed operation, its error and
//!   when it retries.
//! - **Observability.** Prometheus metrics per reconciler ([`metrics`] lists them) and a
//!   `tracing` span `operation` with `op.kind` and `op.key` around every operation.
//!
//! With the `testing` feature, [`testing`] offers a recording fake driver with scripted faults,
//! an overlap checker and paused-time helpers.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod driver;
mod engine;
pub mod executor;
mod key;
pub mod metrics;
mod reconciler;
mod relation;
mod store;

#[cfg(feature = "testing")]
pub mod testing;

#[doc = include_str!("../docs/guide.md")]
pub mod guide {}

pub use backoff::BackoffConfig;
pub use driver::{Driver, Outcome};
pub use engine::{Engine, EngineBuilder, EngineConfig, Observer, OpStatus, RunReport, Waker};
pub use executor::{Executor, ExecutorConfig, OpError, Submitted};
pub use key::Key;
pub use metrics::{Metrics, OpResult};
pub use reconciler::{Operation, Plan, Reconciler, Update, View};
pub use relation::Inputs;
pub use store::{Store, Subscription, SyncWatch, Writer, WriterDropped, store};
pub use tokio_util::sync::CancellationToken;

/// Hash maps and sets of the engine's internals: a fast keyed hasher (keys are hashed many times
/// per operation), still randomly seeded against collision attacks.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
pub(crate) type Set<K> = std::collections::HashSet<K, ahash::RandomState>;
