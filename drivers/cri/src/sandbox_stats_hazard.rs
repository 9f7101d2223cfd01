//! Which runtimes must not be asked for sandbox stats.
//!
//! containerd before 1.6.22 writes its CRI sandbox store's map while holding only the store's read
//! lock when it serves `ListPodSandboxStats` and `PodSandboxStats` (it caches each sandbox's CPU usage
//! there: containerd pull request 8130, backported to 1.6 in 8819). A call that reads the same map at
//! that moment (`ListPodSandbox` above all, from any client of the runtime) can crash containerd with
//! Go's `fatal error: concurrent map iteration and map write`, and every pod's runtime with it. With
//! 110 pods on Debian 12's containerd 1.6.20, nodelet's housekeeping (sandbox stats every 10 s) and its
//! PLEG (sandbox listing every second) met several times a day. Serialising the two inside nodelet
//! was not enough (the runtime still crashed once under a 250-pod start, and other clients of the
//! runtime list sandboxes too), and the stats cost the runtime about 15 ms of CPU per sandbox.
//!
//! So on such a runtime nodelet does not ask for sandbox stats at all: the stats provider reads the
//! pod's CPU, memory and processes from its pod cgroup and its network from the sandbox's network
//! namespace, as the kubelet's cAdvisor does.

/// Whether a runtime of this CRI `Version` answer has the bug: containerd 1.6 before 1.6.22.
/// Distribution suffixes (`1.6.20~ds1`) and a leading `v` are allowed.
pub(crate) fn affected(runtime_name: &str, runtime_version: &str) -> bool {
    if runtime_name != "containerd" {
        return false;
    }
    let version = runtime_version.trim_start_matches('v');
    let mut parts = version.split(|c: char| !c.is_ascii_digit()).map(str::parse::<u64>);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(1)), Some(Ok(6)), Some(Ok(patch))) => patch < 22,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_containerd_1_6_before_1_6_22_is_affected() {
        for (name, version, expected) in [
            ("containerd", "1.6.20~ds1", true),
            ("containerd", "v1.6.0", true),
            ("containerd", "1.6.21", true),
            ("containerd", "1.6.22", false),
            ("containerd", "v1.6.38", false),
            ("containerd", "1.7.0", false),
            ("containerd", "2.0.4", false),
            ("containerd", "1.5.18", false),
            ("containerd", "garbage", false),
            ("cri-o", "1.6.20", false),
        ] {
            assert_eq!(affected(name, version), expected, "{name} {version}");
        }
    }
}
