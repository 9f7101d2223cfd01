//! Keeps this node's CSINode object (storage.k8s.io/v1) in the API server equal to the CSI drivers
//! registered on the node ([`crate::csinode::csi_node`]), as the kubelet does: created once the Node
//! is registered (owned by it, so it goes with the Node), its drivers replaced whenever the set of
//! drivers changes, and checked again every minute. The Node authorizer lets a node manage its own
//! CSINode.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::node::NodeRef;

/// How often the object is checked even when no driver came or went.
const RESYNC: Duration = Duration::from_secs(60);
/// Wait after a failed write.
const RETRY: Duration = Duration::from_secs(5);

/// Writes the node's CSINode; run it with [`run`](Self::run).
pub(crate) struct CsiNodeSync {
    api: Api<CSINode>,
    registry: Arc<nodelet_csi::Registry>,
    registered: watch::Receiver<Option<NodeRef>>,
}

impl CsiNodeSync {
    /// A writer for the node that `registered` reports, with the drivers of `registry`.
    pub(crate) fn new(
        client: kube::Client,
        registry: Arc<nodelet_csi::Registry>,
        registered: watch::Receiver<Option<NodeRef>>,
    ) -> Self {
        Self { api: Api::all(client), registry, registered }
    }

    /// Keeps the object up to date until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut drivers = self.registry.subscribe();
        loop {
            let node = self.registered.borrow_and_update().clone();
            let wait = match node {
                None => None,
                Some(node) => match self.sync(&node).await {
                    Ok(()) => Some(RESYNC),
                    Err(e) => {
                        tracing::warn!(node = %node.name, error = %e, "cannot write the node's CSINode; retrying");
                        Some(RETRY)
                    }
                },
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = self.registered.changed() => if r.is_err() { return },
                r = drivers.changed() => if r.is_err() { return },
                () = async { match wait { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {}
            }
        }
    }

    async fn sync(&self, node: &NodeRef) -> Result<(), kube::Error> {
        let mut wanted = crate::csinode::csi_node(&node.name, &self.registry.drivers());
        wanted.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name.clone(),
            uid: node.uid.clone(),
            ..OwnerReference::default()
        }]);
        match self.api.get_opt(&node.name).await? {
            None => {
                self.api.create(&PostParams::default(), &wanted).await?;
                tracing::info!(node = %node.name, drivers = wanted.spec.drivers.len(), "created the node's CSINode");
            }
            Some(existing) if existing.spec.drivers != wanted.spec.drivers => {
                let mut updated = existing;
                updated.spec = wanted.spec;
                self.api.replace(&node.name, &PostParams::default(), &updated).await?;
                tracing::info!(node = %node.name, drivers = updated.spec.drivers.len(), "updated the node's CSINode");
            }
            Some(_) => {}
        }
        Ok(())
    }
}
