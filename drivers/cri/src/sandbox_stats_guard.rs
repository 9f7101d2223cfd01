//! A guard against a containerd bug that takes the whole runtime down.
//!
//! containerd before 1.6.22 writes its CRI sandbox store's map while holding only the store's read
//! lock when it serves `ListPodSandboxStats` and `PodSandboxStats` (it caches each sandbox's CPU usage
//! there: containerd pull request 8130, backported to 1.6 in 8819). Any call that reads the same map
//! at that moment (`ListPodSandbox`, `PodSandboxStatus`, starting a container, another stats call)
//! can crash containerd with Go's `fatal error: concurrent map iteration and map write`, and every
//! pod's runtime with it. nodelet's housekeeping asks for sandbox stats every 10 s while its PLEG
//! lists the sandboxes every second; with 110 pods on Debian 12's containerd 1.6.20 the two met
//! several times a day here.
//!
//! So on such a runtime a sandbox stats call runs alone: it waits until the runtime-service calls in
//! flight have returned, and calls made meanwhile wait until it has returned. The client then reads
//! sandbox stats one sandbox at a time (`PodSandboxStats`), so that each wait is one sandbox's (about
//! 15 ms) rather than the whole list's (1.5 s at 110 pods). Calls that do not read
//! the sandbox store and may take long (`ExecSync`, the image service) are not held up, and on
//! other runtimes nothing waits at all. Whether the runtime is affected is learnt from CRI `Version`
//! at the first call that needs to know; until a `Version` call succeeds the guard is applied.

use tokio::sync::{OnceCell, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// How a call takes part in the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// A sandbox stats call: runs alone on an affected runtime.
    Exclusive,
    /// A runtime-service call that may read the sandbox store: never at the same time as a
    /// sandbox stats call on an affected runtime.
    Shared,
    /// Not concerned (`Version`, `Status`, `ExecSync`, the image service).
    Free,
}

/// How `call` (a CRI method name, as the client's metrics name it) takes part in the guard.
pub(crate) fn access(call: &str) -> Access {
    match call {
        "ListPodSandboxStats" | "PodSandboxStats" => Access::Exclusive,
        "Version" | "Status" | "ExecSync" | "PullImage" | "ImageStatus" | "ListImages" | "RemoveImage"
        | "ImageFsInfo" => Access::Free,
        _ => Access::Shared,
    }
}

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

/// The guard, shared by every clone of a client.
#[derive(Debug, Default)]
pub(crate) struct SandboxStatsGuard {
    lock: RwLock<()>,
    /// Whether the runtime is affected, once known.
    affected: OnceCell<bool>,
}

/// What a call holds while it runs.
#[derive(Debug)]
pub(crate) enum Held<'a> {
    /// Nothing: the call is free, or the runtime is not affected.
    Nothing,
    /// A share of the guard.
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    /// The whole guard.
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

impl SandboxStatsGuard {
    /// Waits until `call` may run. `version` asks the runtime for its name and version (it is called
    /// until it succeeds once); the returned value must be kept while the call runs.
    pub(crate) async fn enter<F, Fut>(&self, call: &str, version: F) -> Held<'_>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Option<(String, String)>>,
    {
        let access = access(call);
        if access == Access::Free {
            return Held::Nothing;
        }
        match (self.is_affected(version).await, access) {
            (false, _) | (_, Access::Free) => Held::Nothing,
            (true, Access::Shared) => Held::Shared(self.lock.read().await),
            (true, Access::Exclusive) => Held::Exclusive(self.lock.write().await),
        }
    }

    /// Whether the runtime is affected (asked with `version` until that succeeds once; until then,
    /// yes).
    pub(crate) async fn is_affected<F, Fut>(&self, version: F) -> bool
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Option<(String, String)>>,
    {
        match self.affected.get() {
            Some(known) => *known,
            None => match version().await {
                Some((name, version)) => {
                    let affected = affected(&name, &version);
                    if affected && self.affected.set(true).is_ok() {
                        tracing::info!(
                            runtime = %name,
                            %version,
                            "this runtime can crash when sandbox stats are read while sandboxes are \
                             listed (containerd before 1.6.22): sandbox stats calls run alone"
                        );
                    } else {
                        let _ = self.affected.set(affected);
                    }
                    affected
                }
                None => true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

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

    #[test]
    fn sandbox_stats_are_exclusive_and_long_or_unrelated_calls_are_free() {
        assert_eq!(access("ListPodSandboxStats"), Access::Exclusive);
        assert_eq!(access("PodSandboxStats"), Access::Exclusive);
        for call in
            ["ListPodSandbox", "PodSandboxStatus", "RunPodSandbox", "StartContainer", "ListContainers"]
        {
            assert_eq!(access(call), Access::Shared, "{call}");
        }
        for call in ["ExecSync", "Version", "Status", "PullImage", "ImageFsInfo"] {
            assert_eq!(access(call), Access::Free, "{call}");
        }
    }

    fn containerd(version: &'static str) -> impl FnOnce() -> std::future::Ready<Option<(String, String)>> {
        move || std::future::ready(Some(("containerd".to_owned(), version.to_owned())))
    }

    #[tokio::test(start_paused = true)]
    async fn on_an_affected_runtime_a_stats_call_waits_for_the_calls_in_flight_and_holds_up_new_ones() {
        let guard = Arc::new(SandboxStatsGuard::default());
        let list = guard.enter("ListPodSandbox", containerd("1.6.20~ds1")).await;
        assert!(matches!(list, Held::Shared(_)));
        // Another shared call and a free one run alongside.
        let status = guard.enter("PodSandboxStatus", containerd("1.6.20")).await;
        assert!(matches!(guard.enter("ExecSync", containerd("1.6.20")).await, Held::Nothing));

        let stats = tokio::spawn({
            let guard = guard.clone();
            async move {
                let held = guard.enter("ListPodSandboxStats", containerd("1.6.20")).await;
                assert!(matches!(held, Held::Exclusive(_)));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!stats.is_finished(), "the stats call must wait for the calls in flight");
        drop((list, status));
        // A call made while the stats call waits or runs waits for it.
        let later = tokio::time::timeout(
            Duration::from_millis(500),
            guard.enter("ListPodSandbox", containerd("1.6.20")),
        );
        assert!(later.await.is_err(), "a new call must wait for the stats call");
        stats.await.expect("the stats call ran");
        assert!(matches!(guard.enter("ListPodSandbox", containerd("1.6.20")).await, Held::Shared(_)));
    }

    #[tokio::test]
    async fn on_another_runtime_nothing_waits_and_the_version_is_asked_once() {
        let guard = SandboxStatsGuard::default();
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let version = || {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::ready(Some(("containerd".to_owned(), "1.7.24".to_owned())))
        };
        let stats = guard.enter("ListPodSandboxStats", version).await;
        let list = guard.enter("ListPodSandbox", version).await;
        assert!(matches!((stats, list), (Held::Nothing, Held::Nothing)));
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn until_the_version_is_known_the_guard_is_applied() {
        let guard = SandboxStatsGuard::default();
        let unknown = || std::future::ready(None);
        assert!(matches!(guard.enter("ListPodSandbox", unknown).await, Held::Shared(_)));
        assert!(matches!(guard.enter("ListPodSandbox", containerd("2.0.0")).await, Held::Nothing));
    }
}
