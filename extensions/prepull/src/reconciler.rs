//! The pair's reconciler: desired = the images the manifests name (by normalized reference), actual =
//! the images present in the runtime. An image named and absent is pulled; nothing is ever removed
//! (removing images is the image GC's job, and an image a manifest stops naming may be in use).

use std::collections::BTreeSet;

use reconcile_engine::{Operation, Plan, Reconciler, Update, View};

/// Desired: an image the manifests name, with the names of the manifests naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedImage {
    /// `metadata.name` of every manifest naming the image.
    pub manifests: BTreeSet<String>,
}

/// Actual: an image present in the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePresent {
    /// The runtime's image ID (`sha256:…`).
    pub id: String,
}

/// The pair's one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrepullOp {
    /// Pull the image (the key).
    Pull,
}

impl Operation for PrepullOp {
    fn kind(&self) -> &'static str {
        "pull"
    }
}

/// Pulls what is wanted and absent.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrepullReconciler;

impl Reconciler<WantedImage, ImagePresent> for PrepullReconciler {
    type Key = String;
    type Op = PrepullOp;
    type Inputs = ();

    fn reconcile(&self, v: &View<'_, String, WantedImage, ImagePresent>) -> Plan<PrepullOp> {
        match (v.desired, v.actual) {
            (Some(_), None) => Plan::Run(PrepullOp::Pull),
            _ => Plan::Idle,
        }
    }

    /// A pull whose result is unknown: take the image as absent; the next pass pulls it again (a pull of a
    /// present image is cheap).
    fn uncertain(
        &self,
        _key: &String,
        _op: &PrepullOp,
        _actual: Option<&ImagePresent>,
    ) -> Update<ImagePresent> {
        Update::Remove
    }
}
