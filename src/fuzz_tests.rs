//! Property tests of every decoder nodelet runs on input it does not control (issue 14's "random
//! and mutated input"): manifests (files, URL, HTTP source), the KubeletConfiguration file, Go
//! durations, label and field selectors, and CRI log lines. For each, over random and mutated
//! input:
//! - no panic;
//! - a refusal is a clear error (not empty, and naming the limit or the field where one applies);
//! - the memory allocated while decoding stays within a bound proportional to the input's size,
//!   measured with an instrumented global allocator ([`GLOBAL`]: these tests run one per process
//!   under `cargo nextest`, so the peak is this test's own).
//!
//! The number of cases per property is [`cases`]: 256 by default, so the set runs in seconds in
//! the test command (a bounded fuzz run); `NODELET_FUZZ_CASES=100000` runs a longer one by hand.
//! HTTP request lines are fuzzed against the real servers in `server::tests`.

use std::alloc::System;
use std::path::Path;

use nodelet_resources::model::pod::PodSource;
use nodelet_resources::pod::security::{Level, PodSecurity};
use peakmem_alloc::{INSTRUMENTED_SYSTEM, PeakMemAlloc, PeakMemAllocTrait as _};
use proptest::prelude::*;

/// The allocator of this test binary: the system's, counting the peak.
#[global_allocator]
static GLOBAL: &PeakMemAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Cases per property: `NODELET_FUZZ_CASES`, default 256.
fn cases() -> u32 {
    std::env::var("NODELET_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() }
}

/// Runs `f` and returns its result with the peak of memory allocated meanwhile (bytes above what
/// was allocated when it started).
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    GLOBAL.reset_peak_memory();
    let out = f();
    (out, GLOBAL.get_peak_memory())
}

/// Bytes per input byte a YAML decoder may allocate: the decoder allows about 4 nodes (parser
/// events, aliases expanded) per input byte, and a decoded node is a few hundred bytes of
/// `serde_json::Value`, map entry and key. An alias bomb of a few hundred bytes that expanded would
/// take gigabytes.
const NODE_BYTES: usize = 1024;

/// The bound every decoder must keep: `factor` bytes per input byte plus a fixed allowance for
/// the decoder's own tables and a validated pod's structures.
fn bound(input: usize, factor: usize) -> usize {
    input.saturating_mul(factor) + 1024 * 1024
}

/// The example manifests users start from: the seeds of the mutations.
fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples");
    let mut seeds: Vec<Vec<u8>> = ["web.yaml", "shared-emptydir.yaml", "crashloop.yaml"]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("cannot read the example {f}: {e}")))
        .collect();
    // JSON is YAML too, and the HTTP source takes it.
    seeds.push(
        br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"default"},
            "spec":{"containers":[{"name":"c","image":"busybox","resources":{"limits":{"memory":"64Mi","cpu":"250m"}},
            "volumeMounts":[{"name":"v","mountPath":"/v","subPath":"a/b"}]}],
            "volumes":[{"name":"v","emptyDir":{"sizeLimit":"1Gi"}}]}}"#
            .to_vec(),
    );
    seeds
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    /// Replace the byte at this position (modulo the length).
    Replace(usize, u8),
    /// Insert these bytes at this position.
    Insert(usize, Vec<u8>),
    /// Remove up to this many bytes at this position.
    Remove(usize, usize),
    /// Copy a range to another place (repeats structure: keys, documents, anchors).
    Duplicate(usize, usize, usize),
}

/// YAML's own characters and words, so that mutations reach the parser's interesting paths.
fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"---\n".to_vec()),
        Just(b"&a ".to_vec()),
        Just(b"*a".to_vec()),
        Just(b"<<: *a\n".to_vec()),
        Just(b"[[[[".to_vec()),
        Just(b"{".to_vec()),
        Just(b": ".to_vec()),
        Just(b"- ".to_vec()),
        Just(b"!!binary ".to_vec()),
        Just(b"\t".to_vec()),
        Just(b"0644".to_vec()),
        Just(b"1e309".to_vec()),
        Just(b"99999999999999999999999Ei".to_vec()),
        Just(b"\"\\u0000\"".to_vec()),
        Just(b"../../".to_vec()),
        Just(vec![0xff, 0xfe]),
        prop::collection::vec(any::<u8>(), 1..8),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<usize>(), token()).prop_map(|(i, t)| Edit::Insert(i, t)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Edit::Remove(i, n)),
        (any::<usize>(), 1usize..256, any::<usize>()).prop_map(|(i, n, j)| Edit::Duplicate(i, n, j)),
    ]
}

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = bytes.len().max(1);
        match e {
            Edit::Replace(i, b) => {
                if let Some(slot) = bytes.get_mut(i % len) {
                    *slot = *b;
                }
            }
            Edit::Insert(i, t) => {
                let at = (i % (bytes.len() + 1)).min(bytes.len());
                bytes.splice(at..at, t.iter().copied());
            }
            Edit::Remove(i, n) => {
                let at = i % len;
                let end = (at + n).min(bytes.len());
                if at < end {
                    bytes.drain(at..end);
                }
            }
            Edit::Duplicate(i, n, j) => {
                let at = i % len;
                let end = (at + n).min(bytes.len());
                let piece: Vec<u8> = bytes.get(at..end).map(<[u8]>::to_vec).unwrap_or_default();
                let to = (j % (bytes.len() + 1)).min(bytes.len());
                bytes.splice(to..to, piece);
            }
        }
    }
    bytes
}

/// The HTTP source's default pod security: the baseline level.
fn http_security() -> crate::sources::admission::SourcePolicy {
    crate::sources::admission::SourcePolicy {
        security: PodSecurity { level: Level::Baseline, restrictions: None },
        placement: None,
    }
}

/// Decodes a manifest as the HTTP source does and checks the properties.
fn check_manifest(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (parsed, peak) =
        peak_during(|| crate::sources::manifest::parse(bytes, &PodSource::Http, "node-a", &http_security()));
    prop_assert!(
        peak <= bound(bytes.len(), NODE_BYTES),
        "decoding {} bytes allocated {peak} bytes at the peak",
        bytes.len()
    );
    for problem in &parsed.problems {
        prop_assert!(!problem.message.trim().is_empty(), "an empty problem for {:?}", problem.object);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_as_a_manifest_are_refused_clearly_within_bounded_memory(
        bytes in prop::collection::vec(any::<u8>(), 0..4096),
    ) {
        check_manifest(&bytes)?;
    }

    #[test]
    fn mutated_example_manifests_decode_or_are_refused_within_bounded_memory(
        seed in 0usize..4,
        edits in prop::collection::vec(edit(), 1..24),
    ) {
        let seeds = seeds();
        let bytes = apply(seeds[seed % seeds.len()].clone(), &edits);
        check_manifest(&bytes)?;
    }

    #[test]
    fn alias_bombs_of_any_shape_are_refused_naming_the_limit(
        width in 2usize..12,
        depth in 2usize..12,
        merge in any::<bool>(),
    ) {
        // a0: [x, x, …]; a1: [*a0, *a0, …]; … then a pod that uses the last one.
        let mut text = String::from("apiVersion: v1\nkind: Pod\nmetadata:\n  name: bomb\n");
        text.push_str(&format!("  labels: &a0 {{ k: \"{}\" }}\n", "x".repeat(width)));
        for level in 1..depth {
            let refs: Vec<String> = (0..width).map(|i| {
                if merge { format!("k{i}: {{ <<: *a{} }}", level - 1) } else { format!("k{i}: *a{}", level - 1) }
            }).collect();
            text.push_str(&format!("  x{level}: &a{level} {{ {} }}\n", refs.join(", ")));
        }
        text.push_str(&format!("spec:\n  bomb: *a{}\n", depth - 1));
        let (parsed, peak) = peak_during(|| crate::sources::manifest::parse(text.as_bytes(), &PodSource::Http, "n", &http_security()));
        prop_assert!(peak <= bound(text.len(), NODE_BYTES), "{} bytes allocated {peak} at the peak", text.len());
        // Small expansions are a (refused for other reasons) pod; large ones hit the alias limit.
        let expanded = (width as f64).powi(i32::try_from(depth).unwrap_or(i32::MAX));
        if expanded > 4.0 * text.len() as f64 {
            prop_assert!(
                parsed.problems.iter().any(|p| p.message.contains("alias") || p.message.contains("nodes")),
                "expansion {expanded} of {} bytes not refused: {:?}", text.len(), parsed.problems
            );
            prop_assert!(parsed.pods.is_empty());
        }
    }

    #[test]
    fn many_documents_and_deep_nesting_are_refused_within_bounded_memory(
        documents in 0usize..3000,
        depth in 0usize..400,
    ) {
        let mut text = "---\n".repeat(documents);
        text.push_str(&"[".repeat(depth));
        text.push_str(&"]".repeat(depth));
        let (parsed, peak) = peak_during(|| crate::sources::manifest::parse(text.as_bytes(), &PodSource::Http, "n", &http_security()));
        prop_assert!(peak <= bound(text.len(), NODE_BYTES), "{} bytes allocated {peak} at the peak", text.len());
        if documents > crate::yaml::MAX_DOCUMENTS {
            prop_assert!(parsed.problems.iter().any(|p| p.message.contains("documents")), "{:?}", parsed.problems);
        }
        if depth > crate::yaml::MAX_DEPTH {
            prop_assert!(!parsed.problems.is_empty());
        }
    }

    #[test]
    fn random_and_mutated_config_files_are_refused_naming_the_field(
        edits in prop::collection::vec(edit(), 0..16),
    ) {
        let seed = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config/kubelet-config.yaml"))
            .expect("the example config");
        let bytes = apply(seed, &edits);
        let Ok(text) = std::str::from_utf8(&bytes) else { return Ok(()) };
        let (result, peak) = peak_during(|| crate::config::ConfigFile::parse(Path::new("/etc/nodelet/config.yaml"), text));
        prop_assert!(peak <= bound(text.len(), NODE_BYTES), "{} bytes allocated {peak} at the peak", text.len());
        if let Err(e) = result {
            let message = e.to_string();
            prop_assert!(message.contains("/etc/nodelet/config.yaml"), "the error does not name the file: {message}");
        }
    }

    #[test]
    fn go_durations_parse_or_fail_without_panic_and_round_trip(
        text in "[-+]?([0-9]{0,25}(\\.[0-9]{0,12})?(ns|us|µs|ms|s|m|h|d|)){0,6}",
        nanos in 0..=i64::MAX as u64,
    ) {
        let (result, peak) = peak_during(|| crate::config::units::parse_go_duration(&text));
        prop_assert!(peak <= bound(text.len(), 16));
        if let Err(e) = &result {
            prop_assert!(!e.to_string().is_empty());
        }
        // Whatever is formatted parses back to itself (Go durations are at most i64::MAX ns).
        let d = std::time::Duration::from_nanos(nanos);
        let formatted = crate::config::units::format_go_duration(d);
        prop_assert_eq!(crate::config::units::parse_go_duration(&formatted).ok(), Some(d), "{}", formatted);
    }

    #[test]
    fn label_and_field_selectors_parse_or_fail_clearly(
        text in "([a-z0-9./_-]{0,70}( ?(=|==|!=|in|notin|,|!|\\(|\\)|<|>) ?)?){0,12}",
        bytes in prop::collection::vec(any::<char>(), 0..200),
    ) {
        let junk: String = bytes.into_iter().collect();
        for input in [text.as_str(), junk.as_str()] {
            let (result, peak) = peak_during(|| nodelet_cli::selector::LabelSelector::parse(input));
            prop_assert!(peak <= bound(input.len(), 64));
            if let Err(e) = result {
                prop_assert!(!e.to_string().is_empty());
            }
            let (result, peak) = peak_during(|| {
                nodelet_cli::selector::FieldSelector::parse(input, nodelet_cli::selector::POD_FIELDS)
            });
            prop_assert!(peak <= bound(input.len(), 64));
            if let Err(e) = result {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    #[test]
    fn cri_log_lines_parse_or_are_skipped_without_panic(
        timestamp in "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?(Z|[+-][0-9]{2}:[0-9]{2})?",
        stream in "(stdout|stderr|std|)",
        tag in "(F|P|P:x|)",
        content in prop::collection::vec(any::<u8>(), 0..256),
        junk in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut line = format!("{timestamp} {stream} {tag} ").into_bytes();
        line.extend_from_slice(&content);
        for input in [&line, &junk] {
            if let Some(parsed) = nodelet_shared::cri_log::parse_cri_line(input) {
                prop_assert!(parsed.stream == "stdout" || parsed.stream == "stderr");
                prop_assert!(nodelet_shared::cri_log::normalize_timestamp(parsed.timestamp).is_some());
                prop_assert!(parsed.content.len() <= input.len());
            }
        }
    }
}

/// Numbers at and beyond every integer limit, in every form a decoder may meet them: plain,
/// signed, as exponents of a quantity, with suffixes, and as long digit strings.
pub(crate) fn limit_numbers() -> Vec<String> {
    let ints: Vec<String> = [
        i64::MIN.to_string(),
        i64::MAX.to_string(),
        u64::MAX.to_string(),
        i128::MIN.to_string(),
        i128::MAX.to_string(),
        u128::MAX.to_string(),
        i32::MIN.to_string(),
        i32::MAX.to_string(),
        u32::MAX.to_string(),
        "9223372036854775808".to_owned(),
        "-9223372036854775809".to_owned(),
        "18446744073709551616".to_owned(),
        "9".repeat(400),
        format!("0.{}1", "0".repeat(400)),
    ]
    .into_iter()
    .collect();
    let mut out = Vec::new();
    for n in &ints {
        out.push(n.clone());
        out.push(format!("1e{n}"));
        out.push(format!("1E{n}"));
        out.push(format!("1e+{}", n.trim_start_matches('-')));
        out.push(format!("-1e{n}"));
        out.push(format!("0e{n}"));
        out.push(format!("0.1e{n}"));
        out.push(format!("{n}Ei"));
        out.push(format!("{n}E"));
        out.push(format!("{n}n"));
        out.push(format!("{n}m"));
        out.push(format!("{n}Mi"));
        out.push(format!("{n}s"));
        out.push(format!("{n}h"));
        out.push(format!("{n}ns"));
        out.push(format!("{n}%"));
        out.push(format!("{n}.5"));
    }
    out
}

/// A pod manifest with `value` in the field at `at` (the rest of the pod valid), as YAML text.
fn pod_with(field: &str, value: &str) -> String {
    let quoted = format!("'{value}'");
    let (resources, volume, spec_extra, container_extra) = match field {
        "cpu-limit" => (format!("limits: {{cpu: {quoted}}}"), String::new(), "", String::new()),
        "memory-limit" => (format!("limits: {{memory: {quoted}}}"), String::new(), "", String::new()),
        "cpu-request" => (format!("requests: {{cpu: {quoted}}}"), String::new(), "", String::new()),
        "storage-limit" => {
            (format!("limits: {{ephemeral-storage: {quoted}}}"), String::new(), "", String::new())
        }
        "hugepages" => (
            format!(
                "limits: {{hugepages-2Mi: {quoted}, memory: 1Gi}}, requests: {{hugepages-2Mi: {quoted}}}"
            ),
            String::new(),
            "",
            String::new(),
        ),
        "extended" => (format!("limits: {{example.com/gpu: {quoted}}}"), String::new(), "", String::new()),
        "size-limit" => {
            (String::new(), format!("- {{name: v, emptyDir: {{sizeLimit: {quoted}}}}}"), "", String::new())
        }
        "memory-size-limit" => (
            String::new(),
            format!("- {{name: v, emptyDir: {{medium: Memory, sizeLimit: {quoted}}}}}"),
            "",
            String::new(),
        ),
        "divisor" => (
            "limits: {memory: 64Mi}".to_owned(),
            format!(
                "- {{name: v, downwardAPI: {{items: [{{path: m, resourceFieldRef: {{containerName: c, resource: limits.memory, divisor: {quoted}}}}}]}}}}"
            ),
            "",
            String::new(),
        ),
        "env-divisor" => (
            "limits: {cpu: '1'}".to_owned(),
            String::new(),
            "",
            format!(
                "env: [{{name: E, valueFrom: {{resourceFieldRef: {{resource: limits.cpu, divisor: {quoted}}}}}}}]"
            ),
        ),
        "grace" => (String::new(), String::new(), "grace", String::new()),
        "deadline" => (String::new(), String::new(), "deadline", String::new()),
        "run-as-user" => (String::new(), String::new(), "user", String::new()),
        "fs-group" => (String::new(), String::new(), "fsgroup", String::new()),
        "priority" => (String::new(), String::new(), "priority", String::new()),
        "probe-period" => (
            String::new(),
            String::new(),
            "",
            format!(
                "livenessProbe: {{exec: {{command: [true]}}, periodSeconds: {value}, initialDelaySeconds: {value}, timeoutSeconds: {value}, terminationGracePeriodSeconds: {value}}}"
            ),
        ),
        "port" => (
            String::new(),
            String::new(),
            "",
            format!("ports: [{{containerPort: {value}, hostPort: {value}}}]"),
        ),
        "default-mode" => (
            String::new(),
            format!("- {{name: v, configMap: {{name: x, defaultMode: {value}}}}}"),
            "",
            String::new(),
        ),
        "lifecycle-sleep" => (
            String::new(),
            String::new(),
            "",
            format!("lifecycle: {{preStop: {{sleep: {{seconds: {value}}}}}}}"),
        ),
        "overhead" => (String::new(), String::new(), "overhead", String::new()),
        other => panic!("no field {other}"),
    };
    let spec_line = match spec_extra {
        "grace" => format!("  terminationGracePeriodSeconds: {value}\n"),
        "deadline" => format!("  activeDeadlineSeconds: {value}\n"),
        "user" => format!("  securityContext: {{runAsUser: {value}, runAsGroup: {value}}}\n"),
        "fsgroup" => format!("  securityContext: {{fsGroup: {value}, supplementalGroups: [{value}]}}\n"),
        "priority" => format!("  priority: {value}\n"),
        "overhead" => format!("  overhead: {{cpu: {quoted}, memory: {quoted}}}\n"),
        _ => String::new(),
    };
    let volumes = if volume.is_empty() { String::new() } else { format!("  volumes:\n  {volume}\n") };
    let mounts = if volume.is_empty() { "" } else { "    volumeMounts: [{name: v, mountPath: /v}]\n" };
    let resources =
        if resources.is_empty() { String::new() } else { format!("    resources: {{{resources}}}\n") };
    let container_extra =
        if container_extra.is_empty() { String::new() } else { format!("    {container_extra}\n") };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: default}}\nspec:\n{spec_line}  containers:\n  - name: c\n    image: busybox\n{resources}{mounts}{container_extra}{volumes}"
    )
}

/// Every field of a pod a number reaches, with numbers at and beyond every integer limit: the
/// decoder never panics (a panic is collected, not propagated, so that one run names them all),
/// and a refusal is a problem that names the field.
#[test]
fn manifest_numbers_at_every_integer_limit_are_decoded_or_refused_without_panic() {
    const FIELDS: &[&str] = &[
        "cpu-limit",
        "memory-limit",
        "cpu-request",
        "storage-limit",
        "hugepages",
        "extended",
        "size-limit",
        "memory-size-limit",
        "divisor",
        "env-divisor",
        "grace",
        "deadline",
        "run-as-user",
        "fs-group",
        "priority",
        "probe-period",
        "port",
        "default-mode",
        "lifecycle-sleep",
        "overhead",
    ];
    let mut panics = Vec::new();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for field in FIELDS {
        for value in limit_numbers() {
            let text = pod_with(field, &value);
            let result = std::panic::catch_unwind(|| {
                crate::sources::manifest::parse(text.as_bytes(), &PodSource::Http, "node-a", &http_security())
            });
            match result {
                Err(panic) => {
                    panics
                        .push(format!("{field} = {value}: {}", crate::daemon::panic_message(panic.as_ref())));
                }
                Ok(parsed) => {
                    for problem in &parsed.problems {
                        assert!(!problem.message.trim().is_empty(), "{field} = {value}: an empty problem");
                    }
                    assert!(
                        parsed.pods.len() + parsed.problems.len() == 1,
                        "{field} = {value}: neither a pod nor a problem: {parsed:?}\n{text}"
                    );
                }
            }
        }
    }
    std::panic::set_hook(hook);
    assert!(panics.is_empty(), "{} panics:\n{}", panics.len(), panics.join("\n"));
}

/// Collects the panics of `f` over `inputs` (the default hook silenced), so that one run names them all.
fn panics_of<T>(inputs: &[String], f: impl Fn(&str) -> T) -> Vec<String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let panics = inputs
        .iter()
        .filter_map(|input| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(f(input))))
                .err()
                .map(|payload| format!("{input:?}: {}", crate::daemon::panic_message(payload.as_ref())))
        })
        .collect();
    std::panic::set_hook(hook);
    panics
}

/// The other decoders of input nodelet does not control, with numbers at and beyond every integer limit:
/// Go durations, quantities of the configuration, label and field selectors, CRI log lines (their
/// timestamps), the log endpoint's query (`tailLines`, `limitBytes`, `sinceSeconds`, `sinceTime`) and the
/// port-forward endpoint's ports. None panics; every refusal says why.
#[test]
fn decoders_at_every_integer_limit_refuse_without_panic() {
    let numbers = limit_numbers();
    let mut panics = Vec::new();
    panics.extend(panics_of(&numbers, |n| {
        if let Err(e) = crate::config::units::parse_go_duration(n) {
            assert!(!e.to_string().is_empty());
        }
        let _ = crate::config::units::parse_quantity(n);
        let _ = n.parse::<crate::config::ThresholdValue>();
    }));
    panics.extend(panics_of(&numbers, |n| {
        for selector in [format!("a={n}"), format!("a in ({n},{n})"), format!("{n}!={n}"), format!("a>{n}")] {
            let _ = nodelet_cli::selector::LabelSelector::parse(&selector);
            let _ = nodelet_cli::selector::FieldSelector::parse(&selector, nodelet_cli::selector::POD_FIELDS);
        }
    }));
    panics.extend(panics_of(&numbers, |n| {
        for line in [
            format!("{n} stdout F x"),
            format!("{n}-01-01T00:00:00Z stdout F x"),
            format!("2026-01-01T00:00:00.{}Z stderr P x", n.trim_start_matches('-')),
            format!("2026-01-01T00:00:00Z stdout {n} x"),
        ] {
            if let Some(parsed) = nodelet_shared::cri_log::parse_cri_line(line.as_bytes()) {
                let _ = nodelet_shared::cri_log::normalize_timestamp(parsed.timestamp);
            }
        }
    }));
    panics.extend(panics_of(&numbers, |n| {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-02T03:04:05Z".parse().unwrap_or_default();
        for key in ["tailLines", "limitBytes", "sinceSeconds", "sinceTime"] {
            let query = vec![(key.to_owned(), n.to_owned())];
            if let Err(e) = crate::server::logs::LogOptions::from_query(&query, now) {
                assert!(e.to_string().contains(key), "{key}={n}: {e}");
            }
        }
        let time = format!("{n}-01-01T00:00:00Z");
        let _ = crate::server::logs::LogOptions::from_query(&[("sinceTime".to_owned(), time)], now);
        for websocket in [false, true] {
            let _ = crate::server::streaming::parse_ports(&[("port".to_owned(), n.to_owned())], websocket);
        }
    }));
    assert!(panics.is_empty(), "{} panics:\n{}", panics.len(), panics.join("\n"));
}

/// `body` after the KubeletConfiguration header as the file /etc/nodelet/config.yaml, without flags.
fn load_config(body: &str) -> Result<crate::config::Loaded, crate::config::ConfigError> {
    use crate::config::{Config, ConfigFile, HostFacts};
    let header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let file = ConfigFile::parse(Path::new("/etc/nodelet/config.yaml"), &format!("{header}{body}"))?;
    let host = HostFacts { hostname: Ok("node-1".into()), cwd: std::path::PathBuf::from("/work") };
    let crate::cli::Command::Run(args) = crate::cli::try_parse_from(["nodelet"]).expect("no flags") else {
        panic!("not run")
    };
    Config::resolve(&args, Some(file), &host)
}

/// Every number of the configuration file (integers, durations, quantities, thresholds) at and beyond every
/// integer limit: a value the node cannot use is an error naming the file and the field, never a panic.
#[test]
fn config_numbers_at_every_integer_limit_are_refused_or_used_without_panic() {
    const FIELDS: &[&str] = &[
        "port: {}",
        "readOnlyPort: {}",
        "healthzPort: {}",
        "maxPods: {}",
        "podPidsLimit: {}",
        "kubeAPIQPS: {}",
        "kubeAPIBurst: {}",
        "nodeLeaseDurationSeconds: {}",
        "evictionMaxPodGracePeriod: {}",
        "imageGCHighThresholdPercent: {}",
        "imageGCLowThresholdPercent: {}",
        "containerLogMaxFiles: {}",
        "containerLogMaxSize: '{}'",
        "maxParallelImagePulls: {}",
        "logging: {verbosity: {}}",
        "fileCheckFrequency: '{}'",
        "syncFrequency: '{}'",
        "runtimeRequestTimeout: '{}'",
        "nodeStatusUpdateFrequency: '{}'",
        "imageMinimumGCAge: '{}'",
        "imageMaximumGCAge: '{}'",
        "evictionPressureTransitionPeriod: '{}'",
        "evictionHard: {memory.available: '{}'}",
        "evictionHard: {nodefs.inodesFree: '{}'}",
        "evictionSoft: {memory.available: '{}'}\nevictionSoftGracePeriod: {memory.available: '{}'}",
        "evictionMinimumReclaim: {memory.available: '{}'}",
        "authentication: {webhook: {cacheTTL: '{}'}}",
        "crashLoopBackOff: {maxContainerRestartPeriod: '{}'}",
        "nodelet: {maxTerminationGracePeriodSeconds: {}}",
        "nodelet: {containerRestartBackOff: {initial: '{}', max: '{}', resetAfter: '{}'}}",
        "nodelet: {imagePullBackOff: {initial: '{}', max: '{}'}}",
        "nodelet: {plegRelistPeriod: '{}', housekeepingInterval: '{}', imageGCPeriod: '{}'}",
        "nodelet: {evictionMonitoringPeriod: '{}'}",
        "nodelet: {localStorageEntryBudget: {}}",
        "nodelet: {containerGC: {period: '{}', minAge: '{}', maxPerPodContainer: {}, maxContainers: {}}}",
    ];
    let mut panics = Vec::new();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for field in FIELDS {
        for value in limit_numbers() {
            let body = field.replace("{}", &value);
            match std::panic::catch_unwind(|| load_config(&body).map(drop)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    let message = e.to_string();
                    assert!(
                        message.contains("/etc/nodelet/config.yaml") || message.contains("--"),
                        "{body}: the error names neither the file nor a flag: {message}"
                    );
                }
                Err(payload) => {
                    panics.push(format!("{body}: {}", crate::daemon::panic_message(payload.as_ref())))
                }
            }
        }
    }
    std::panic::set_hook(hook);
    assert!(panics.is_empty(), "{} panics:\n{}", panics.len(), panics.join("\n"));
}
