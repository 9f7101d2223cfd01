//! The file source (`--pod-manifest-path`, `staticPodPath`): static pods from a directory of
//! manifests, or from one manifest file.
//!
//! - **What is read.** Every regular file directly in the directory (symbolic links are
//!   followed; subdirectories are not entered, as in the kubelet), except dotfiles and editor
//!   leftovers (`*~`, `*.swp`, `*.swx`, `*.swo`, `*.tmp`, `#*#`, `4913`). Each file is YAML or JSON
//!   with any number of documents; see [`super::manifest`].
//! - **When.** At start, within about a second of any change (inotify on the directory, through
//!   the `notify` crate, with a 20 ms quiet period to absorb bursts such as an editor's
//!   save-by-rename), and every `fileCheckFrequency` (20 s) as a safety net: changes inotify cannot
//!   see (the target of a symbolic link) and a directory that appears, disappears or is replaced.
//! - **Trust.** A file owned by root (or nodelet's own user) and writable by no one else, in a directory
//!   that is too, is the administrator's: its pods get `nodelet.podSecurity.file`. Any other file's pods
//!   are held to `baseline` at least and to the namespaces and labels of the URL and HTTP sources (see
//!   [`super::admission`]).
//! - **Problems.** A file that cannot be read or that holds an invalid document is reported with
//!   its path, the pod and the field; its last good pods keep running (see the [pod config
//!   docs](super)). A missing path is reported too, and counts as an empty source.
//! - **Other kinds.** Documents that are not pods are kept, by kind, in [`ManifestObjects`], for
//!   the sources that will read ConfigMaps, Secrets and volumes.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nodelet_resources::model::pod::PodSource;
use notify::Watcher;
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::admission::trusted_metadata;
use super::manifest::{self, MAX_MANIFEST_BYTES, Parsed, ParsedPod};
use super::{Problem, SourceHandle};

/// The kubelet's default `fileCheckFrequency`.
pub(crate) const DEFAULT_FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// How long the directory must be quiet after its last change before it is read. Every change waits
/// this long, so it is kept short: a burst from one writer (an editor's save-by-rename, a tool writing
/// many manifests) is events microseconds apart. At 100 ms it was most of nodelet's start latency for a
/// pod.
pub(crate) const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(20);
/// A burst of changes delays a rescan by at most this much.
const MAX_DEBOUNCE: Duration = Duration::from_secs(1);

/// Settings of the [`FileSource`].
#[derive(Debug, Clone)]
pub struct FileSourceConfig {
    /// The manifest directory, or a single manifest file.
    pub path: PathBuf,
    /// Full rescan period (`fileCheckFrequency`, default 20 s).
    pub check_frequency: Duration,
    /// Quiet period after a change before the rescan (default 20 ms).
    pub(crate) debounce: Duration,
    /// Whether to watch the directory with inotify (default true); without it, changes are seen
    /// only by the periodic rescan.
    pub watch: bool,
}

impl FileSourceConfig {
    /// The defaults for `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            check_frequency: DEFAULT_FILE_CHECK_FREQUENCY,
            debounce: DEFAULT_DEBOUNCE,
            watch: true,
        }
    }
}

/// A document of another kind than Pod found in a manifest file.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestObject {
    /// The file it is in.
    pub file: PathBuf,
    /// The document.
    pub value: serde_json::Value,
}

impl ManifestObject {
    /// The document as a `T` of `kind`; an unreadable one is logged with its file and skipped.
    pub fn parse<T: serde::de::DeserializeOwned>(&self, kind: &str) -> Option<T> {
        match serde_json::from_value::<T>(self.value.clone()) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(kind, file = %self.file.display(), error = %e, "unreadable object");
                None
            }
        }
    }
}

/// The documents of other kinds than Pod in the manifest files, by kind (`ConfigMap`, `Secret`,
/// ...), in file and document order. Replaced as a whole after every rescan that changes it.
pub type ManifestObjects = BTreeMap<String, Vec<ManifestObject>>;

/// Reads static pods from a manifest directory or file; see the [module docs](self).
#[derive(Debug)]
pub struct FileSource {
    config: FileSourceConfig,
    handle: SourceHandle,
    files: BTreeMap<PathBuf, FileState>,
    /// A problem with the path itself (missing, unreadable directory).
    path_problem: Option<Problem>,
    objects: watch::Sender<Arc<ManifestObjects>>,
}

#[derive(Debug)]
struct FileState {
    /// The bytes last read, to skip parsing unchanged files (`None` when the last read failed).
    content: Option<Vec<u8>>,
    /// Whether the file was trusted ([`super::admission::trusted_manifest`]) when last read: a change of
    /// owner or mode parses it again.
    trusted: bool,
    /// What the file contributes: its valid pods, plus the last good version of the broken ones.
    pods: Vec<ParsedPod>,
    problems: Vec<Problem>,
    others: BTreeMap<String, Vec<serde_json::Value>>,
}

/// The live inotify watch, and what it watches.
struct Watch {
    _watcher: notify::RecommendedWatcher,
    target: PathBuf,
    identity: (u64, u64),
}

impl FileSource {
    /// A file source reporting through `handle`. Nothing is read before [`run`](Self::run).
    pub fn new(config: FileSourceConfig, handle: SourceHandle) -> Self {
        let (objects, _) = watch::channel(Arc::new(ManifestObjects::new()));
        Self { config, handle, files: BTreeMap::new(), path_problem: None, objects }
    }

    /// The documents of other kinds than Pod, updated after every rescan.
    pub fn objects(&self) -> watch::Receiver<Arc<ManifestObjects>> {
        self.objects.subscribe()
    }

    /// Reads the manifests now and whenever they change, until `shutdown` fires.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let events = Arc::new(Events::default());
        let mut watch: Option<Watch> = None;
        let mut ticker = tokio::time::interval(self.config.check_frequency);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Events counted before the last rescan started are covered by it.
        let mut covered = 0;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
                () = events.notify.notified() => {
                    if events.count.load(Ordering::Relaxed) == covered {
                        continue;
                    }
                    // Wait until the directory has been quiet for the debounce period since its last
                    // event, so that a burst of events gives one rescan.
                    let started = std::time::Instant::now();
                    while let Some(wait) =
                        debounce_wait(events.since_last(), started.elapsed(), self.config.debounce)
                    {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            }
            if self.config.watch {
                self.ensure_watch(&mut watch, &events);
            }
            covered = events.count.load(Ordering::Relaxed);
            self.rescan_guarded().await;
        }
    }

    /// [`rescan`](Self::rescan) with a panic boundary: a panic while reading the manifests (a bug input
    /// reached past the per-document boundary of [`manifest::parse`]) does not end the source's task, which the
    /// supervisor would take for the node failing. What was read is forgotten, so the next rescan reads every
    /// file again; the pods last reported keep running, and the panic is a problem of the manifest path.
    async fn rescan_guarded(&mut self) {
        use futures::FutureExt as _;
        let outcome = std::panic::AssertUnwindSafe(self.rescan()).catch_unwind().await;
        if let Err(payload) = outcome {
            let message = nodelet_shared::panic_message(payload.as_ref());
            tracing::error!(path = %self.config.path.display(), panic = %message, "reading the manifests panicked");
            self.files.clear();
            let problem = Problem {
                location: self.config.path.display().to_string(),
                object: None,
                message: format!(
                    "reading the manifests panicked ({message}); they are read again at the next change or check"
                ),
            };
            self.path_problem = Some(problem.clone());
            self.handle.set_problems(vec![problem]);
        }
    }

    /// (Re)creates the inotify watch when there is none or its directory was replaced.
    fn ensure_watch(&self, current: &mut Option<Watch>, events: &Arc<Events>) {
        let path = &self.config.path;
        // Watch the directory itself; for a single file (or a path that does not exist yet),
        // its parent, which also sees the file being created or replaced.
        let target = if path.is_dir() {
            path.clone()
        } else {
            match path.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
                _ => PathBuf::from("."),
            }
        };
        let Ok(metadata) = std::fs::metadata(&target) else {
            *current = None;
            return;
        };
        let identity = (metadata.dev(), metadata.ino());
        if current.as_ref().is_some_and(|w| w.target == target && w.identity == identity) {
            return;
        }
        let handler_events = events.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let relevant = match &event {
                // Our own reads open and close files: only a close after writing matters.
                Ok(event) => match event.kind {
                    notify::EventKind::Access(notify::event::AccessKind::Close(
                        notify::event::AccessMode::Write,
                    )) => true,
                    notify::EventKind::Access(_) => false,
                    _ => true,
                },
                // An overflowed queue or another error: rescan to be safe.
                Err(_) => true,
            };
            if relevant {
                handler_events.record();
            }
        });
        let watcher = watcher.and_then(|mut watcher| {
            watcher.watch(&target, notify::RecursiveMode::NonRecursive).map(|()| watcher)
        });
        match watcher {
            Ok(watcher) => {
                tracing::debug!(path = %target.display(), "watching the manifest directory");
                *current = Some(Watch { _watcher: watcher, target, identity });
            }
            Err(e) => {
                tracing::warn!(path = %target.display(), error = %e, "cannot watch the manifest directory; relying on the periodic rescan");
                *current = None;
            }
        }
    }

    /// Reads every manifest once and reports the full set to the pod config.
    pub(crate) async fn rescan(&mut self) {
        let listing = self.list().await;
        let files = match listing {
            Ok(files) => {
                self.path_problem = None;
                files
            }
            Err(problem) => {
                if self.path_problem.as_ref() != Some(&problem) {
                    tracing::debug!(%problem, "manifest path problem");
                }
                self.path_problem = Some(problem.clone());
                // An unreadable directory keeps what it had; a missing one has nothing.
                if problem.message.starts_with(MISSING) {
                    Vec::new()
                } else {
                    self.files.keys().cloned().collect()
                }
            }
        };
        self.files.retain(|path, _| files.contains(path));
        for path in files {
            self.read_file(path).await;
        }
        self.report();
    }

    /// The manifest files, in name order.
    async fn list(&self) -> Result<Vec<PathBuf>, Problem> {
        let path = &self.config.path;
        let location = path.display().to_string();
        let problem = |message: String| Problem { location: location.clone(), object: None, message };
        let metadata = match tokio::fs::metadata(path).await {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(problem(format!("{MISSING}: no pods are read from it until it exists")));
            }
            Err(e) => return Err(problem(format!("cannot read the manifest path: {e}"))),
        };
        if !metadata.is_dir() {
            return Ok(vec![path.clone()]);
        }
        let mut entries = tokio::fs::read_dir(path)
            .await
            .map_err(|e| problem(format!("cannot list the directory: {e}")))?;
        let mut files = Vec::new();
        loop {
            match entries.next_entry().await {
                Ok(Some(entry)) => {
                    let name = entry.file_name();
                    if ignored_name(&name.to_string_lossy()) {
                        continue;
                    }
                    let file = entry.path();
                    // Follows symbolic links; subdirectories are not entered.
                    match tokio::fs::metadata(&file).await {
                        Ok(m) if m.is_file() => files.push(file),
                        Ok(_) => tracing::debug!(path = %file.display(), "not a regular file; ignored"),
                        Err(e) => tracing::debug!(path = %file.display(), error = %e, "cannot stat; ignored"),
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(problem(format!("cannot list the directory: {e}"))),
            }
        }
        files.sort();
        Ok(files)
    }

    async fn read_file(&mut self, path: PathBuf) {
        let location = path.display().to_string();
        let (content, file_trusted) = match read_limited(&path).await {
            Ok(read) => read,
            Err(error) => {
                // Unreadable now: keep its last good pods, report why.
                let state = self.files.entry(path).or_insert_with(|| FileState {
                    content: None,
                    trusted: false,
                    pods: Vec::new(),
                    problems: Vec::new(),
                    others: BTreeMap::new(),
                });
                state.content = None;
                state.problems = vec![Problem {
                    location,
                    object: None,
                    message: kept_note(error.to_string(), state.pods.len()),
                }];
                return;
            }
        };
        // The directory the file is listed in: whoever may write there may replace the file.
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let dir_trusted = tokio::fs::metadata(dir).await.is_ok_and(|m| trusted_metadata(&m));
        let trusted = file_trusted && dir_trusted;
        if self.files.get(&path).is_some_and(|s| s.content.as_ref() == Some(&content) && s.trusted == trusted)
        {
            return;
        }
        if !trusted {
            tracing::debug!(path = %location, "manifest not owned by root or writable by others: held to baseline");
        }
        let source = PodSource::File(path.clone());
        let security = self.handle.security();
        let previous = self.files.get(&path).map(|s| s.pods.as_slice()).unwrap_or_default();
        // A panic while reading this file (past the per-document boundary of `manifest::parse`) is a problem
        // of this file: its last good pods are kept, the other files are read.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let parsed =
                manifest::parse(&content, &source, self.handle.node_name(), &security.for_file(trusted));
            let (pods, kept) = manifest::keep_last_good(&parsed, previous);
            let problems = problems_of(&location, &parsed, &pods, kept);
            (pods, problems, parsed.others)
        }));
        let (pods, problems, others) = match read {
            Ok(read) => read,
            Err(payload) => {
                let message = nodelet_shared::panic_message(payload.as_ref());
                tracing::error!(path = %location, panic = %message, "reading a manifest file panicked");
                let message = format!("the file could not be read (nodelet panicked on it: {message})");
                let problems = vec![Problem {
                    location: location.clone(),
                    object: None,
                    message: kept_note(message, previous.len()),
                }];
                let others = self.files.get(&path).map(|s| s.others.clone()).unwrap_or_default();
                (previous.to_vec(), problems, others)
            }
        };
        tracing::debug!(path = %location, pods = pods.len(), problems = problems.len(), "manifest read");
        self.files.insert(path, FileState { content: Some(content), trusted, pods, problems, others });
    }

    fn report(&self) {
        // The objects first: whoever waits for the pods to sync (the claim and volume
        // populators) then finds the objects of the same read.
        let objects: ManifestObjects = self.files.iter().fold(BTreeMap::new(), |mut acc, (file, state)| {
            for (kind, values) in &state.others {
                let entry: &mut Vec<ManifestObject> = acc.entry(kind.clone()).or_default();
                entry.extend(
                    values.iter().map(|value| ManifestObject { file: file.clone(), value: value.clone() }),
                );
            }
            acc
        });
        self.objects.send_if_modified(|current| {
            let changed = **current != objects;
            if changed {
                *current = Arc::new(objects);
            }
            changed
        });
        let pods = self.files.values().flat_map(|f| f.pods.iter().map(|p| p.pod.clone())).collect();
        let problems = self
            .path_problem
            .iter()
            .cloned()
            .chain(self.files.values().flat_map(|f| f.problems.iter().cloned()))
            .collect();
        self.handle.report_shared(pods, problems);
    }
}

const MISSING: &str = "the manifest path does not exist";

/// How much longer a rescan that a change asked for waits: until the manifests have been quiet for
/// `debounce` since the last event (which came `quiet` ago; `None`: none recorded), but no longer
/// than [`MAX_DEBOUNCE`] since the wait began (`waited` ago). `None`: rescan now.
fn debounce_wait(quiet: Option<Duration>, waited: Duration, debounce: Duration) -> Option<Duration> {
    let quiet = quiet.unwrap_or(debounce);
    (quiet < debounce && waited < MAX_DEBOUNCE).then(|| (debounce - quiet).min(MAX_DEBOUNCE - waited))
}

/// The relevant inotify events, as the watcher's thread reports them to the source's loop.
#[derive(Debug)]
struct Events {
    /// How many there were.
    count: AtomicU64,
    /// When the last one came, in nanoseconds after `epoch` (0: none yet).
    last: AtomicU64,
    epoch: std::time::Instant,
    notify: Notify,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            count: AtomicU64::new(0),
            last: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            notify: Notify::new(),
        }
    }
}

impl Events {
    /// Counts an event, notes its time and wakes the loop.
    fn record(&self) {
        let since = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
        self.last.store(since, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// How long ago the last event came (`None`: there was none).
    fn since_last(&self) -> Option<Duration> {
        let last = self.last.load(Ordering::Relaxed);
        (last != 0).then(|| self.epoch.elapsed().saturating_sub(Duration::from_nanos(last)))
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("target", &self.target).finish()
    }
}

/// Dotfiles and editor leftovers are not manifests.
fn ignored_name(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".swx")
        || name.ends_with(".swo")
        || name.ends_with(".tmp")
        || (name.starts_with('#') && name.ends_with('#'))
        || name == "4913"
}

/// Why a manifest file could not be read (its one problem; its last good pods keep running).
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// Opening or reading failed.
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    /// The file is larger than a manifest may be.
    #[error("the file is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
}

/// Reads at most [`MAX_MANIFEST_BYTES`] (+1, to tell that a file is too large), and whether the file read
/// (the opened file itself, not the path again) is the node administrator's ([`trusted_metadata`]).
async fn read_limited(path: &Path) -> Result<(Vec<u8>, bool), ReadError> {
    let file = tokio::fs::File::open(path).await?;
    let trusted = file.metadata().await.is_ok_and(|m| trusted_metadata(&m));
    let mut content = Vec::new();
    let limit = u64::try_from(MAX_MANIFEST_BYTES).unwrap_or(u64::MAX).saturating_add(1);
    file.take(limit).read_to_end(&mut content).await?;
    if content.len() > MAX_MANIFEST_BYTES {
        return Err(ReadError::TooLarge);
    }
    Ok((content, trusted))
}

/// The problems of one manifest at `location`, noting the pods kept from its last good version.
pub(super) fn problems_of(location: &str, parsed: &Parsed, pods: &[ParsedPod], kept: usize) -> Vec<Problem> {
    let new_keys: std::collections::HashSet<&str> = parsed.pods.iter().map(|p| p.key.as_str()).collect();
    parsed
        .problems
        .iter()
        .map(|problem| {
            let message = match &problem.object {
                Some(object)
                    if !new_keys.contains(object.as_str()) && pods.iter().any(|p| &p.key == object) =>
                {
                    format!("{} (the last good version of this pod keeps running)", problem.message)
                }
                Some(_) => problem.message.clone(),
                None => kept_note(problem.message.clone(), kept),
            };
            Problem { location: location.to_owned(), object: problem.object.clone(), message }
        })
        .collect()
}

fn kept_note(message: String, kept: usize) -> String {
    match kept {
        0 => message,
        1 => format!("{message} (the last good version of 1 pod keeps running)"),
        n => format!("{message} (the last good versions of {n} pods keep running)"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testutil::{NODE, by_name, eventually, names, pod_yaml};
    use super::super::{PodConfig, SourceProblems};
    use super::*;

    /// Changes must be seen within a second.
    const WITHIN: Duration = Duration::from_secs(1);

    struct Running {
        store: reconcile_engine::Store<
            nodelet_resources::model::pod::PodUid,
            nodelet_resources::model::pod::DesiredPod,
        >,
        problems: SourceProblems,
        objects: watch::Receiver<Arc<ManifestObjects>>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Running {
        async fn stop(self) {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(5), self.task).await.expect("stops").expect("no panic");
        }
    }

    /// Starts a file source on `config`; the periodic rescan is off (1 hour) unless the config says
    /// otherwise, so that only inotify can explain a change seen within a second.
    fn start(config: FileSourceConfig) -> Running {
        let pod_config = PodConfig::new(NODE);
        let handle = pod_config.add_source("file").expect("file source");
        pod_config.seal();
        let source = FileSource::new(config, handle);
        let objects = source.objects();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(source.run(shutdown.clone()));
        Running { store: pod_config.store(), problems: pod_config.problems(), objects, shutdown, task }
    }

    fn watched(dir: &Path) -> FileSourceConfig {
        FileSourceConfig { check_frequency: Duration::from_secs(3600), ..FileSourceConfig::new(dir) }
    }

    async fn synced(running: &Running) {
        tokio::time::timeout(Duration::from_secs(5), running.store.wait_until_synced())
            .await
            .expect("first scan within 5 s")
            .expect("writer alive");
    }

    fn image_of(running: &Running, name: &str) -> Option<String> {
        by_name(&running.store, name).and_then(|p| p.containers()[0].image.clone())
    }

    #[test]
    fn a_rescan_waits_for_a_quiet_period_after_the_last_event_but_not_forever() {
        let ms = Duration::from_millis;
        let d = ms(20);
        assert_eq!(debounce_wait(None, ms(0), d), None, "no event recorded: at once");
        assert_eq!(debounce_wait(Some(ms(25)), ms(0), d), None, "quiet long enough already");
        assert_eq!(debounce_wait(Some(ms(0)), ms(0), d), Some(ms(20)), "an event just now: a whole period");
        assert_eq!(debounce_wait(Some(ms(15)), ms(15), d), Some(ms(5)), "counted from the last event");
        assert_eq!(debounce_wait(Some(ms(1)), ms(300), d), Some(ms(19)), "a later event starts it again");
        assert_eq!(debounce_wait(Some(ms(0)), MAX_DEBOUNCE, d), None, "events that never stop: at most 1 s");
        assert_eq!(debounce_wait(Some(ms(0)), MAX_DEBOUNCE - ms(5), d), Some(ms(5)), "never past the bound");
    }

    #[tokio::test]
    async fn adding_changing_and_removing_a_file_takes_effect_within_a_second() {
        let dir = tempfile::tempdir().expect("tempdir");
        let running = start(watched(dir.path()));
        synced(&running).await;
        assert!(running.store.is_empty());

        std::fs::write(dir.path().join("web.yaml"), pod_yaml("web", "nginx:1")).expect("write");
        eventually("the new pod", WITHIN, || by_name(&running.store, "web-node-a")).await;
        let first_uid = by_name(&running.store, "web-node-a").map(|p| p.uid().to_owned());

        std::fs::write(dir.path().join("web.yaml"), pod_yaml("web", "nginx:2")).expect("rewrite");
        eventually("the changed pod", WITHIN, || {
            (image_of(&running, "web-node-a")? == "nginx:2").then_some(())
        })
        .await;
        let second_uid = by_name(&running.store, "web-node-a").map(|p| p.uid().to_owned());
        assert_ne!(first_uid, second_uid, "a changed manifest is a new pod UID");
        assert_eq!(running.store.len(), 1, "the old version is gone");

        std::fs::remove_file(dir.path().join("web.yaml")).expect("remove");
        eventually("the pod to disappear", WITHIN, || running.store.is_empty().then_some(())).await;
        running.stop().await;
    }

    #[tokio::test]
    async fn an_editors_save_by_rename_is_seen() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("web.yaml"), pod_yaml("web", "nginx:1")).expect("write");
        let running = start(watched(dir.path()));
        synced(&running).await;
        assert_eq!(names(&running.store), ["web-node-a"]);
        // Write a swap file, then rename it over the manifest, as vim does.
        let swap = dir.path().join(".web.yaml.swp");
        std::fs::write(&swap, pod_yaml("web", "nginx:2")).expect("write swap");
        std::fs::rename(&swap, dir.path().join("web.yaml")).expect("rename");
        eventually("the renamed-in version", WITHIN, || {
            (image_of(&running, "web-node-a")? == "nginx:2").then_some(())
        })
        .await;
        running.stop().await;
    }

    #[tokio::test]
    async fn a_broken_manifest_next_to_good_ones_is_reported_and_the_good_ones_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.yaml"), pod_yaml("a", "nginx")).expect("write");
        std::fs::write(dir.path().join("b.json"), r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[{"name":"app","image":"nginx"}]}}"#).expect("write");
        std::fs::write(dir.path().join("bad.yaml"), pod_yaml("bad", "''")).expect("write");
        let running = start(watched(dir.path()));
        synced(&running).await;
        assert_eq!(names(&running.store), ["a-node-a", "b-node-a"]);
        let problems = running.problems.list();
        assert_eq!(problems.len(), 1, "{problems:?}");
        let bad = dir.path().join("bad.yaml").display().to_string();
        assert_eq!(
            problems[0].to_string(),
            format!("{bad}: pod \"default/bad\": spec.containers[0].image: Required value")
        );
        running.stop().await;
    }

    #[tokio::test]
    async fn a_manifest_that_breaks_keeps_its_last_good_pods_until_fixed_or_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("web.yaml");
        std::fs::write(&path, pod_yaml("web", "nginx:1")).expect("write");
        let running = start(watched(dir.path()));
        synced(&running).await;
        let good = by_name(&running.store, "web-node-a").expect("web runs");

        std::fs::write(&path, "apiVersion: v1\nkind: Pod\nmetadata: [oops\n").expect("break");
        let problems = running.problems.clone();
        let problems =
            tokio::time::timeout(WITHIN, problems.wait_for(|p| !p.is_empty())).await.expect("reported");
        assert!(problems[0].message.starts_with("invalid YAML"), "{problems:?}");
        assert!(problems[0].message.contains("keeps running"), "{problems:?}");
        assert_eq!(problems[0].location, path.display().to_string());
        assert_eq!(
            by_name(&running.store, "web-node-a").map(|p| p.uid().to_owned()),
            Some(good.uid().to_owned())
        );

        // A valid document with an invalid field: the same, named by the pod.
        std::fs::write(&path, pod_yaml("web", "''")).expect("break differently");
        let problems = running.problems.clone();
        let problems =
            tokio::time::timeout(WITHIN, problems.wait_for(|p| p.iter().any(|p| p.object.is_some())))
                .await
                .expect("reported");
        assert_eq!(problems[0].object.as_deref(), Some("default/web"));
        assert!(problems[0].message.contains("spec.containers[0].image: Required value"), "{problems:?}");
        assert_eq!(running.store.len(), 1);

        std::fs::write(&path, pod_yaml("web", "nginx:2")).expect("fix");
        eventually("the fixed pod", WITHIN, || {
            (image_of(&running, "web-node-a")? == "nginx:2").then_some(())
        })
        .await;
        assert!(running.problems.wait_for(<[_]>::is_empty).await.is_empty());

        std::fs::write(&path, "kind: [").expect("break again");
        tokio::time::timeout(WITHIN, running.problems.wait_for(|p| !p.is_empty())).await.expect("reported");
        std::fs::remove_file(&path).expect("remove");
        eventually("the pod to go with its file", WITHIN, || running.store.is_empty().then_some(())).await;
        assert!(running.problems.wait_for(<[_]>::is_empty).await.is_empty(), "a removed file has no problem");
        running.stop().await;
    }

    #[tokio::test]
    async fn multi_document_files_other_kinds_dotfiles_and_subdirectories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let multi = format!(
            "{}---\n{}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  level: debug\n",
            pod_yaml("one", "nginx"),
            pod_yaml("two", "nginx")
        );
        std::fs::write(dir.path().join("multi.yaml"), multi).expect("write");
        std::fs::write(dir.path().join(".hidden.yaml"), pod_yaml("hidden", "nginx")).expect("write");
        std::fs::write(dir.path().join("backup.yaml~"), pod_yaml("backup", "nginx")).expect("write");
        std::fs::write(dir.path().join("edit.yaml.swp"), pod_yaml("swap", "nginx")).expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub").join("deep.yaml"), pod_yaml("deep", "nginx")).expect("write");
        let running = start(watched(dir.path()));
        synced(&running).await;
        assert_eq!(names(&running.store), ["one-node-a", "two-node-a"]);
        assert!(running.problems.is_empty(), "{:?}", running.problems.list());
        let objects = running.objects.borrow().clone();
        let config_maps = objects.get("ConfigMap").expect("ConfigMap kept");
        assert_eq!(config_maps.len(), 1);
        assert_eq!(config_maps[0].file, dir.path().join("multi.yaml"));
        assert_eq!(config_maps[0].value["data"]["level"], "debug");
        running.stop().await;
    }

    #[tokio::test]
    async fn a_single_file_path_is_read_and_watched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("only.yaml");
        std::fs::write(&path, pod_yaml("only", "nginx:1")).expect("write");
        std::fs::write(dir.path().join("other.yaml"), pod_yaml("other", "nginx")).expect("write");
        let running = start(watched(&path));
        synced(&running).await;
        assert_eq!(names(&running.store), ["only-node-a"]);
        std::fs::write(&path, pod_yaml("only", "nginx:2")).expect("rewrite");
        eventually("the change", WITHIN, || (image_of(&running, "only-node-a")? == "nginx:2").then_some(()))
            .await;
        running.stop().await;
    }

    #[tokio::test]
    async fn a_missing_directory_is_a_problem_until_it_appears() {
        let parent = tempfile::tempdir().expect("tempdir");
        let dir = parent.path().join("manifests");
        let running = start(watched(&dir));
        synced(&running).await;
        let problems = running.problems.list();
        assert!(problems[0].message.starts_with("the manifest path does not exist"), "{problems:?}");

        // Created with its manifest in one step (a rename), as a deployment tool would.
        let staging = parent.path().join(".staging");
        std::fs::create_dir(&staging).expect("mkdir");
        std::fs::write(staging.join("web.yaml"), pod_yaml("web", "nginx")).expect("write");
        std::fs::rename(&staging, &dir).expect("rename");
        eventually("the pod of the new directory", WITHIN, || by_name(&running.store, "web-node-a")).await;
        assert!(running.problems.wait_for(<[_]>::is_empty).await.is_empty());

        // The directory is now watched itself.
        std::fs::write(dir.join("api.yaml"), pod_yaml("api", "nginx")).expect("write");
        eventually("a pod added later", WITHIN, || by_name(&running.store, "api-node-a")).await;
        running.stop().await;
    }

    #[tokio::test]
    async fn without_inotify_the_periodic_rescan_sees_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = FileSourceConfig {
            check_frequency: Duration::from_millis(200),
            watch: false,
            ..FileSourceConfig::new(dir.path())
        };
        let running = start(config);
        synced(&running).await;
        std::fs::write(dir.path().join("web.yaml"), pod_yaml("web", "nginx")).expect("write");
        eventually("the rescan", Duration::from_secs(2), || by_name(&running.store, "web-node-a")).await;
        running.stop().await;
    }

    #[test]
    fn editor_leftovers_are_ignored() {
        for name in [".web.yaml", "web.yaml~", ".web.yaml.swp", "web.swx", "#web.yaml#", "4913", "x.tmp"] {
            assert!(ignored_name(name), "{name}");
        }
        for name in ["web.yaml", "web.json", "web", "kube-apiserver.manifest"] {
            assert!(!ignored_name(name), "{name}");
        }
    }
}
