//! The populator: the only writer of the desired store. It reads the manifest directory every
//! `poll_interval` (and at start), and writes the union of the images the valid manifests name. A file that
//! is not a valid manifest is reported (log, status, metric) and ignored; the others still count. The desired
//! store is marked synced after the first read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reconcile_engine::{CancellationToken, Writer};

use crate::manifest::{self, ManifestError};
use crate::reconciler::WantedImage;

/// The files of the directory that are not valid manifests, by path, with why: shared with the status.
pub type Problems = Arc<Mutex<BTreeMap<PathBuf, String>>>;

/// Reads the manifests; see the [module docs](self).
#[derive(Debug)]
pub struct Populator {
    dir: PathBuf,
    poll_interval: Duration,
    writer: Writer<String, WantedImage>,
    problems: Problems,
    errors_gauge: prometheus::IntGauge,
}

impl Populator {
    /// A populator of `writer` from `dir`, reporting broken files into `problems` and `errors_gauge`.
    pub fn new(
        dir: PathBuf,
        poll_interval: Duration,
        writer: Writer<String, WantedImage>,
        problems: Problems,
        errors_gauge: prometheus::IntGauge,
    ) -> Self {
        Populator { dir, poll_interval, writer, problems, errors_gauge }
    }

    /// Reads the directory until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            self.read_once().await;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }

    /// One pass: read every manifest, replace the desired store's content, record the problems.
    pub async fn read_once(&mut self) {
        let (wanted, problems) = read_dir(&self.dir).await;
        let changed = self.writer.replace_all(wanted);
        if changed > 0 {
            tracing::debug!(dir = %self.dir.display(), changed, "pre-pull manifests changed");
        }
        self.writer.mark_synced();
        let mut known = self.problems.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (path, why) in &problems {
            if known.get(path) != Some(why) {
                tracing::warn!(file = %path.display(), error = %why, "ignoring an invalid pre-pull manifest");
            }
        }
        self.errors_gauge.set(i64::try_from(problems.len()).unwrap_or(i64::MAX));
        *known = problems;
    }
}

/// The images the valid manifests of `dir` name, and the invalid files with why. A missing directory is
/// one problem (nothing is wanted).
async fn read_dir(dir: &Path) -> (BTreeMap<String, WantedImage>, BTreeMap<PathBuf, String>) {
    let mut wanted: BTreeMap<String, WantedImage> = BTreeMap::new();
    let mut problems = BTreeMap::new();
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(e) => e,
        Err(e) => {
            problems.insert(dir.to_owned(), format!("cannot read the directory: {e}"));
            return (wanted, problems);
        }
    };
    let mut files = Vec::new();
    loop {
        match entries.next_entry().await {
            Ok(Some(entry)) => {
                let path = entry.path();
                let yaml = path.extension().is_some_and(|x| x == "yaml" || x == "yml");
                let hidden = entry.file_name().to_string_lossy().starts_with('.');
                if yaml && !hidden {
                    files.push(path);
                }
            }
            Ok(None) => break,
            Err(e) => {
                problems.insert(dir.to_owned(), format!("cannot list the directory: {e}"));
                break;
            }
        }
    }
    files.sort();
    for path in files {
        let parsed = match tokio::fs::read_to_string(&path).await {
            Ok(text) => manifest::parse(&text),
            Err(e) => Err(ManifestError::Parse(format!("cannot read: {e}"))),
        };
        match parsed {
            Ok(m) => {
                for image in m.images {
                    wanted
                        .entry(image)
                        .or_insert_with(|| WantedImage { manifests: Default::default() })
                        .manifests
                        .insert(m.name.clone());
                }
            }
            Err(e) => {
                problems.insert(path, e.to_string());
            }
        }
    }
    (wanted, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn valid_manifests_should_count_and_a_broken_one_should_only_be_reported() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).unwrap_or_else(|e| panic!("{e}"));
        };
        write(
            "a.yaml",
            "apiVersion: prepull.nodelet.io/v1alpha1\nkind: ImagePrepull\nmetadata: {name: a}\nspec: {images: [busybox]}\n",
        );
        write(
            "b.yml",
            "apiVersion: prepull.nodelet.io/v1alpha1\nkind: ImagePrepull\nmetadata: {name: b}\nspec: {images: ['busybox:latest', 'x.io/y:1']}\n",
        );
        write("broken.yaml", "kind: [");
        write("notes.txt", "not a manifest, not read");
        let (store, writer) = reconcile_engine::store();
        let problems = Problems::default();
        let gauge = prometheus::IntGauge::new("errors", "errors").unwrap_or_else(|e| panic!("{e}"));
        let mut p = Populator::new(
            dir.path().to_owned(),
            Duration::from_secs(1),
            writer,
            problems.clone(),
            gauge.clone(),
        );
        p.read_once().await;
        assert!(store.is_synced());
        let busybox = store.get(&"docker.io/library/busybox:latest".to_owned()).map(|w| w.manifests.clone());
        assert_eq!(busybox, Some(["a".to_owned(), "b".to_owned()].into()));
        assert!(store.contains_key(&"x.io/y:1".to_owned()));
        assert_eq!(store.len(), 2);
        let problems: Vec<PathBuf> =
            problems.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
        assert_eq!(problems, vec![dir.path().join("broken.yaml")]);
        assert_eq!(gauge.get(), 1);
    }
}
