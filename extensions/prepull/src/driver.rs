//! The pair's driver: pulls images through an [`ImageService`] (the CRI image service in production,
//! [`CriImages`]; a fake in unit tests) and reports which are present.

use std::collections::BTreeMap;
use std::future::Future;

use reconcile_engine::{CancellationToken, Driver, Outcome, Update};

use crate::reconciler::{ImagePresent, PrepullOp};

/// What the pair needs of an image service.
pub trait ImageService: Send + Sync + 'static {
    /// The service's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Pulls `image`; returns the image ID the runtime stored.
    fn pull(&self, image: &str) -> impl Future<Output = Result<String, Self::Error>> + Send;
    /// Every reference (tags and digests) of every image present, with its image ID.
    fn list(&self) -> impl Future<Output = Result<BTreeMap<String, String>, Self::Error>> + Send;
}

/// The CRI image service of the node's container runtime (`PullImage`, `ListImages`).
#[derive(Debug, Clone)]
pub struct CriImages(pub nodelet_cri::CriClient);

impl ImageService for CriImages {
    type Error = nodelet_cri::CriError;

    async fn pull(&self, image: &str) -> Result<String, Self::Error> {
        self.0.pull_image(image, None, None).await?;
        // The image ID (what ListImages reports), not the reference PullImage returns.
        Ok(self.0.image_status(image).await?.map(|i| i.id).unwrap_or_default())
    }

    async fn list(&self) -> Result<BTreeMap<String, String>, Self::Error> {
        let mut present = BTreeMap::new();
        for image in self.0.list_images(None).await? {
            for reference in image.repo_tags.iter().chain(&image.repo_digests) {
                present.insert(reference.clone(), image.id.clone());
            }
        }
        Ok(present)
    }
}

/// The engine's driver over an [`ImageService`].
#[derive(Debug)]
pub struct PrepullDriver<S>(pub S);

impl<S: ImageService> Driver<String, PrepullOp, ImagePresent> for PrepullDriver<S> {
    type Error = S::Error;

    /// A pull is not cut short when the manifest no longer names the image: the image it stores is
    /// harmless (the image GC may remove it) and a half-pulled one would only waste the transfer.
    async fn execute(
        &self,
        key: &String,
        op: &PrepullOp,
        _cancel: &CancellationToken,
    ) -> Outcome<ImagePresent, S::Error> {
        match op {
            PrepullOp::Pull => match self.0.pull(key).await {
                Ok(id) => {
                    tracing::info!(image = %key, %id, "pre-pulled image");
                    Outcome::Done(Update::Set(ImagePresent { id }))
                }
                Err(e) => Outcome::Failed(e),
            },
        }
    }

    /// The images present at start: nothing is pulled again.
    async fn reconstruct(&self) -> Result<Vec<(String, ImagePresent)>, S::Error> {
        Ok(self.0.list().await?.into_iter().map(|(r, id)| (r, ImagePresent { id })).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::reconciler::{PrepullReconciler, WantedImage};
    use reconcile_engine::{BackoffConfig, Engine};

    #[derive(Debug, thiserror::Error)]
    #[error("registry unreachable")]
    struct Unreachable;

    /// Present images; fails the first `fail` pulls.
    #[derive(Debug, Default)]
    struct FakeImages {
        present: Mutex<BTreeMap<String, String>>,
        pulls: Mutex<Vec<String>>,
        fail: Mutex<u32>,
    }

    impl ImageService for Arc<FakeImages> {
        type Error = Unreachable;
        async fn pull(&self, image: &str) -> Result<String, Unreachable> {
            self.pulls.lock().unwrap_or_else(|e| e.into_inner()).push(image.to_owned());
            let mut fail = self.fail.lock().unwrap_or_else(|e| e.into_inner());
            if *fail > 0 {
                *fail -= 1;
                return Err(Unreachable);
            }
            self.present
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(image.to_owned(), "sha256:1".into());
            Ok("sha256:1".into())
        }
        async fn list(&self) -> Result<BTreeMap<String, String>, Unreachable> {
            Ok(self.present.lock().unwrap_or_else(|e| e.into_inner()).clone())
        }
    }

    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_wanted_image_should_be_pulled_once_after_a_failure_and_present_ones_never() {
        let fake = Arc::new(FakeImages::default());
        fake.present
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert("x.io/have:1".into(), "sha256:0".into());
        *fake.fail.lock().unwrap_or_else(|e| e.into_inner()) = 1;
        let (desired, mut writer) = reconcile_engine::store();
        for image in ["x.io/have:1", "x.io/want:1"] {
            writer.insert(image.to_owned(), WantedImage { manifests: ["m".to_owned()].into() });
        }
        writer.mark_synced();
        let engine =
            Engine::builder("prepull", PrepullReconciler, Arc::new(PrepullDriver(fake.clone())), desired)
                .backoff(
                    BackoffConfig::default()
                        .with_initial(Duration::from_secs(1))
                        .with_max(Duration::from_secs(2)),
                )
                .build();
        let actual = engine.actual();
        let stop = async move {
            while !actual.contains_key(&"x.io/want:1".to_owned()) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), engine.run(stop))
            .await
            .unwrap_or_else(|e| panic!("not converged: {e}"));
        let pulls = fake.pulls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(pulls, vec!["x.io/want:1".to_owned(), "x.io/want:1".to_owned()], "one failure, one retry");
    }
}
