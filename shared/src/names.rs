//! DNS-1123 names, as Kubernetes checks them (`k8s.io/apimachinery/pkg/util/validation`).

/// The longest DNS-1123 label.
pub const MAX_LABEL_LEN: usize = 63;
/// The longest DNS-1123 subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Whether `s` has the shape of a DNS-1123 label, whatever its length: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
pub fn has_label_shape(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && b.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// Whether `s` is a DNS-1123 label (namespaces, container names): at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= MAX_LABEL_LEN && has_label_shape(s)
}

/// Whether `s` is a DNS-1123 subdomain (pod, node, volume, claim and class names): dot-separated
/// labels, at most 253 characters. What passes is safe as a file name.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains_are_checked_as_kubernetes_does() {
        assert!(is_dns_label("kube-system"));
        assert!(is_dns_label("123-abc"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label("A"));
        assert!(!is_dns_label("a.b"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("web-node1.example"));
        assert!(!is_dns_subdomain(""));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain(".a"));
        let long = |last: usize| format!("{0}.{0}.{0}.{1}", "a".repeat(63), "b".repeat(last));
        assert!(is_dns_subdomain(&long(61)), "253 characters");
        assert!(!is_dns_subdomain(&long(62)), "254 characters");
    }
}
