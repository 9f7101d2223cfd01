//! nodelet's reconciled resources, one module per resource, each built the same way on
//! [`reconcile_engine`]:
//!
//! ```text
//! sources ─▶ desired (validated, defaulted) ─▶ reconciler ─▶ ops ─▶ driver trait ─▶ runtime
//!                                                 ▲                                   │
//!                                  actual ◀── completions and observations (PLEG) ◀───┘
//!                                    │
//!                                    ▼
//!                           status (v1 PodStatus), metrics
//! ```
//!
//! Start with [`pod`]: its module doc walks through the pod lifecycle.

#![deny(missing_docs)]

pub mod claim;
pub mod pod;
pub mod probe;

pub mod quantity;
pub mod volume;
