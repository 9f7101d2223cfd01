//! nodelet's own pairs assembled as [`Extension`](super::Extension)s: `super::topology` starts each through
//! [`Extension::start`](super::Extension::start) with the same [`ExtensionContext`](super::ExtensionContext)
//! a third-party extension is given, at the pair's place in the start order, so the node itself proves the
//! extension API. One module per pair: [`images`] (image garbage collection) and [`eviction`] (the
//! eviction pair and the verdict populator).

pub(crate) mod eviction;
pub(crate) mod images;
