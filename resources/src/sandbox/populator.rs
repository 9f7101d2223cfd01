//! The sandbox populator: writes the desired sandbox of every desired pod.

use reconcile_engine::{CancellationToken, Store, Writer};

use super::desired::SandboxSpec;
use crate::model::actual::PodActual;
use crate::model::pod::{DesiredPod, PodUid};

/// Keeps the desired sandbox store equal to one [`SandboxSpec`] per desired pod.
#[derive(Debug)]
pub struct SandboxPopulator {
    pods: Store<PodUid, DesiredPod>,
    pod_actual: Store<PodUid, PodActual>,
    writer: Writer<PodUid, SandboxSpec>,
}

impl SandboxPopulator {
    /// A populator from the desired pods `pods` into `writer`. `pod_actual` is the pod engine's
    /// actual store: the sandbox store counts as synced only once it has been reconstructed, so
    /// the sandbox reconciler never decides on a pod's containers before they are known.
    pub fn new(
        pods: Store<PodUid, DesiredPod>,
        pod_actual: Store<PodUid, PodActual>,
        writer: Writer<PodUid, SandboxSpec>,
    ) -> Self {
        Self { pods, pod_actual, writer }
    }

    /// Writes every desired pod's sandbox (and drops the others); returns how many changed.
    pub fn sync(&mut self) -> usize {
        let all: Vec<(PodUid, SandboxSpec)> =
            self.pods.entries().into_iter().map(|(uid, pod)| (uid, SandboxSpec::of(pod))).collect();
        self.writer.replace_all(all)
    }

    fn update(&mut self, uid: PodUid) {
        match self.pods.get(&uid) {
            Some(pod) => {
                self.writer.upsert(uid, SandboxSpec::of(pod));
            }
            None => {
                self.writer.remove(&uid);
            }
        }
    }

    /// Populates until `shutdown`: once the pod engine's reconstruction is complete, then on every
    /// change of the desired pods. The sandbox store counts as synced once the pod sources have all
    /// reported too; until then the reconciler only creates sandboxes (a static pod starts while the
    /// API server is out of reach, as with the kubelet) and never stops or removes one.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let sub = self.pods.subscribe();
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = self.pod_actual.wait_until_synced() => {}
        }
        let mut changed = self.sync();
        let mut synced = false;
        loop {
            if !synced && self.pods.is_synced() {
                changed += self.sync();
                self.writer.mark_synced();
                synced = true;
                tracing::debug!(changed, sandboxes = self.writer.reader().len(), "desired sandboxes synced");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = sub.changed() => {}
                _ = self.pods.wait_until_synced(), if !synced => {}
            }
            for uid in sub.drain() {
                self.update(uid);
            }
        }
    }
}
