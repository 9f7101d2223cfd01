//! `nodelet cp`: copies files and directories to and from a container the way `kubectl cp` does, with tar
//! over exec sessions ([`super::session`]).
//!
//! - From a pod (`[NS/]POD:SRC DEST`): `tar cf - SRC` runs in the container and its archive is unpacked
//!   locally with the `tar` crate, each entry's name less SRC's path put under DEST (so a file is written
//!   as DEST, a directory's contents into DEST). The archive is hostile input: entries whose names would
//!   leave DEST (`..`, absolute names), that would be written through a symbolic link, symbolic and hard
//!   links themselves, and special files are skipped with a warning; an entry not under SRC's path ends
//!   the copy ("tar contents corrupted"), as in kubectl.
//! - To a pod (`SRC [NS/]POD:DEST`): when DEST is a directory in the container (`test -d`), the copy goes
//!   to DEST/basename(SRC), else to DEST. The archive (one entry named after the destination's last
//!   component, recursively for a directory; symbolic links archived as links) is built locally into a
//!   temporary file and sent to `tar xmf - -C DIR` in the container over a session with stdin (SPDY, whose
//!   end of stdin reaches the container; see [`super::session`]). busybox's tar reads its input to the end
//!   even after the end-of-archive blocks, so the container runs `head -c SIZE | tar xmf - -C DIR` (a
//!   fixed script, the size and directory passed as arguments, never spliced into it): `head` ends the
//!   input after exactly the archive's bytes; when tar fails early, `cat` reads the rest, because
//!   containerd 1.6 does not end a session whose input it cannot hand to the process. The container needs
//!   `sh`, `head`, `cat` and `tar`.
//!
//! A failing remote command (a path that does not exist, a directory that cannot be written) is an error
//! with tar's message and a nonzero exit.

use std::ffi::OsStr;
use std::io::{Read, Seek as _, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;

use super::session::{self, Kind, Output, Session, Target};
use super::stream::{MainPort, StreamError};
use crate::args::CpArgs;

/// How much of a remote command's stderr is kept.
const MAX_STDERR: usize = 64 * 1024;
/// Size of the chunks of the archive sent to the container.
const CHUNK: usize = 32 * 1024;
/// The upload script: `$1` bytes of stdin unpacked into `$2` (see the module docs). Whatever tar leaves
/// unread (it failed) is read to its end: containerd 1.6 does not end an exec session while input it
/// was given cannot be written to the process.
const UNPACK_SCRIPT: &str = r#"head -c "$1" | { tar xmf - -C "$2"; s=$?; cat >/dev/null; exit $s; }"#;

/// Why `nodelet cp` failed.
#[derive(Debug, thiserror::Error)]
pub enum CpError {
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// The local source does not exist.
    #[error("{}: no such file or directory in the local filesystem", .0.display())]
    LocalMissing(PathBuf),
    /// The session failed.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// Local I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The command in the container failed.
    #[error("{command} in the container exited with {code}{}", stderr_suffix(.stderr))]
    Remote {
        /// The command, for the message.
        command: String,
        /// Its exit code.
        code: i32,
        /// What it said on stderr.
        stderr: String,
    },
    /// The archive has an entry that is not under the copied path.
    #[error("tar contents corrupted: entry {0:?} is not under the copied path")]
    Corrupted(String),
}

/// Why a directory of an unpacked entry could not be made (the entry is skipped with a warning).
#[derive(Debug, thiserror::Error)]
enum DirError {
    /// Creating a directory failed.
    #[error("cannot create {}: {source}", .path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A component is a symbolic link.
    #[error("{} is a symbolic link; not following it", .0.display())]
    Symlink(PathBuf),
    /// A component is something else than a directory.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A component could not be inspected.
    #[error("{}: {source}", .path.display())]
    Inspect {
        /// The component.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() { String::new() } else { format!(": {stderr}") }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CpError {
    let what = what.into();
    move |source| CpError::Io { what, source }
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Spec {
    /// A local path.
    Local(PathBuf),
    /// `[NAMESPACE/]POD:PATH`.
    Remote {
        /// The namespace, when given.
        namespace: Option<String>,
        /// The pod.
        pod: String,
        /// The path in the container.
        path: String,
    },
}

/// kubectl's `extractFileSpec`: a spec with a `:` is remote, the part before it `[NAMESPACE/]POD`.
fn parse_spec(arg: &str) -> Result<Spec, CpError> {
    let bad =
        || CpError::Usage("filespec must match the canonical format: [[namespace/]pod:]file/path".into());
    let Some((pod_spec, path)) = arg.split_once(':') else { return Ok(Spec::Local(PathBuf::from(arg))) };
    let (namespace, pod) = match pod_spec.split('/').collect::<Vec<_>>()[..] {
        [pod] => (None, pod),
        [namespace, pod] if !namespace.is_empty() => (Some(namespace.to_owned()), pod),
        _ => return Err(bad()),
    };
    if pod.is_empty() {
        return Err(bad());
    }
    Ok(Spec::Remote { namespace, pod: pod.to_owned(), path: path.to_owned() })
}

/// `nodelet cp SRC DEST`.
pub(crate) async fn run(args: &CpArgs) -> Result<(), CpError> {
    match (parse_spec(&args.src)?, parse_spec(&args.dest)?) {
        (Spec::Local(src), Spec::Remote { namespace, pod, path }) => {
            let namespace = namespace.unwrap_or_else(|| args.namespace.clone());
            let remote = Remote::new(args, namespace, pod).await?;
            upload(&remote, &src, &path).await
        }
        (Spec::Remote { namespace, pod, path }, Spec::Local(dest)) => {
            let namespace = namespace.unwrap_or_else(|| args.namespace.clone());
            let remote = Remote::new(args, namespace, pod).await?;
            download(&remote, &path, &dest).await
        }
        (Spec::Local(_), Spec::Local(_)) => {
            Err(CpError::Usage("one of src or dest must be a remote file specification".into()))
        }
        (Spec::Remote { .. }, Spec::Remote { .. }) => {
            Err(CpError::Usage("one of src or dest must be a local file specification".into()))
        }
    }
}

/// The container commands run in.
#[derive(Debug)]
struct Remote {
    main: MainPort,
    namespace: String,
    pod: String,
    container: String,
}

impl Remote {
    async fn new(args: &CpArgs, namespace: String, pod: String) -> Result<Self, CpError> {
        let main = MainPort::new(&args.server)?;
        let container =
            session::container_or_default(&args.server, &namespace, &pod, args.container.as_deref()).await?;
        Ok(Self { main, namespace, pod, container })
    }

    /// Runs `command` with `input` (if any) on its stdin; returns its exit code.
    async fn exec<O: Output>(
        &self,
        command: &[String],
        input: Option<mpsc::Receiver<Vec<u8>>>,
        output: &mut O,
    ) -> Result<i32, CpError> {
        let target = Target {
            kind: Kind::Exec,
            namespace: &self.namespace,
            pod: &self.pod,
            container: &self.container,
            command,
            stdin: input.is_some(),
            tty: false,
        };
        let session = Session::open(&self.main, &target).await?;
        let status = session.relay(input, false, output).await?;
        Ok(session::exit_code(status.as_ref())?)
    }
}

/// Output of a command whose stdout does not matter: stdout dropped, stderr kept (bounded).
#[derive(Debug, Default)]
struct Collect {
    stderr: Vec<u8>,
}

impl Output for Collect {
    async fn write(&mut self, stream: u8, data: &[u8]) -> Result<(), StreamError> {
        if stream == 2 {
            keep_stderr(&mut self.stderr, data);
        }
        Ok(())
    }
}

fn keep_stderr(buf: &mut Vec<u8>, data: &[u8]) {
    let room = MAX_STDERR.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

/// Stdout to the local extraction, stderr kept.
#[derive(Debug)]
struct ToExtractor {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    stderr: Vec<u8>,
}

impl Output for ToExtractor {
    async fn write(&mut self, stream: u8, data: &[u8]) -> Result<(), StreamError> {
        if stream == 2 {
            keep_stderr(&mut self.stderr, data);
        } else if let Some(tx) = &self.tx
            && tx.send(data.to_vec()).await.is_err()
        {
            // the extraction stopped (its error is reported); the rest of the archive is not needed
            self.tx = None;
        }
        Ok(())
    }
}

/// The lines of a remote tar's stderr worth showing after a success (not busybox's or GNU tar's note
/// about removing the leading `/`).
fn tar_notes(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| !l.to_ascii_lowercase().contains("removing leading"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Go's `path.Clean` for a container path.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// The prefix the remote tar's entry names have for `src` (kubectl's `stripPathShortcuts` of the cleaned
/// path without leading slashes).
fn archive_prefix(src: &str) -> String {
    let mut p = clean(src.trim_start_matches('/'));
    while let Some(rest) = p.strip_prefix("../") {
        p = rest.to_owned();
    }
    if p == "." || p == ".." {
        p.clear();
    }
    p.trim_start_matches('/').to_owned()
}

/// Strips trailing slashes except from `/`.
fn trim_trailing_slashes(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() && path.starts_with('/') { "/" } else { trimmed }
}

async fn download(remote: &Remote, src: &str, dest: &Path) -> Result<(), CpError> {
    if src.is_empty() {
        return Err(CpError::Usage("filepath can not be empty".into()));
    }
    let src = trim_trailing_slashes(src).to_owned();
    let prefix = archive_prefix(&src);
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    let dest_owned = dest.to_owned();
    let extraction = tokio::task::spawn_blocking(move || {
        extract(ChannelReader { rx, chunk: Vec::new(), at: 0 }, &prefix, &dest_owned, &mut std::io::stderr())
    });
    let command = ["tar".to_owned(), "cf".to_owned(), "-".to_owned(), src.clone()];
    let mut output = ToExtractor { tx: Some(tx), stderr: Vec::new() };
    let code = remote.exec(&command, None, &mut output).await;
    output.tx = None; // the end of the archive for the extraction
    let extracted =
        extraction.await.map_err(|e| CpError::Usage(format!("the local extraction failed: {e}")))?;
    let code = code?;
    if code != 0 {
        return Err(CpError::Remote {
            command: format!("tar cf - {src}"),
            code,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    extracted?;
    eprint!("{}", tar_notes(&output.stderr));
    Ok(())
}

async fn upload(remote: &Remote, src: &Path, dest: &str) -> Result<(), CpError> {
    if dest.is_empty() || src.as_os_str().is_empty() {
        return Err(CpError::Usage("filepath can not be empty".into()));
    }
    let meta = std::fs::metadata(src).map_err(|_| CpError::LocalMissing(src.to_owned()))?;
    let mut dest = trim_trailing_slashes(dest).to_owned();
    let test = ["test".to_owned(), "-d".to_owned(), dest.clone()];
    if remote.exec(&test, None, &mut Collect::default()).await? == 0 {
        let base = local_base_name(src)?;
        dest = if dest == "/" { format!("/{base}") } else { format!("{dest}/{base}") };
    }
    let (dir, name) = match dest.rsplit_once('/') {
        Some(("", name)) => ("/".to_owned(), name.to_owned()),
        Some((dir, name)) => (dir.to_owned(), name.to_owned()),
        None => (".".to_owned(), dest.clone()),
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(CpError::Usage(format!("cannot copy to {dest:?}: name a file or directory")));
    }
    let src_owned = src.to_owned();
    let (file, size) = tokio::task::spawn_blocking(move || make_archive(&src_owned, meta.is_dir(), &name))
        .await
        .map_err(|e| CpError::Usage(format!("building the archive failed: {e}")))??;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    // Bare spawn: the upload's archive feeder, per command; it ends with the archive or when the receiver goes.
    tokio::spawn(async move {
        let mut file = tokio::fs::File::from_std(file);
        let mut buf = vec![0_u8; CHUNK];
        loop {
            match file.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the archive");
                    return;
                }
            }
        }
    });
    let command: Vec<String> =
        ["sh", "-c", UNPACK_SCRIPT, "nodelet-cp", &size.to_string(), &dir].map(str::to_owned).to_vec();
    let mut output = Collect::default();
    let code = remote.exec(&command, Some(rx), &mut output).await?;
    if code != 0 {
        return Err(CpError::Remote {
            command: format!("tar xmf - -C {dir}"),
            code,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    eprint!("{}", tar_notes(&output.stderr));
    Ok(())
}

/// The last component of a local path (of its absolute form for `.` and the like).
fn local_base_name(src: &Path) -> Result<String, CpError> {
    let name = match src.file_name() {
        Some(n) => n.to_owned(),
        None => std::fs::canonicalize(src)
            .map_err(io_err(format!("resolving {}", src.display())))?
            .file_name()
            .map(OsStr::to_owned)
            .ok_or_else(|| CpError::Usage(format!("cannot copy {}: it has no name", src.display())))?,
    };
    name.into_string().map_err(|n| CpError::Usage(format!("the name {n:?} is not UTF-8")))
}

/// Writes the archive of `src` (as `name`) into a temporary file; returns it at its start, and its size.
fn make_archive(src: &Path, is_dir: bool, name: &str) -> Result<(std::fs::File, u64), CpError> {
    let file = tempfile::tempfile().map_err(io_err("creating a temporary file"))?;
    let mut builder = tar::Builder::new(file);
    builder.follow_symlinks(false);
    let added =
        if is_dir { builder.append_dir_all(name, src) } else { builder.append_path_with_name(src, name) };
    added.map_err(io_err(format!("archiving {}", src.display())))?;
    let mut file = builder.into_inner().map_err(io_err("writing the archive"))?;
    let size = file.stream_position().map_err(io_err("writing the archive"))?;
    file.seek(SeekFrom::Start(0)).map_err(io_err("writing the archive"))?;
    Ok((file, size))
}

/// Blocking reads of the chunks a session sends.
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Unpacks the archive of a remote path whose entries are named `prefix[/…]` into `dest` (see the module
/// docs); warnings about skipped entries go to `warnings`.
fn extract(reader: impl Read, prefix: &str, dest: &Path, warnings: &mut dyn Write) -> Result<(), CpError> {
    let mut archive = tar::Archive::new(reader);
    let read_err = || io_err("reading the archive");
    let mut warn = |message: String| {
        let _ = writeln!(warnings, "warning: {message}");
    };
    for entry in archive.entries().map_err(read_err())? {
        let mut entry = entry.map_err(read_err())?;
        let raw = entry.path_bytes().into_owned();
        let mut name: &[u8] = &raw;
        while let Some(rest) = name.strip_prefix(b"/").or_else(|| name.strip_prefix(b"./")) {
            name = rest;
        }
        let Some(rel) = name.strip_prefix(prefix.as_bytes()) else {
            return Err(CpError::Corrupted(String::from_utf8_lossy(&raw).into_owned()));
        };
        if !prefix.is_empty() && !rel.is_empty() && rel[0] != b'/' {
            return Err(CpError::Corrupted(String::from_utf8_lossy(&raw).into_owned()));
        }
        let parts: Vec<&[u8]> = rel.split(|b| *b == b'/').filter(|p| !p.is_empty() && *p != b".").collect();
        let mut target = dest.to_owned();
        for part in &parts {
            target.push(OsStr::from_bytes(part));
        }
        let shown = target.display().to_string();
        if parts.iter().any(|p| *p == b"..") {
            warn(format!("file {shown:?} is outside target destination, skipping"));
            continue;
        }
        let kind = entry.header().entry_type();
        let (dirs, is_dir) = if kind.is_dir() {
            (&parts[..], true)
        } else {
            (parts.split_last().map_or(&parts[..], |(_, dirs)| dirs), false)
        };
        match kind {
            k if k.is_dir() || k.is_file() || k == tar::EntryType::Continuous => {}
            k if k.is_symlink() => {
                let link = entry.link_name_bytes().map(|l| String::from_utf8_lossy(&l).into_owned());
                warn(format!("skipping symlink: {shown:?} -> {:?}", link.unwrap_or_default()));
                continue;
            }
            k if k.is_hard_link() => {
                warn(format!("skipping hard link: {shown:?}"));
                continue;
            }
            k if k.is_pax_global_extensions() => continue,
            k => {
                warn(format!("skipping {shown:?}: not a regular file or directory ({k:?})"));
                continue;
            }
        }
        let made = match (parts.is_empty(), dest.parent()) {
            // a file copied as `dest` itself: only its directory is made
            (true, Some(parent)) if !is_dir && !parent.as_os_str().is_empty() => {
                std::fs::create_dir_all(parent)
                    .map_err(|source| DirError::Create { path: parent.to_owned(), source })
            }
            (true, _) if !is_dir => Ok(()),
            _ => make_dirs_beneath(dest, dirs),
        };
        if let Err(message) = made {
            warn(format!("skipping {shown:?}: {message}"));
            continue;
        }
        if is_dir {
            continue;
        }
        // a regular file: never written through a symbolic link (tar replaces what is there)
        entry.unpack(&target).map_err(io_err(format!("writing {shown}")))?;
    }
    Ok(())
}

/// Creates `dest` and the directories `parts` beneath it, refusing to go through a symbolic link or
/// anything else that is not a directory beneath `dest`.
fn make_dirs_beneath(dest: &Path, parts: &[&[u8]]) -> Result<(), DirError> {
    std::fs::create_dir_all(dest).map_err(|source| DirError::Create { path: dest.to_owned(), source })?;
    let mut path = dest.to_owned();
    for part in parts {
        path.push(OsStr::from_bytes(part));
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if m.is_symlink() => {
                return Err(DirError::Symlink(path));
            }
            Ok(_) => return Err(DirError::NotADirectory(path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&path)
                    .map_err(|source| DirError::Create { path: path.clone(), source })?;
            }
            Err(source) => return Err(DirError::Inspect { path, source }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_parsed_like_kubectls() {
        assert_eq!(parse_spec("./local").ok(), Some(Spec::Local("./local".into())));
        assert_eq!(
            parse_spec("web:/tmp/x").ok(),
            Some(Spec::Remote { namespace: None, pod: "web".into(), path: "/tmp/x".into() })
        );
        assert_eq!(
            parse_spec("ns/web:rel").ok(),
            Some(Spec::Remote { namespace: Some("ns".into()), pod: "web".into(), path: "rel".into() })
        );
        for bad in [":x", "a/b/c:x", "/web:x", "ns/:x"] {
            assert!(matches!(parse_spec(bad), Err(CpError::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn prefixes_and_paths_are_cleaned_like_kubectls() {
        assert_eq!(archive_prefix("/tmp/dir"), "tmp/dir");
        assert_eq!(archive_prefix("/tmp/../etc/./hosts"), "etc/hosts");
        assert_eq!(archive_prefix("../../x"), "x");
        assert_eq!(archive_prefix("/"), "");
        assert_eq!(archive_prefix("."), "");
        assert_eq!(trim_trailing_slashes("/tmp/d//"), "/tmp/d");
        assert_eq!(trim_trailing_slashes("/"), "/");
        assert_eq!(clean("a/../../b"), "../b");
    }

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h
    }

    /// An archive with raw names (the `tar` crate refuses `..` when building; a hostile one does not).
    fn hostile_archive(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, kind, data, link) in entries {
            let mut h = header(*kind, data.len() as u64);
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            if !link.is_empty() {
                h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
            h.set_cksum();
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    #[test]
    fn a_directory_is_unpacked_into_dest_and_a_file_as_dest() {
        use tar::EntryType as T;
        let tmp = tempfile::tempdir().expect("tempdir");
        let archive = hostile_archive(&[
            ("tmp/d/", T::Directory, b"", ""),
            ("tmp/d/a", T::Regular, b"A", ""),
            ("tmp/d/sub/", T::Directory, b"", ""),
            ("tmp/d/sub/b", T::Regular, b"BB", ""),
        ]);
        let dest = tmp.path().join("out");
        let mut warnings = Vec::new();
        extract(&archive[..], "tmp/d", &dest, &mut warnings).expect("extract");
        assert_eq!(std::fs::read(dest.join("a")).ok(), Some(b"A".to_vec()));
        assert_eq!(std::fs::read(dest.join("sub/b")).ok(), Some(b"BB".to_vec()));
        assert!(warnings.is_empty(), "{}", String::from_utf8_lossy(&warnings));

        let archive = hostile_archive(&[("etc/hosts", T::Regular, b"127.0.0.1 localhost\n", "")]);
        let file = tmp.path().join("hosts-copy");
        extract(&archive[..], "etc/hosts", &file, &mut warnings).expect("extract");
        assert_eq!(std::fs::read(&file).ok(), Some(b"127.0.0.1 localhost\n".to_vec()));
    }

    #[test]
    fn hostile_entries_stay_beneath_the_destination() {
        use tar::EntryType as T;
        let tmp = tempfile::tempdir().expect("tempdir");
        let dest = tmp.path().join("out");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).expect("mkdir");
        let archive = hostile_archive(&[
            ("d/../../escaped", T::Regular, b"x", ""),
            ("d/link", T::Symlink, b"", "../outside"),
            ("d/link/through", T::Regular, b"x", ""),
            ("d/hard", T::Link, b"", "/etc/passwd"),
            ("d/fifo", T::Fifo, b"", ""),
            ("d/ok", T::Regular, b"fine", ""),
        ]);
        // a symbolic link already in the destination is not followed either
        std::fs::create_dir_all(&dest).expect("mkdir");
        std::os::unix::fs::symlink(&outside, dest.join("planted")).expect("symlink");
        let more =
            hostile_archive(&[("d/planted/x", T::Regular, b"x", ""), ("d/planted", T::Regular, b"y", "")]);
        let mut warnings = Vec::new();
        extract(&archive[..], "d", &dest, &mut warnings).expect("extract");
        extract(&more[..], "d", &dest, &mut warnings).expect("extract");
        let warnings = String::from_utf8_lossy(&warnings).into_owned();
        assert!(!tmp.path().join("escaped").exists());
        assert_eq!(std::fs::read_dir(&outside).map(Iterator::count).ok(), Some(0), "nothing written outside");
        assert!(
            !dest.join("link").is_symlink() && !dest.join("hard").exists() && !dest.join("fifo").exists()
        );
        // the skipped link's name became a plain directory for the entry beneath it
        assert_eq!(std::fs::read(dest.join("link/through")).ok(), Some(b"x".to_vec()));
        assert_eq!(std::fs::read(dest.join("ok")).ok(), Some(b"fine".to_vec()));
        // the planted link itself is replaced by the regular file, never written through
        assert_eq!(std::fs::read(dest.join("planted")).ok(), Some(b"y".to_vec()));
        for expected in [
            "is outside target destination, skipping",
            "skipping symlink",
            "skipping hard link",
            "not a regular file or directory",
            "is a symbolic link; not following it",
        ] {
            assert!(warnings.contains(expected), "{expected:?} in {warnings}");
        }
        // an entry outside the copied path ends the copy
        let archive = hostile_archive(&[("etc/shadow", T::Regular, b"x", "")]);
        let e = extract(&archive[..], "tmp/d", &dest, &mut Vec::new()).expect_err("corrupted");
        assert!(matches!(e, CpError::Corrupted(_)), "{e}");
        let archive = hostile_archive(&[("tmp/dx", T::Regular, b"x", "")]);
        assert!(matches!(extract(&archive[..], "tmp/d", &dest, &mut Vec::new()), Err(CpError::Corrupted(_))));
    }

    #[test]
    fn archives_are_named_after_the_destination() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("sub")).expect("mkdir");
        std::fs::write(src.join("sub/f"), "data").expect("write");
        let (file, size) = make_archive(&src, true, "renamed").expect("archive");
        assert_eq!(size % 512, 0);
        let mut names: Vec<String> = tar::Archive::new(file)
            .entries()
            .expect("entries")
            .map(|e| e.expect("entry").path().expect("path").display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["renamed/", "renamed/sub", "renamed/sub/f"]);
    }
}
