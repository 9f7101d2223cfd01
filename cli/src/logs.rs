//! `nodelet logs`: reads a container's CRI log files under the pod logs directory, like `kubectl logs`.
//!
//! Layout (the kubelet's): `<pod-logs-dir>/<namespace>_<pod>_<uid>/<container>/<restart-count>.log`, each
//! line `<RFC3339Nano timestamp> <stdout|stderr> <P|F> <content>`, where `P` marks a partial line continued
//! by the next record. The lines are parsed and rendered by [`nodelet_shared::cri_log`], as the server's
//! `/containerLogs` does (`--tail`, `--since`/`--since-time`, `--timestamps`, `--limit-bytes`). Files are
//! opened component by component without following symbolic links, so a pod that can write into the logs
//! directory (a hostPath) cannot make this command read other host files.

use std::fs::File;
use std::io::{ErrorKind, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use tokio::io::AsyncSeekExt as _;
use tokio::time::sleep;

use crate::args::LogsArgs;
use nodelet_shared::cri_log::{LineReader, Renderer, tail_start};
use nodelet_shared::names::{is_dns_label, is_dns_subdomain};

/// How often `-f` looks for new lines.
pub(crate) const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Why `logs` failed.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// A name is not a valid Kubernetes name.
    #[error("invalid {what} {value:?}")]
    InvalidName {
        /// pod, namespace or container.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// The logs directory cannot be read.
    #[error(
        "cannot read the pod logs directory {path}: {source} (run as root on the node, or pass --pod-logs-dir)"
    )]
    LogDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No log directory for that pod.
    #[error("pods {pod:?} not found in namespace {namespace:?} (no logs under {dir}){hint}")]
    PodNotFound {
        /// Namespace.
        namespace: String,
        /// Pod.
        pod: String,
        /// The logs directory.
        dir: PathBuf,
        /// Pods that do exist there.
        hint: String,
    },
    /// The pod has several containers and none was chosen.
    #[error("a container name must be specified for pod {pod}, choose one of: [{}]", .containers.join(" "))]
    ContainerRequired {
        /// Pod.
        pod: String,
        /// Its containers (init containers included).
        containers: Vec<String>,
    },
    /// The chosen container has no logs in that pod.
    #[error("container {container} is not valid for pod {pod}, choose one of: [{}]", .containers.join(" "))]
    ContainerNotFound {
        /// Pod.
        pod: String,
        /// The container asked for.
        container: String,
        /// Its containers.
        containers: Vec<String>,
    },
    /// The container has not written a log file yet.
    #[error("container {container:?} in pod {pod:?} has no log file yet (is it starting?)")]
    NoLogs {
        /// Pod.
        pod: String,
        /// Container.
        container: String,
    },
    /// `--previous` without a previous instance.
    #[error("previous terminated container {container:?} in pod {pod:?} not found")]
    NoPrevious {
        /// Pod.
        pod: String,
        /// Container.
        container: String,
    },
    /// A log file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `--since-time` is not an RFC 3339 time.
    #[error("--since-time: {0:?} is not an RFC 3339 time (e.g. 2024-05-01T12:00:00Z)")]
    BadSinceTime(String),
    /// Writing the output failed.
    #[error("cannot write the output: {0}")]
    Output(#[source] std::io::Error),
}

fn check_name(what: &'static str, value: &str, ok: bool) -> Result<(), LogsError> {
    if ok { Ok(()) } else { Err(LogsError::InvalidName { what, value: value.to_owned() }) }
}

/// A container's log location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerLogs {
    /// `<namespace>_<pod>_<uid>`.
    pub(crate) pod_dir: String,
    /// The container's name (its directory).
    pub(crate) container: String,
    /// Restart counts that have a `<n>.log`, ascending.
    pub(crate) instances: Vec<u32>,
}

fn list_dir(path: &Path) -> std::io::Result<Vec<(String, std::fs::FileType)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(path)? {
        let e = e?;
        if let Some(name) = e.file_name().to_str() {
            out.push((name.to_owned(), e.file_type()?));
        }
    }
    Ok(out)
}

/// The newest log file's modification time in a pod directory (to choose between pod UIDs).
fn newest_mtime(dir: &Path) -> i64 {
    let mut newest = i64::MIN;
    for (c, t) in list_dir(dir).unwrap_or_default() {
        if !t.is_dir() {
            continue;
        }
        for (f, ft) in list_dir(&dir.join(&c)).unwrap_or_default() {
            if ft.is_file()
                && let Ok(m) = std::fs::symlink_metadata(dir.join(&c).join(f))
            {
                newest = newest.max(m.mtime());
            }
        }
    }
    newest
}

/// Finds the pod's log directory and the container's log files.
pub(crate) fn locate(
    logs_dir: &Path,
    namespace: &str,
    pod: &str,
    container: Option<&str>,
) -> Result<ContainerLogs, LogsError> {
    check_name("namespace", namespace, is_dns_label(namespace))?;
    check_name("pod name", pod, is_dns_subdomain(pod))?;
    if let Some(c) = container {
        check_name("container name", c, is_dns_label(c))?;
    }
    let entries =
        list_dir(logs_dir).map_err(|source| LogsError::LogDir { path: logs_dir.to_owned(), source })?;
    let mut candidates = Vec::new();
    let mut others = Vec::new();
    for (name, ft) in entries {
        if !ft.is_dir() {
            continue; // symbolic links included: never followed
        }
        let parts: Vec<&str> = name.split('_').collect();
        if parts.len() != 3 {
            continue;
        }
        if parts[0] == namespace && parts[1] == pod {
            candidates.push(name);
        } else if parts[0] == namespace {
            others.push(parts[1].to_owned());
        }
    }
    let pod_dir = match candidates.len() {
        0 => {
            others.sort();
            others.dedup();
            let hint = if others.is_empty() {
                String::new()
            } else {
                format!("; pods with logs in namespace {namespace}: {}", others.join(", "))
            };
            return Err(LogsError::PodNotFound {
                namespace: namespace.to_owned(),
                pod: pod.to_owned(),
                dir: logs_dir.to_owned(),
                hint,
            });
        }
        1 => candidates.remove(0),
        _ => {
            // several UIDs (an old instance of the pod not yet cleaned up): the most recently written one
            candidates.sort_by_key(|c| std::cmp::Reverse(newest_mtime(&logs_dir.join(c))));
            candidates.remove(0)
        }
    };
    let pod_path = logs_dir.join(&pod_dir);
    let mut containers: Vec<String> = list_dir(&pod_path)
        .map_err(|source| LogsError::Read { path: pod_path.clone(), source })?
        .into_iter()
        .filter(|(n, t)| t.is_dir() && is_dns_label(n))
        .map(|(n, _)| n)
        .collect();
    containers.sort();
    let container = match container {
        Some(c) if containers.iter().any(|x| x == c) => c.to_owned(),
        Some(c) => {
            return Err(LogsError::ContainerNotFound {
                pod: pod.to_owned(),
                container: c.to_owned(),
                containers,
            });
        }
        None if containers.len() == 1 => containers.remove(0),
        None if containers.is_empty() => {
            return Err(LogsError::NoLogs { pod: pod.to_owned(), container: "(none)".into() });
        }
        None => return Err(LogsError::ContainerRequired { pod: pod.to_owned(), containers }),
    };
    let cpath = pod_path.join(&container);
    let mut instances: Vec<u32> = list_dir(&cpath)
        .map_err(|source| LogsError::Read { path: cpath.clone(), source })?
        .into_iter()
        .filter(|(_, t)| t.is_file())
        .filter_map(|(n, _)| n.strip_suffix(".log").and_then(|s| s.parse().ok()))
        .collect();
    instances.sort_unstable();
    Ok(ContainerLogs { pod_dir, container, instances })
}

/// Opens `base/parts...` refusing symbolic links in every component after `base`; the result must be a
/// regular file.
fn open_beneath(base: &Path, parts: &[&str]) -> std::io::Result<File> {
    let mut dir =
        rustix::fs::open(base, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() || *part == "." || *part == ".." || part.contains('/') {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("invalid path component {part:?}"),
            ));
        }
        let last = i + 1 == parts.len();
        let mut flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        if !last {
            flags |= OFlags::DIRECTORY;
        }
        let fd = rustix::fs::openat(&dir, *part, flags, Mode::empty())?;
        if last {
            let file = File::from(fd);
            if !file.metadata()?.is_file() {
                return Err(std::io::Error::new(ErrorKind::InvalidInput, "not a regular file"));
            }
            return Ok(file);
        }
        dir = fd;
    }
    Err(std::io::Error::new(ErrorKind::InvalidInput, "empty path"))
}

fn write_out(out: &mut (dyn Write + Send), bytes: &[u8]) -> Result<bool, LogsError> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        // the reader went away (`| head`): stop quietly
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(LogsError::Output(e)),
    }
}

/// Prints the logs `args` ask for to `out`; with `follow`, keeps printing until the container is restarted
/// or the pod's log directory disappears (checked every `poll`).
pub(crate) async fn print_logs(
    args: &LogsArgs,
    out: &mut (dyn Write + Send),
    poll: Duration,
) -> Result<(), LogsError> {
    let since = since(args, crate::get::now())?;
    let loc = locate(&args.pod_logs_dir, &args.namespace, &args.pod, args.container.as_deref())?;
    let instance = if args.previous {
        loc.instances.iter().rev().nth(1).copied().ok_or_else(|| LogsError::NoPrevious {
            pod: args.pod.clone(),
            container: loc.container.clone(),
        })?
    } else {
        loc.instances
            .last()
            .copied()
            .ok_or_else(|| LogsError::NoLogs { pod: args.pod.clone(), container: loc.container.clone() })?
    };
    let file_name = format!("{instance}.log");
    let rel = [loc.pod_dir.as_str(), loc.container.as_str(), file_name.as_str()];
    let path = args.pod_logs_dir.join(&loc.pod_dir).join(&loc.container).join(&file_name);
    let read_err = |source| LogsError::Read { path: path.clone(), source };
    let file = open_beneath(&args.pod_logs_dir, &rel).map_err(read_err)?;
    let mut ino = file.metadata().map_err(read_err)?.ino();
    let mut file = tokio::fs::File::from_std(file);
    let start = match u64::try_from(args.tail) {
        Ok(n) => tail_start(file.try_clone().await.map_err(read_err)?, n).await.map_err(read_err)?,
        Err(_) => 0,
    };
    file.seek(SeekFrom::Start(start)).await.map_err(read_err)?;
    let mut lines = LineReader::new(file, start);
    let limit = (args.limit_bytes > 0).then_some(args.limit_bytes);
    let mut renderer = Renderer::new(args.timestamps, since, limit);
    let follow = args.follow && !args.previous;
    let mut text = Vec::new();
    let limited = render_available(&mut lines, &mut renderer, &mut text).await.map_err(read_err)?;
    if limited || !follow {
        // the file is read to its end: its unterminated last line is printed too, as the kubelet does
        if !limited && let Some(line) = lines.take_incomplete() {
            renderer.render(&line, &mut text);
        }
        write_out(out, &text)?;
        return Ok(());
    }
    if !write_out(out, &text)? {
        return Ok(());
    }

    // follow
    let container_dir = args.pod_logs_dir.join(&loc.pod_dir).join(&loc.container);
    loop {
        let mut text = Vec::new();
        let limited = render_available(&mut lines, &mut renderer, &mut text).await.map_err(read_err)?;
        if (!text.is_empty() && !write_out(out, &text)?) || limited {
            return Ok(());
        }
        // at the end of the file: was it rotated, or the container restarted, or the pod removed?
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.ino() != ino || m.len() < lines.pos() => {
                // rotated (renamed away and recreated, or truncated): continue with the new file
                match open_beneath(&args.pod_logs_dir, &rel) {
                    Ok(f) => {
                        ino = f.metadata().map_err(read_err)?.ino();
                        lines = LineReader::new(tokio::fs::File::from_std(f), 0);
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(read_err(e)),
                }
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(read_err(e)),
        }
        if !container_dir.is_dir() {
            return Ok(()); // the pod was removed
        }
        let restarted = list_dir(&container_dir).unwrap_or_default().iter().any(|(n, t)| {
            t.is_file()
                && n.strip_suffix(".log").and_then(|s| s.parse::<u32>().ok()).is_some_and(|n| n > instance)
        });
        if restarted {
            // the container we followed has exited; one last read, then stop like kubectl does
            let mut text = Vec::new();
            render_available(&mut lines, &mut renderer, &mut text).await.map_err(read_err)?;
            write_out(out, &text)?;
            return Ok(());
        }
        sleep(poll).await;
    }
}

/// Renders the complete lines up to the end of the file into `text`; true when the byte limit is reached.
async fn render_available(
    lines: &mut LineReader,
    renderer: &mut Renderer,
    text: &mut Vec<u8>,
) -> std::io::Result<bool> {
    while let Some((_, line)) = lines.next_line().await? {
        if renderer.render(&line, text) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The time from which lines are printed: `--since-time`, or `now` less `--since`.
fn since(
    args: &LogsArgs,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<Option<k8s_openapi::jiff::Timestamp>, LogsError> {
    if let Some(time) = &args.since_time {
        return time.parse().map(Some).map_err(|_| LogsError::BadSinceTime(time.clone()));
    }
    let Some(duration) = args.since.filter(|d| !d.0.is_zero()) else { return Ok(None) };
    let span = k8s_openapi::jiff::SignedDuration::try_from(duration.0)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    Ok(Some(now.checked_sub(span).unwrap_or(k8s_openapi::jiff::Timestamp::MIN)))
}

/// `nodelet logs`.
pub(crate) async fn run(args: &LogsArgs) -> Result<(), LogsError> {
    let mut out = std::io::stdout();
    print_logs(args, &mut out, FOLLOW_POLL).await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    fn logs_args(dir: &Path, flags: &[&str]) -> LogsArgs {
        let d = dir.to_str().expect("utf8").to_owned();
        let mut v = vec!["nodelet", "logs", "--pod-logs-dir", d.as_str()];
        v.extend_from_slice(flags);
        match Cli::try_parse_from(v).expect("parse").into_command() {
            Command::Logs(l) => l,
            other => panic!("{other:?}"),
        }
    }

    const UID: &str = "0123456789abcdef0123456789abcdef";

    fn write_log(dir: &Path, pod: &str, container: &str, n: u32, lines: &[&str]) -> PathBuf {
        let cdir = dir.join(format!("default_{pod}_{UID}")).join(container);
        std::fs::create_dir_all(&cdir).expect("mkdir");
        let path = cdir.join(format!("{n}.log"));
        let mut text = String::new();
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        std::fs::write(&path, text).expect("write");
        path
    }

    async fn run_to_string(args: &LogsArgs) -> Result<String, LogsError> {
        let mut out = Vec::new();
        print_logs(args, &mut out, Duration::from_millis(10)).await?;
        Ok(String::from_utf8(out).expect("utf8"))
    }

    const LINES: &[&str] = &[
        "2024-05-01T12:00:00.000000001Z stdout F hello",
        "2024-05-01T12:00:01.000000001Z stderr F oops",
        "2024-05-01T12:00:02.000000001Z stdout P long ",
        "2024-05-01T12:00:02.000000002Z stdout F line",
        "not a cri line",
        "2024-05-01T12:00:03.000000001Z stdout F bye",
    ];

    #[tokio::test]
    async fn a_single_container_pod_needs_no_container_name() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_log(tmp.path(), "web-node1", "httpd", 0, LINES);
        let out = run_to_string(&logs_args(tmp.path(), &["web-node1"])).await.expect("logs");
        assert_eq!(out, "hello\noops\nlong line\nbye\n");
        let out = run_to_string(&logs_args(tmp.path(), &["web-node1", "--tail", "2", "--timestamps"]))
            .await
            .expect("logs");
        assert_eq!(out, "2024-05-01T12:00:02.000000001Z long line\n2024-05-01T12:00:03.000000001Z bye\n");
        let out = run_to_string(&logs_args(tmp.path(), &["web-node1", "--tail", "0"])).await.expect("logs");
        assert_eq!(out, "");
    }

    #[tokio::test]
    async fn several_containers_need_a_name_and_wrong_names_list_the_choices() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_log(tmp.path(), "shared-node1", "web", 0, &["2024-05-01T12:00:00Z stdout F from web"]);
        write_log(tmp.path(), "shared-node1", "reader", 0, &["2024-05-01T12:00:00Z stdout F from reader"]);
        let e = run_to_string(&logs_args(tmp.path(), &["shared-node1"])).await.expect_err("needs -c");
        assert_eq!(
            e.to_string(),
            "a container name must be specified for pod shared-node1, choose one of: [reader web]"
        );
        let e =
            run_to_string(&logs_args(tmp.path(), &["shared-node1", "-c", "nope"])).await.expect_err("bad -c");
        assert!(e.to_string().contains("container nope is not valid for pod shared-node1"), "{e}");
        let out =
            run_to_string(&logs_args(tmp.path(), &["shared-node1", "-c", "reader"])).await.expect("logs");
        assert_eq!(out, "from reader\n");
    }

    #[tokio::test]
    async fn previous_reads_the_instance_before_the_last_restart() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_log(tmp.path(), "crash-node1", "app", 0, &["2024-05-01T12:00:00Z stdout F run 0"]);
        write_log(tmp.path(), "crash-node1", "app", 1, &["2024-05-01T12:00:10Z stdout F run 1"]);
        write_log(tmp.path(), "crash-node1", "app", 2, &["2024-05-01T12:00:30Z stdout F run 2"]);
        assert_eq!(
            run_to_string(&logs_args(tmp.path(), &["crash-node1"])).await.expect("current"),
            "run 2\n"
        );
        assert_eq!(
            run_to_string(&logs_args(tmp.path(), &["crash-node1", "-p"])).await.expect("previous"),
            "run 1\n"
        );
        let tmp2 = tempfile::tempdir().expect("tempdir");
        write_log(tmp2.path(), "once-node1", "app", 0, &["2024-05-01T12:00:00Z stdout F only"]);
        let e = run_to_string(&logs_args(tmp2.path(), &["once-node1", "-p"])).await.expect_err("no previous");
        assert!(matches!(e, LogsError::NoPrevious { .. }), "{e}");
    }

    #[tokio::test]
    async fn unknown_pods_are_reported_with_the_pods_that_exist() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_log(tmp.path(), "web-node1", "httpd", 0, LINES);
        let e = run_to_string(&logs_args(tmp.path(), &["web"])).await.expect_err("not found");
        assert!(e.to_string().contains("pods \"web\" not found"), "{e}");
        assert!(e.to_string().contains("web-node1"), "the hint names the existing pod: {e}");
        let e = run_to_string(&logs_args(tmp.path(), &["../etc"])).await.expect_err("invalid");
        assert!(matches!(e, LogsError::InvalidName { .. }), "{e}");
        let e =
            run_to_string(&logs_args(tmp.path(), &["web-node1", "-n", "a_b"])).await.expect_err("invalid ns");
        assert!(matches!(e, LogsError::InvalidName { .. }), "{e}");
    }

    #[tokio::test]
    async fn symbolic_links_planted_in_the_logs_directory_are_not_followed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "2024-05-01T12:00:00Z stdout F host secret\n").expect("write");
        let logs = tmp.path().join("pods");
        let cdir = logs.join(format!("default_evil-node1_{UID}")).join("app");
        std::fs::create_dir_all(&cdir).expect("mkdir");
        std::os::unix::fs::symlink(&secret, cdir.join("0.log")).expect("symlink file");
        let e = run_to_string(&logs_args(&logs, &["evil-node1"])).await.expect_err("symlinked file");
        assert!(matches!(e, LogsError::NoLogs { .. }), "a symlink is not a log file: {e}");
        // a symlinked container directory is not a container either
        let other = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&other).expect("mkdir");
        std::fs::copy(&secret, other.join("0.log")).expect("copy");
        std::os::unix::fs::symlink(&other, logs.join(format!("default_evil-node1_{UID}")).join("app2"))
            .expect("symlink dir");
        let e =
            run_to_string(&logs_args(&logs, &["evil-node1", "-c", "app2"])).await.expect_err("symlinked dir");
        assert!(matches!(e, LogsError::ContainerNotFound { .. }), "{e}");
        // and opening refuses a symlink even if it appears between listing and opening
        let err = open_beneath(&logs, &[&format!("default_evil-node1_{UID}"), "app", "0.log"])
            .expect_err("nofollow");
        assert!(err.raw_os_error() == Some(40) || err.kind() == ErrorKind::InvalidInput, "{err}");
    }

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Shared {
        fn text(&self) -> String {
            self.0.lock().map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
        }
    }

    async fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn follow_prints_new_lines_survives_rotation_and_stops_when_the_container_restarts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_log(tmp.path(), "web-node1", "httpd", 0, &["2024-05-01T12:00:00Z stdout F first"]);
        let args = logs_args(tmp.path(), &["web-node1", "-f"]);
        let out = Shared::default();
        let mut w = out.clone();
        let task = tokio::spawn(async move { print_logs(&args, &mut w, Duration::from_millis(10)).await });
        eventually("the existing line", || out.text() == "first\n").await;

        let append = |s: &str| {
            let mut f = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
            f.write_all(s.as_bytes()).expect("append");
        };
        append("2024-05-01T12:00:01Z stdout P half");
        sleep(Duration::from_millis(50)).await;
        assert_eq!(out.text(), "first\n", "an unterminated record waits for its newline");
        append("\n2024-05-01T12:00:01Z stdout F  way\n2024-05-01T12:00:02Z stdout F done\n");
        eventually("appended lines", || out.text() == "first\nhalf way\ndone\n").await;

        // rotation: the file is renamed away and a new one created
        std::fs::rename(&path, path.with_extension("log.20240501-120003")).expect("rotate");
        std::fs::write(&path, "2024-05-01T12:00:04Z stdout F after rotation\n").expect("new file");
        eventually("the rotated file's line", || out.text().ends_with("after rotation\n")).await;

        // the container restarts: 1.log appears, follow ends
        write_log(tmp.path(), "web-node1", "httpd", 1, &["2024-05-01T12:00:05Z stdout F next instance"]);
        let r =
            tokio::time::timeout(Duration::from_secs(10), task).await.expect("follow ended").expect("task");
        r.expect("no error");
        assert!(!out.text().contains("next instance"), "the next instance is not part of this follow");
    }

    #[tokio::test]
    async fn since_since_time_and_limit_bytes_select_the_output() {
        let tmp = tempfile::tempdir().expect("tempdir");
        write_log(tmp.path(), "web-node1", "httpd", 0, LINES);
        let run = |flags: &'static [&'static str]| {
            let args = logs_args(tmp.path(), &[&["web-node1"][..], flags].concat());
            async move { run_to_string(&args).await }
        };
        assert_eq!(run(&["--since-time", "2024-05-01T12:00:01.5Z"]).await.expect("logs"), "long line\nbye\n");
        assert_eq!(
            run(&["--since-time", "2024-05-01T12:00:01.5Z", "--timestamps", "--tail", "1"])
                .await
                .expect("logs"),
            "2024-05-01T12:00:03.000000001Z bye\n"
        );
        assert_eq!(run(&["--limit-bytes", "8"]).await.expect("logs"), "hello\noo");
        assert_eq!(run(&["--limit-bytes", "0"]).await.expect("logs"), "hello\noops\nlong line\nbye\n");
        // the lines are from 2024: none is newer than an hour, all are newer than 100000 days
        assert_eq!(run(&["--since", "1h"]).await.expect("logs"), "");
        assert_eq!(run(&["--since", "2400000h"]).await.expect("logs"), "hello\noops\nlong line\nbye\n");
        let e = run(&["--since-time", "yesterday"]).await.expect_err("bad time");
        assert!(matches!(e, LogsError::BadSinceTime(_)), "{e}");
        let conflict = Cli::try_parse_from([
            "nodelet",
            "logs",
            "x",
            "--since",
            "1m",
            "--since-time",
            "2024-05-01T12:00:00Z",
        ]);
        assert!(conflict.is_err(), "--since and --since-time exclude each other");
        assert!(Cli::try_parse_from(["nodelet", "logs", "x", "--since", "5"]).is_err(), "needs a unit");
    }

    #[test]
    fn since_counts_back_from_now() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let now: k8s_openapi::jiff::Timestamp = "2026-01-02T03:04:05Z".parse().expect("time");
        let at = |flags: &[&str]| since(&logs_args(tmp.path(), flags), now).map(|t| t.map(|t| t.to_string()));
        assert_eq!(at(&["p", "--since", "2m5s"]).ok(), Some(Some("2026-01-02T03:02:00Z".to_owned())));
        assert_eq!(at(&["p", "--since", "0s"]).ok(), Some(None));
        assert_eq!(at(&["p"]).ok(), Some(None));
    }

    #[tokio::test]
    async fn an_unterminated_last_line_is_printed_without_follow() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = write_log(tmp.path(), "web-node1", "httpd", 0, &["2024-05-01T12:00:00Z stdout F one"]);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(b"2024-05-01T12:00:01Z stdout F two").expect("append");
        let out = run_to_string(&logs_args(tmp.path(), &["web-node1"])).await.expect("logs");
        assert_eq!(out, "one\ntwo\n");
    }
}
