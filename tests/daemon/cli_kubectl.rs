//! The `nodelet` client commands as kubectl users know them, against a running nodelet: `get events`,
//! `describe pod`, `-l` label selectors, `--field-selector`, `-w`, `-o jsonpath=`, `-o custom-columns=`,
//! kubectl-indented JSON; and the `completion` and `man` commands of the real binary.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{Nodelet, TOKEN, env_or_skip, nodelet_cli, sleep_until_term};

/// Runs `nodelet ARGS…`; returns (success, stdout, stderr).
async fn cli(args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run nodelet {args:?}: {e}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn names(table: &str) -> Vec<String> {
    table.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
}

#[tokio::test]
async fn get_and_describe_select_format_and_watch_like_kubectl() {
    let env = env_or_skip!("get_and_describe_select_format_and_watch_like_kubectl");
    let n = Nodelet::start(&env, "kubectl").await;
    for (name, labels) in
        [("web", json!({"app": "web", "tier": "front"})), ("batch", json!({"app": "batch"}))]
    {
        let mut manifest = n.pod_manifest(
            name,
            json!({"terminationGracePeriodSeconds": 2,
                   "containers": [{"name": "main", "command": sleep_until_term(""),
                                   "env": [{"name": "MODE", "value": "test"}]}]}),
        );
        manifest["metadata"]["labels"] = labels;
        n.write_manifest(&format!("{name}.yaml"), &manifest);
    }
    n.wait_running("web").await;
    n.wait_running("batch").await;
    let (web, batch) = (n.pod_name("web"), n.pod_name("batch"));
    let server = format!("http://127.0.0.1:{}", n.ports().read_only);
    let s = server.as_str();

    // -l, with equality- and set-based requirements
    let table = nodelet_cli(&["get", "pods", "-l", "app=web", "--server", s]).await;
    assert_eq!(names(&table), std::slice::from_ref(&web), "{table}");
    let table = nodelet_cli(&["get", "pods", "-l", "app in (web, batch),tier!=front", "--server", s]).await;
    assert_eq!(names(&table), std::slice::from_ref(&batch), "{table}");
    let table = nodelet_cli(&["get", "pods", "-l", "!tier", "--server", s]).await;
    assert_eq!(names(&table), std::slice::from_ref(&batch), "{table}");
    let (ok, _, err) = cli(&["get", "pods", "-l", "app in", "--server", s]).await;
    assert!(!ok && err.contains("unable to parse requirement: found '', expected: '('"), "{err}");
    let (_, _, err) = cli(&["get", "pods", "-l", "app=nothing", "--server", s]).await;
    assert_eq!(err, "No resources found in default namespace.\n");

    // -o jsonpath, custom-columns, json
    let out = nodelet_cli(&["get", "pods", "-o", "jsonpath={.items[*].metadata.name}", "--server", s]).await;
    assert_eq!(out, format!("{batch} {web}"));
    let out = nodelet_cli(&[
        "get",
        "pods",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}{\"\\t\"}{.status.phase}{\"\\n\"}{end}",
        "--server",
        s,
    ])
    .await;
    assert_eq!(out, format!("{batch}\tRunning\n{web}\tRunning\n"));
    let out = nodelet_cli(&[
        "get",
        "pods",
        "-o",
        "jsonpath={.items[?(@.metadata.labels.app==\"web\")].spec.containers[0].env[0].value}",
        "--server",
        s,
    ])
    .await;
    assert_eq!(out, "test");
    let out = nodelet_cli(&[
        "get",
        "pods",
        "-o",
        "custom-columns=NAME:.metadata.name,APP:.metadata.labels.app,TIER:.metadata.labels.tier",
        "--server",
        s,
    ])
    .await;
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows,
        [
            vec!["NAME", "APP", "TIER"],
            vec![batch.as_str(), "batch", "<none>"],
            vec![web.as_str(), "web", "front"]
        ]
    );
    let out = nodelet_cli(&["get", "pods", &web, "-o", "json", "--server", s]).await;
    assert!(
        out.starts_with(
            "{\n    \"apiVersion\": \"v1\",\n    \"kind\": \"Pod\",\n    \"metadata\": {\n        "
        ),
        "{out}"
    );
    assert!(out.ends_with("}\n"));
    let out = nodelet_cli(&["get", "pods", "-o", "json", "--server", s]).await;
    let list: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!((list["kind"].as_str(), list["items"].as_array().map(Vec::len)), (Some("List"), Some(2)));

    // get events: the container lifecycle events nodelet reports, kubectl's columns
    let events = n
        .wait_for("Started events of both pods", Duration::from_secs(20), async || {
            let t = n.cli_main(&["get", "events"]).await;
            (t.contains(&format!("pod/{web}")) && t.contains(&format!("pod/{batch}"))).then_some(t)
        })
        .await;
    let header: Vec<&str> = events
        .lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(header, ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{events}");
    assert!(
        events.lines().any(|l| l.contains("Normal")
            && l.contains("Started")
            && l.contains(&format!("pod/{web}"))
            && l.ends_with("Started container main")),
        "{events}"
    );
    let mine =
        n.cli_main(&["get", "events", "--field-selector", &format!("involvedObject.name={web}")]).await;
    assert!(mine.contains(&format!("pod/{web}")) && !mine.contains(&format!("pod/{batch}")), "{mine}");
    let (main, ca) = (n.main_url(""), n.root_dir().join("pki/nodelet.crt").display().to_string());
    let main_flags = ["--server", main.as_str(), "--certificate-authority", ca.as_str(), "--token", TOKEN];
    let mut args = vec!["get", "events", "--field-selector", "spec.nodeName=x"];
    args.extend(main_flags);
    let (ok, _, err) = cli(&args).await;
    assert!(!ok && err.contains("field label not supported: spec.nodeName"), "{err}");

    // describe pod: a name prefix finds the static pod; its events come last
    let text = n.cli_main(&["describe", "pod", "web"]).await;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name}: in\n{text}"))
            .to_owned()
    };
    assert_eq!(field("Name"), web);
    assert_eq!(field("Namespace"), "default");
    assert_eq!(field("Status"), "Running");
    assert!(field("Node").starts_with(&format!("{}/", n.node())), "{text}");
    assert_eq!(field("Labels"), "app=web");
    assert_eq!(field("QoS Class"), "BestEffort");
    for line in [
        "Containers:",
        "  main:",
        "    State:          Running",
        "    Ready:          True",
        "      MODE:  test",
        "Conditions:",
        "Events:",
    ] {
        assert!(
            text.contains(&format!("{line}\n")) || text.contains(&format!("{line} ")),
            "{line:?} missing:\n{text}"
        );
    }
    let events_part = text.split("Events:").nth(1).unwrap_or_default();
    assert!(events_part.contains("Started container main") && events_part.contains("nodelet"), "{text}");
    assert!(!events_part.contains(&batch), "only the pod's own events: {text}");
    let (ok, _, err) = cli(&["describe", "pod", "nope", "--server", s]).await;
    assert!(!ok && err.contains("pods \"nope\" not found"), "{err}");

    // -w: the table, then a line when a pod appears
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["get", "pods", "-w", "--server", s])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start nodelet get -w: {e}"));
    let Some(stdout) = watch.stdout.take() else { panic!("no stdout") };
    let mut lines = BufReader::new(stdout).lines();
    let mut next_line = async || match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await
    {
        Ok(Ok(Some(l))) => l,
        other => panic!("get -w printed no line: {other:?}"),
    };
    assert!(next_line().await.starts_with("NAME "), "the header first");
    let first = [next_line().await, next_line().await];
    assert!(first[0].starts_with(&batch) && first[1].starts_with(&web), "{first:?}");
    let late =
        n.pod_manifest("late", json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}));
    n.write_manifest("late.yaml", &late);
    let late_name = n.pod_name("late");
    let mut seen = Vec::new();
    loop {
        let line = next_line().await;
        assert!(!line.starts_with("NAME "), "no second header: {seen:?}");
        seen.push(line.clone());
        if line.starts_with(&late_name) && line.contains("Running") {
            break;
        }
    }
    assert!(seen.iter().all(|l| l.starts_with(&late_name)), "only the changed pod prints: {seen:?}");
    watch.kill().await.unwrap_or_else(|e| panic!("cannot stop get -w: {e}"));

    // -w -o json with a selector: each selected object on its own
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["get", "pods", "-w", "-o", "json", "-l", "app=web", "--server", s])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start nodelet get -w -o json: {e}"));
    let Some(stdout) = watch.stdout.take() else { panic!("no stdout") };
    let mut lines = BufReader::new(stdout).lines();
    let mut object = String::new();
    loop {
        let line = match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(l))) => l,
            other => panic!("get -w -o json printed no object: {other:?}: {object}"),
        };
        object.push_str(&line);
        object.push('\n');
        if line == "}" {
            break;
        }
    }
    let pod: serde_json::Value = serde_json::from_str(&object).unwrap_or_else(|e| panic!("{e}: {object}"));
    assert_eq!((pod["kind"].as_str(), pod["metadata"]["name"].as_str()), (Some("Pod"), Some(web.as_str())));
    watch.kill().await.unwrap_or_else(|e| panic!("cannot stop get -w: {e}"));

    // Image events, in the kubelet's words: a present image, and a pull from the loopback registry.
    let present = n
        .cli_main(&["get", "events", "--field-selector", &format!("involvedObject.name={web},reason=Pulled")])
        .await;
    assert!(
        present.contains(&format!("Container image \"{}\" already present on machine", env.busybox)),
        "{present}"
    );
    let Some(remote) = std::env::var("NODELET_TEST_REGISTRY_BUSYBOX").ok().filter(|s| !s.is_empty()) else {
        panic!("NODELET_TEST_REGISTRY_BUSYBOX is unset: source /tmp/nodelet-test/env.sh");
    };
    let pulled = n.pod_manifest(
        "pulled",
        json!({"containers": [{"name": "main", "image": remote, "imagePullPolicy": "Always",
                               "command": sleep_until_term("")}]}),
    );
    n.write_manifest("pulled.yaml", &pulled);
    n.wait_running("pulled").await;
    let pulled_name = n.pod_name("pulled");
    let text = n.cli_main(&["describe", "pod", &pulled_name]).await;
    let events_part = text.split("\nEvents:\n").nth(1).unwrap_or_default();
    let lines: Vec<&str> = events_part.lines().collect();
    let pulling = lines.iter().position(|l| l.contains(&format!("Pulling image \"{remote}\"")));
    let done = lines.iter().position(|l| {
        l.contains(&format!("Successfully pulled image \"{remote}\" in "))
            && l.ends_with(" including waiting)")
    });
    assert!(pulling.is_some() && done.is_some() && pulling < done, "Pulling, then Pulled:\n{text}");
    assert!(
        lines.iter().any(|l| l.split_whitespace().take(2).collect::<Vec<_>>() == ["Normal", "Pulled"]),
        "{text}"
    );
    n.shutdown().await;
}

#[tokio::test]
async fn completion_scripts_and_the_man_page_come_from_the_binary() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    for shell in ["bash", "zsh", "fish"] {
        let (ok, script, err) = cli(&["completion", shell]).await;
        assert!(ok && script.len() > 1000, "{shell}: {err}");
        assert!(script.contains("describe") && script.contains("port-forward"), "{shell}");
        if shell == "bash" {
            let path = dir.path().join("nodelet.bash");
            std::fs::write(&path, &script).unwrap_or_else(|e| panic!("write: {e}"));
            let check = tokio::process::Command::new("bash")
                .arg("-n")
                .arg(&path)
                .output()
                .await
                .unwrap_or_else(|e| panic!("bash: {e}"));
            assert!(check.status.success(), "bash -n: {}", String::from_utf8_lossy(&check.stderr));
        }
    }
    let (ok, page, _) = cli(&["man"]).await;
    assert!(ok && page.contains(".TH nodelet 1") && page.contains("COMMAND: NODELET DESCRIBE"), "{page}");
    assert!(page.contains("\\-\\-field\\-selector") && page.contains("\\-\\-pod\\-manifest\\-path"));
    let pages = dir.path().join("man1");
    let (ok, _, err) = cli(&["man", "--dir", pages.to_str().unwrap_or_default()]).await;
    assert!(ok, "{err}");
    assert!(pages.join("nodelet-get.1").is_file() && pages.join("nodelet.1").is_file());
    // When man(1) is installed, it renders the page.
    if let Ok(out) = tokio::process::Command::new("man")
        .arg("-l")
        .arg(pages.join("nodelet-get.1"))
        .env("MANPAGER", "cat")
        .output()
        .await
        && out.status.success()
    {
        assert!(String::from_utf8_lossy(&out.stdout).contains("selector"));
    }
}
