//! A realistic reconciler: keep a directory's files equal to a desired map of name → content.
//!
//! The driver really writes files (atomically: temporary file, then rename), reconstructs what is
//! already in the directory at start-up (so stale files are removed and matching ones are left
//! alone), and misbehaves on purpose: every third write fails and one file's write hangs past
//! the operation timeout, so you can watch backoff, uncertain outcomes and retries happen.
//!
//! Run: `cargo run -p reconcile-engine --example files` (add `RUST_LOG=debug` for every step).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Encoder;
use reconcile_engine::{
    BackoffConfig, CancellationToken, Driver, Engine, Metrics, Operation, Outcome, Plan, Reconciler, Update,
    View,
};

/// What the actual store knows of a file.
#[derive(Clone, Debug, PartialEq)]
enum FileState {
    /// The file exists with this content.
    Present(String),
    /// A write may or may not have happened: rewrite or delete it, never assume it absent.
    Unknown,
}

#[derive(Clone, Debug, PartialEq)]
enum FileOp {
    Write(String),
    Remove,
}

impl Operation for FileOp {
    fn kind(&self) -> &'static str {
        match self {
            FileOp::Write(_) => "write",
            FileOp::Remove => "remove",
        }
    }

    fn is_teardown(&self) -> bool {
        matches!(self, FileOp::Remove)
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(300))
    }
}

struct FilesReconciler;

impl Reconciler<String, FileState> for FilesReconciler {
    type Key = String;
    type Op = FileOp;
    type Inputs = ();

    fn reconcile(&self, v: &View<'_, String, String, FileState>) -> Plan<FileOp> {
        match (v.desired, v.actual) {
            (Some(want), Some(FileState::Present(have))) if want == have => Plan::Idle,
            (Some(want), _) => Plan::Run(FileOp::Write(want.clone())),
            (None, Some(_)) => Plan::Run(FileOp::Remove),
            (None, None) => Plan::Idle,
        }
    }

    fn uncertain(&self, _key: &String, _op: &FileOp, _actual: Option<&FileState>) -> Update<FileState> {
        Update::Set(FileState::Unknown)
    }
}

#[derive(Debug, thiserror::Error)]
enum FileError {
    #[error("injected failure writing {0}")]
    Injected(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

struct FilesDriver {
    dir: PathBuf,
    writes: AtomicUsize,
    hung_once: Mutex<HashSet<String>>,
}

impl FilesDriver {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io { path: path.to_path_buf(), source }
}

impl Driver<String, FileOp, FileState> for FilesDriver {
    type Error = FileError;

    async fn execute(
        &self,
        name: &String,
        op: &FileOp,
        cancel: &CancellationToken,
    ) -> Outcome<FileState, FileError> {
        let path = self.path(name);
        match op {
            FileOp::Write(content) => {
                if self.writes.fetch_add(1, Ordering::Relaxed) % 3 == 2 {
                    return Outcome::Failed(FileError::Injected(name.clone()));
                }
                if name == "slow.txt"
                    && self.hung_once.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone())
                {
                    // Hangs past the 300 ms timeout: the engine records it as uncertain.
                    tokio::select! {
                        () = cancel.cancelled() => return Outcome::Failed(FileError::Injected(name.clone())),
                        () = tokio::time::sleep(Duration::from_secs(5)) => {}
                    }
                }
                let tmp = self.dir.join(format!(".{name}.tmp"));
                if let Err(e) = tokio::fs::write(&tmp, content).await.map_err(io(&tmp)) {
                    return Outcome::Failed(e);
                }
                match tokio::fs::rename(&tmp, &path).await.map_err(io(&path)) {
                    Ok(()) => Outcome::Done(Update::Set(FileState::Present(content.clone()))),
                    Err(e) => Outcome::Uncertain(e),
                }
            }
            FileOp::Remove => match tokio::fs::remove_file(&path).await {
                Ok(()) => Outcome::Done(Update::Remove),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Outcome::Done(Update::Remove),
                Err(e) => Outcome::Failed(io(&path)(e)),
            },
        }
    }

    async fn reconstruct(&self) -> Result<Vec<(String, FileState)>, FileError> {
        let mut found = Vec::new();
        let mut entries = tokio::fs::read_dir(&self.dir).await.map_err(io(&self.dir))?;
        while let Some(entry) = entries.next_entry().await.map_err(io(&self.dir))? {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let content = tokio::fs::read_to_string(entry.path()).await.map_err(io(&entry.path()))?;
            found.push((name, FileState::Present(content)));
        }
        Ok(found)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let dir = tempfile::tempdir()?;
    // Left over from "last time": one stale file, one that already matches.
    std::fs::write(dir.path().join("stale.txt"), "old")?;
    std::fs::write(dir.path().join("a.txt"), "alpha")?;

    let (desired, mut writer) = reconcile_engine::store::<String, String>();
    for (name, content) in
        [("a.txt", "alpha"), ("b.txt", "beta"), ("c.txt", "gamma"), ("slow.txt", "eventually")]
    {
        writer.insert(name.to_string(), content.to_string());
    }
    writer.mark_synced();

    let registry = prometheus::Registry::new();
    let metrics = Metrics::new(&registry)?;
    let driver = Arc::new(FilesDriver {
        dir: dir.path().to_path_buf(),
        writes: AtomicUsize::new(0),
        hung_once: Mutex::default(),
    });
    let engine = Engine::builder("files", FilesReconciler, driver, desired.clone())
        .metrics(&metrics)
        .backoff(BackoffConfig::default().with_initial(Duration::from_millis(50)))
        .build();
    let actual = engine.actual();
    let converged = async {
        while !reconcile_engine_converged(&desired, &actual) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let report = tokio::time::timeout(Duration::from_secs(30), engine.run(converged)).await?;
    println!("converged: {report:?}");

    let mut names: Vec<_> =
        std::fs::read_dir(dir.path())?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    names.sort();
    println!("directory now holds: {names:?}");
    let mut text = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut text)?;
    for line in
        String::from_utf8(text)?.lines().filter(|l| l.starts_with("reconcile_engine_operations_total"))
    {
        println!("{line}");
    }
    Ok(())
}

fn reconcile_engine_converged(
    desired: &reconcile_engine::Store<String, String>,
    actual: &reconcile_engine::Store<String, FileState>,
) -> bool {
    desired.len() == actual.len()
        && desired
            .entries()
            .iter()
            .all(|(k, v)| actual.get(k).as_deref() == Some(&FileState::Present(v.to_string())))
}
