//! The streaming commands against the real containerd: `nodelet attach`, `nodelet cp` (tar over exec, both
//! ways, files and directories) and `nodelet exec -it` on a pseudo-terminal (window size, SIGWINCH, Ctrl-C,
//! exit code, the local terminal mode restored).

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt as _;

use crate::exec::{EXEC_LIMIT, nodelet_streaming_cli, sha256_hex, shell_pod};
use crate::support::{Nodelet, TOKEN, env_or_skip};

/// `nodelet ARGS[0] --server … --certificate-authority … ARGS[1..]` ready to spawn (token in the env).
fn nodelet_command(n: &Nodelet, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_nodelet"));
    command
        .args(&args[..1])
        .arg("--server")
        .arg(n.main_url(""))
        .arg("--certificate-authority")
        .arg(n.root_dir().join("pki").join("nodelet.crt"))
        .args(&args[1..])
        .env("NODELET_TOKEN", TOKEN)
        .env_remove("RUST_LOG");
    command
}

#[tokio::test]
async fn nodelet_attach_shows_the_output_of_the_main_process() {
    let env = env_or_skip!("nodelet_attach_shows_the_output_of_the_main_process");
    let n = Nodelet::start(&env, "attach-cli").await;
    let (pod, _) = shell_pod(&n, "attach").await;

    let mut attach = tokio::process::Command::from(nodelet_command(&n, &["attach", &pod, "-c", "ticker"]))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("nodelet attach");
    let mut lines = tokio::io::BufReader::new(attach.stdout.take().expect("stdout")).lines();
    let ticks = tokio::time::timeout(EXEC_LIMIT, async {
        let mut ticks = 0;
        while ticks < 3 {
            match lines.next_line().await.expect("read stdout") {
                Some(line) => {
                    assert_eq!(line, "tick", "only the ticker's output");
                    ticks += 1;
                }
                None => break,
            }
        }
        ticks
    })
    .await
    .expect("ticks in time");
    assert_eq!(ticks, 3, "attach ended early: {:?}", attach.wait_with_output().await);

    // an unknown container is an error with a nonzero exit
    let (code, _, err) = nodelet_streaming_cli(&n, &["attach", &pod, "-c", "nope"], "").await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("container not found"), "{err}");
    n.shutdown().await;
}

/// Deterministic incompressible-looking bytes (xorshift).
fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Every file under `dir` (relative path, contents), sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = e.expect("entry").path();
            let rel = path.strip_prefix(base).expect("beneath").display().to_string();
            if path.is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
                walk(base, &path, out);
            } else {
                out.push((rel, std::fs::read(&path).expect("read")));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[tokio::test]
async fn nodelet_cp_copies_files_and_directories_both_ways() {
    let env = env_or_skip!("nodelet_cp_copies_files_and_directories_both_ways");
    let n = Nodelet::start(&env, "cp-cli").await;
    let (pod, _) = shell_pod(&n, "cp").await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let run = |args: Vec<String>| {
        let n = &n;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            nodelet_streaming_cli(n, &args, "").await
        }
    };
    let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    let local = |p: &Path| p.to_str().expect("utf8").to_owned();

    // a file of several MiB, up and down, compared by SHA-256
    let big = pseudo_random(5 * 1024 * 1024 + 123, 0x9e37_79b9_7f4a_7c15);
    let big_path = tmp.path().join("big.bin");
    std::fs::write(&big_path, &big).expect("write");
    let (code, out, err) = run(s(&["cp", &local(&big_path), &format!("{pod}:/tmp/big"), "-c", "app"])).await;
    assert_eq!(code, 0, "upload: {out} {err}");
    let (code, out, err) = run(s(&["exec", &pod, "-c", "app", "--", "sha256sum", "/tmp/big"])).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.split_whitespace().next(), Some(sha256_hex(&big).as_str()), "uploaded intact");
    let back = tmp.path().join("big.back");
    let (code, out, err) =
        run(s(&["cp", &format!("default/{pod}:/tmp/big"), &local(&back), "-c", "app"])).await;
    assert_eq!(code, 0, "download: {out} {err}");
    assert_eq!(sha256_hex(&std::fs::read(&back).expect("read")), sha256_hex(&big), "downloaded intact");
    assert!(!err.contains("removing leading"), "tar's note is not shown: {err}");

    // a directory with nested files, to a new path, then into an existing directory (kubectl's naming)
    let dir = tmp.path().join("tree");
    std::fs::create_dir_all(dir.join("a/b")).expect("mkdir");
    std::fs::create_dir_all(dir.join("empty")).expect("mkdir");
    std::fs::write(dir.join("top.txt"), "top\n").expect("write");
    std::fs::write(dir.join("a/mid.txt"), "mid\n").expect("write");
    std::fs::write(dir.join("a/b/deep.bin"), pseudo_random(70_000, 7)).expect("write");
    let (code, _, err) = run(s(&["cp", &local(&dir), &format!("{pod}:/tmp/copied"), "-c", "app"])).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(s(&["cp", &local(&dir), &format!("{pod}:/tmp"), "-c", "app"])).await;
    assert_eq!(code, 0, "{err}");
    let listing = "cd /tmp/copied && find . | sort && cat a/mid.txt && cd /tmp/tree && find . | sort";
    let (code, out, err) = run(s(&["exec", &pod, "-c", "app", "--", "sh", "-c", listing])).await;
    assert_eq!(code, 0, "{err}");
    let files = ".\n./a\n./a/b\n./a/b/deep.bin\n./a/mid.txt\n./empty\n./top.txt\n";
    assert_eq!(out, format!("{files}mid\n{files}"));
    let down = tmp.path().join("down");
    let (code, _, err) = run(s(&["cp", &format!("{pod}:/tmp/copied/"), &local(&down), "-c", "app"])).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(tree(&down), tree(&dir), "the directory comes back as it went");

    // a pod path that does not exist: a clear error, nonzero exit
    let (code, _, err) =
        run(s(&["cp", &format!("{pod}:/no/such/file"), &local(&tmp.path().join("x")), "-c", "app"])).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/no/such/file") && err.contains("No such file or directory"), "{err}");
    assert!(!tmp.path().join("x").exists());
    let (code, _, err) =
        run(s(&["cp", &local(&big_path), &format!("{pod}:/no/such/dir/x"), "-c", "app"])).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("/no/such/dir") && err.contains("exited with"), "{err}");
    let (code, _, err) = run(s(&["cp", &local(&tmp.path().join("missing")), &format!("{pod}:/tmp/x")])).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no such file or directory in the local filesystem"), "{err}");
    n.shutdown().await;
}

/// A pseudo-terminal pair: the master, and the slave's path.
fn open_pty() -> (OwnedFd, String) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    (master, name.into_string().expect("utf8 name"))
}

fn set_size(fd: &OwnedFd, rows: u16, cols: u16) {
    let size = rustix::termios::Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    rustix::termios::tcsetwinsize(fd, size).expect("TIOCSWINSZ");
}

/// What the terminal showed so far.
#[derive(Clone, Default)]
struct Screen(Arc<Mutex<Vec<u8>>>);

impl Screen {
    fn text(&self) -> String {
        self.0.lock().map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// Waits until `needle` appears after byte `from`; returns the end of the screen then.
    async fn wait_for(&self, needle: &str, from: usize, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.text();
            if text.get(from..).is_some_and(|t| t.contains(needle)) {
                return text.len();
            }
            assert!(Instant::now() < deadline, "{needle:?} not shown in {limit:?}; screen:\n{text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn len(&self) -> usize {
        self.text().len()
    }
}

#[tokio::test]
async fn nodelet_exec_it_drives_a_shell_on_a_pseudo_terminal() {
    let env = env_or_skip!("nodelet_exec_it_drives_a_shell_on_a_pseudo_terminal");
    let n = Nodelet::start(&env, "exec-pty").await;
    let (pod, _) = shell_pod(&n, "pty").await;

    let (master, slave_path) = open_pty();
    let slave = std::fs::OpenOptions::new().read(true).write(true).open(&slave_path).expect("open the slave");
    set_size(&master, 40, 100);
    let mode_before = format!("{:?}", rustix::termios::tcgetattr(&slave).expect("tcgetattr"));

    // a new session whose controlling terminal is the slave (util-linux setsid: no unsafe pre_exec here)
    let nodelet = nodelet_command(&n, &["exec", "-it", &pod, "-c", "app", "--", "sh"]);
    let mut command = std::process::Command::new("setsid");
    command
        .arg("--ctty")
        .arg(nodelet.get_program())
        .args(nodelet.get_args())
        .envs(nodelet.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env_remove("RUST_LOG")
        .stdin(slave.try_clone().expect("dup"))
        .stdout(slave.try_clone().expect("dup"))
        .stderr(slave.try_clone().expect("dup"));
    let mut child = command.spawn().expect("setsid nodelet exec -it");
    drop(command);
    let child_pid = rustix::process::Pid::from_child(&child);

    let screen = Screen::default();
    let mut reader = std::fs::File::from(master.try_clone().expect("dup master"));
    let shown = screen.clone();
    std::thread::spawn(move || {
        let mut buf = [0_u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut s) = shown.0.lock() {
                s.extend_from_slice(&buf[..n]);
            }
        }
    });
    let mut keyboard = std::fs::File::from(master.try_clone().expect("dup master"));
    let mut type_keys = |keys: &str| keyboard.write_all(keys.as_bytes()).expect("type");

    let at = screen.wait_for("# ", 0, EXEC_LIMIT).await;
    type_keys("stty size\r");
    let at = screen.wait_for("40 100", at, EXEC_LIMIT).await;

    // a new size, and SIGWINCH (the kernel sends one to the foreground group too)
    set_size(&master, 50, 120);
    rustix::process::kill_process(child_pid, rustix::process::Signal::WINCH).expect("SIGWINCH");
    let deadline = Instant::now() + EXEC_LIMIT;
    let mut from = at;
    loop {
        type_keys("stty size\r");
        let text = screen.text();
        tokio::time::sleep(Duration::from_millis(300)).await;
        if screen.text().get(from..).is_some_and(|t| t.contains("50 120")) {
            break;
        }
        assert!(Instant::now() < deadline, "the new size never reached the pod:\n{text}");
        from = screen.len().saturating_sub(16);
    }

    // Ctrl-C interrupts the command in the pod; nodelet and the shell go on
    let at = screen.len();
    type_keys("sleep 100\r");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let interrupted = Instant::now();
    type_keys("\x03");
    type_keys("echo back-$((6*7))\r");
    screen.wait_for("back-42", at, Duration::from_secs(10)).await;
    assert!(interrupted.elapsed() < Duration::from_secs(10), "sleep 100 was interrupted");
    assert!(child.try_wait().expect("try_wait").is_none(), "nodelet still runs after Ctrl-C");

    type_keys("exit 7\r");
    let deadline = Instant::now() + EXEC_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "nodelet exec did not end after exit 7:\n{}", screen.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(7), "{}", screen.text());
    let mode_after = format!("{:?}", rustix::termios::tcgetattr(&slave).expect("tcgetattr"));
    assert_eq!(mode_after, mode_before, "the terminal mode is restored");
    n.shutdown().await;
}
