//! The kubelet-managed `/etc/hosts` (`pkg/kubelet/kubelet_pods.go`: `makeHostsMount`,
//! `managedHostsFileContent`, `nodeHostsFileContent`, `hostsEntriesFromHostAliases`).
//!
//! Every container of a pod whose IPs are known gets `<root>/pods/<uid>/etc-hosts` bind-mounted at
//! `/etc/hosts` (read-write, as the kubelet mounts it), unless one of its `volumeMounts` is at
//! `/etc/hosts` itself. The runtime reports no IP for a `hostNetwork` sandbox (containerd does not),
//! so those containers keep the runtime's copy of the node's file, as under the kubelet. The file
//! is written (mode 0644) before each container is created: for a pod on its own network
//!
//! ```text
//! # Kubernetes-managed hosts file.
//! 127.0.0.1<TAB>localhost
//! ::1<TAB>localhost ip6-localhost ip6-loopback
//! fe00::0<TAB>ip6-localnet
//! fe00::0<TAB>ip6-mcastprefix
//! fe00::1<TAB>ip6-allnodes
//! fe00::2<TAB>ip6-allrouters
//! <pod IP><TAB><hostname>.<subdomain>.<namespace>.svc.<cluster domain><TAB><hostname>   (one line per pod IP;
//!                                                  without a subdomain: <pod IP><TAB><hostname>)
//!
//! # Entries added by HostAliases.
//! <ip><TAB><hostname><TAB><hostname>…                  (one line per hostAliases entry, when there are any)
//! ```
//!
//! (`<TAB>` a tab) and for a `hostNetwork` pod (when its IPs are known) the header `# Kubernetes-managed hosts file
//! (host network).`, the node's `/etc/hosts` and the host aliases. Unlike the kubelet (which
//! rewrites the file in place), the file is replaced atomically (a temporary file renamed over it),
//! so a container starting meanwhile never sees half of it. It goes with the pod's directory.

use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::HostAlias;

/// Where containers see the file.
pub(crate) const ETC_HOSTS_PATH: &str = "/etc/hosts";
/// The file's name in the pod's directory.
const FILE_NAME: &str = "etc-hosts";
/// The temporary file renamed over [`FILE_NAME`].
const TMP_NAME: &str = ".etc-hosts.tmp";
/// The header of a pod's own file (the kubelet's `managedHostsHeader`).
const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.\n";
/// The header of a `hostNetwork` pod's file (`managedHostsHeaderWithHostNetwork`).
const MANAGED_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";
/// The mode of the file.
const MODE: u32 = 0o644;
/// The most of the node's `/etc/hosts` that is copied.
const MAX_NODE_HOSTS_BYTES: u64 = 1 << 20;

/// The file's path for the pod `uid` under nodelet's root directory.
pub(crate) fn path(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid).join(FILE_NAME)
}

/// The file of a pod on its own network (`managedHostsFileContent`): `host_domain` is
/// `<subdomain>.<namespace>.svc.<cluster domain>` or empty.
pub(crate) fn managed_content(
    ips: &[String],
    hostname: &str,
    host_domain: &str,
    aliases: &[HostAlias],
) -> String {
    let mut out = String::from(MANAGED_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in ips {
        if host_domain.is_empty() {
            out.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            out.push_str(&format!("{ip}\t{hostname}.{host_domain}\t{hostname}\n"));
        }
    }
    out.push_str(&alias_entries(aliases));
    out
}

/// The file of a `hostNetwork` pod (`nodeHostsFileContent`): the node's file after the header, then
/// the host aliases.
pub(crate) fn node_content(node_hosts: &str, aliases: &[HostAlias]) -> String {
    let mut out = String::from(MANAGED_HEADER_HOST_NETWORK);
    out.push_str(node_hosts);
    out.push_str(&alias_entries(aliases));
    out
}

/// `hostsEntriesFromHostAliases`: nothing without aliases, else a blank line, a comment and one line
/// per entry, its IP and its hostnames separated by tabs.
fn alias_entries(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        let names = alias.hostnames.as_deref().unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{names}\n", alias.ip));
    }
    out
}

/// Whether the container mounts something at `/etc/hosts` itself (then it gets no managed file).
pub(crate) fn mounts_own(container: &k8s_openapi::api::core::v1::Container) -> bool {
    container.volume_mounts.iter().flatten().any(|m| m.mount_path == ETC_HOSTS_PATH)
}

/// Reads the node's hosts file (at most 1 MiB).
pub(crate) fn read_node_hosts(path: &Path) -> io::Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_NODE_HOSTS_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

/// Writes `content` as the file of pod `uid` (its directory made 0750 when missing), atomically;
/// returns its path. Neither the temporary file nor the file is reached through a symlink.
pub(crate) fn write(root: &Path, uid: &str, content: &str) -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let target = path(root, uid);
    let dir = target.parent().ok_or_else(|| io::Error::other("the hosts file has no directory"))?;
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir)?;
    let tmp = dir.join(TMP_NAME);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    file.write_all(content.as_bytes())?;
    file.set_permissions(std::fs::Permissions::from_mode(MODE))?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, &target)?;
    Ok(target)
}

/// Removes the file of pod `uid` (and a temporary one a crash left); a missing file is fine.
pub(crate) fn remove(root: &Path, uid: &str) -> io::Result<()> {
    let target = path(root, uid);
    for name in [FILE_NAME, TMP_NAME] {
        let Some(dir) = target.parent() else { continue };
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alias(ip: &str, names: &[&str]) -> HostAlias {
        HostAlias { ip: ip.into(), hostnames: Some(names.iter().map(|s| (*s).to_owned()).collect()) }
    }

    #[test]
    fn a_pods_file_is_the_kubelets() {
        let base = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                    fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n";
        assert_eq!(managed_content(&["10.0.0.5".into()], "web", "", &[]), format!("{base}10.0.0.5\tweb\n"));
        assert_eq!(
            managed_content(
                &["10.0.0.5".into(), "fd00::5".into()],
                "web-0",
                "nginx.default.svc.cluster.local",
                &[alias("123.45.67.89", &["foo", "bar"]), alias("10.1.1.1", &["baz"])],
            ),
            format!(
                "{base}10.0.0.5\tweb-0.nginx.default.svc.cluster.local\tweb-0\n\
                 fd00::5\tweb-0.nginx.default.svc.cluster.local\tweb-0\n\
                 \n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n10.1.1.1\tbaz\n"
            )
        );
    }

    #[test]
    fn a_host_network_pods_file_is_the_nodes_with_the_aliases() {
        assert_eq!(
            node_content("127.0.0.1 localhost\n", &[alias("1.2.3.4", &["a"])]),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n1.2.3.4\ta\n"
        );
        assert_eq!(node_content("x\n", &[]), "# Kubernetes-managed hosts file (host network).\nx\n");
    }

    #[test]
    fn the_file_is_replaced_whole_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let written = write(dir.path(), "uid-1", "one\n").expect("write");
        assert_eq!(written, dir.path().join("pods/uid-1/etc-hosts"));
        let meta = std::fs::metadata(&written).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        write(dir.path(), "uid-1", "two\n").expect("rewrite");
        assert_eq!(std::fs::read_to_string(&written).ok().as_deref(), Some("two\n"));
        assert!(!dir.path().join("pods/uid-1/.etc-hosts.tmp").exists());
        // A symlink planted as the temporary file is not followed.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "keep").expect("write");
        std::os::unix::fs::symlink(&outside, dir.path().join("pods/uid-1/.etc-hosts.tmp")).expect("symlink");
        write(dir.path(), "uid-1", "three\n").expect("write over a planted link");
        assert_eq!(std::fs::read_to_string(&outside).ok().as_deref(), Some("keep"));
        assert_eq!(std::fs::read_to_string(&written).ok().as_deref(), Some("three\n"));
        remove(dir.path(), "uid-1").expect("remove");
        assert!(!written.exists());
        remove(dir.path(), "uid-1").expect("remove again");
    }
}
