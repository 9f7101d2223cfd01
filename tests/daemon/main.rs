//! End-to-end tests of the `nodelet` daemon against the REAL containerd: static pod manifests in, pods in
//! the runtime, status on the HTTP servers, logs on disk.
//!
//! Environment (written by `scripts/runtime-up.sh` into `/tmp/nodelet-test/env.sh`):
//!
//! | variable | use |
//! |---|---|
//! | `NODELET_TEST_CRI_ENDPOINT` | the runtime; unset → the tests print a skip note and pass, unless `NODELET_REQUIRE_RUNTIME=1`, then they panic |
//! | `NODELET_TEST_BUSYBOX_IMAGE` | the image of every test pod (present in the runtime; `IfNotPresent`) |
//! | `NODELET_TEST_CGROUP_PARENT` | `--cgroup-root` |
//! | `NODELET_TEST_RESOLV_CONF` | `--resolv-conf` (nameserver 127.0.0.1) |
//!
//! The cluster-mode tests ([`cluster`]) also need a Kubernetes control plane on loopback (envtest), which
//! `scripts/test.sh` starts and describes with `NODELET_TEST_ENVTEST_ENV`, `NODELET_TEST_ENVTEST_SCRIPTS` and
//! `NODELET_REQUIRE_CLUSTER=1`; see [`cluster_support`].
//!
//! Each test runs its own nodelet ([`support::Nodelet`]) with its own node name, directories and loopback
//! ports, so the tests run in parallel; pods use DNS 127.0.0.1 only, and the tests connect only to loopback
//! and to pod IPs in 198.18.0.0/16.

mod api;
mod certificates;
mod checkpoint;
mod cli_kubectl;
mod cli_streaming;
mod cluster;
mod cluster_data;
mod cluster_support;
mod crash_safe;
mod debug;
mod deploy;
mod eviction;
mod exec;
mod hollow;
mod hostile_clients;
mod hostile_manifests;
mod lifecycle;
mod limits;
mod local_storage;
mod logs;
mod memory_volumes;
mod metrics;
mod pod_security;
mod probes;
mod restarts;
mod scale;
mod sources;
mod stats;
mod support;
mod userns;
mod volumes;
