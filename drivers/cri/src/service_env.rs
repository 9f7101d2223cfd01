//! Service environment variables, as the kubelet makes them (`pkg/kubelet/kubelet_pods.go`
//! `getServiceEnvVarMap`, `pkg/kubelet/envvars/envvars.go` `FromServices`).
//!
//! A container gets the variables of every Service of its pod's namespace when the pod's
//! `enableServiceLinks` is true (the default), and always those of the master service `kubernetes`
//! of namespace `default` (a Service of that name in the pod's own namespace wins). Services without
//! a cluster IP (`""` or headless `None`) give none. For a Service `my-svc` with cluster IP `IP` and
//! ports `p0` (the first), `p1`…:
//!
//! ```text
//! MY_SVC_SERVICE_HOST=IP
//! MY_SVC_SERVICE_PORT=<p0>
//! MY_SVC_SERVICE_PORT_<NAME>=<port>             each named port
//! MY_SVC_PORT=<proto>://IP:<p0>                 first port (IPv6: [IP]:port)
//! MY_SVC_PORT_<port>_<PROTO>=<proto>://IP:<port>
//! MY_SVC_PORT_<port>_<PROTO>_PROTO=<proto>
//! MY_SVC_PORT_<port>_<PROTO>_PORT=<port>
//! MY_SVC_PORT_<port>_<PROTO>_ADDR=IP            each port
//! ```
//!
//! (names upper-cased with `-` made `_`; protocol `TCP` when unset). They are the lowest
//! precedence: a variable of the container's `env`/`envFrom` of the same name wins, and `$(VAR)`
//! in `env` values may refer to them. Where Services come from (cluster mode: a list and watch of
//! all Services) is a [`ServiceLister`]; until it has listed once, the container environment of a
//! pod from the API server cannot be made (the kubelet's "services have not yet been read at least
//! once"), while a static pod's gets the variables of what has been listed so far, none before the
//! first list (the kubelet's `IsStaticPod` exception: a static pod must start when the API server is
//! unreachable or the node's credentials are not valid); without a lister (standalone mode) there are
//! no such variables.

use std::collections::BTreeMap;
use std::sync::Arc;

/// What the variables of one Service are made of (nothing else of it is kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceFacts {
    /// `spec.clusterIP` (set, not `None`).
    pub cluster_ip: String,
    /// `spec.ports`, in order.
    pub ports: Vec<ServicePortFacts>,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortFacts {
    /// `name` (may be empty).
    pub name: String,
    /// `port`.
    pub port: i32,
    /// `protocol` (empty: `TCP`).
    pub protocol: String,
}

impl ServiceFacts {
    /// The facts of a Service's spec, `None` when it has no cluster IP (`""` or `None`), as the
    /// kubelet's `IsServiceIPSet`.
    pub fn of(spec: &k8s_openapi::api::core::v1::ServiceSpec) -> Option<ServiceFacts> {
        let ip = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None")?;
        Some(ServiceFacts {
            cluster_ip: ip.to_owned(),
            ports: spec
                .ports
                .iter()
                .flatten()
                .map(|p| ServicePortFacts {
                    name: p.name.clone().unwrap_or_default(),
                    port: p.port,
                    protocol: p.protocol.clone().unwrap_or_default(),
                })
                .collect(),
        })
    }
}

/// Where the Services of the cluster are read (in memory; never blocks).
pub trait ServiceLister: Send + Sync {
    /// The Services of `namespace` (name → facts; only those with a cluster IP), or `None` while
    /// Services have not been listed once.
    fn services(&self, namespace: &str) -> Option<BTreeMap<String, Arc<ServiceFacts>>>;
}

/// `makeEnvVariableName`: upper case, `-` → `_`.
fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// The variables of one Service (`FromServices` for one), in the kubelet's order.
pub fn service_vars(name: &str, facts: &ServiceFacts) -> Vec<(String, String)> {
    let prefix = var_name(name);
    let ip = &facts.cluster_ip;
    let mut out = vec![(format!("{prefix}_SERVICE_HOST"), ip.clone())];
    let Some(first) = facts.ports.first() else { return out };
    let port_var = format!("{prefix}_SERVICE_PORT");
    out.push((port_var.clone(), first.port.to_string()));
    for p in facts.ports.iter().filter(|p| !p.name.is_empty()) {
        out.push((format!("{port_var}_{}", var_name(&p.name)), p.port.to_string()));
    }
    // Docker link variables.
    let host_port =
        |port: i32| if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    for (i, p) in facts.ports.iter().enumerate() {
        let protocol = if p.protocol.is_empty() { "TCP" } else { p.protocol.as_str() };
        let url = format!("{}://{}", protocol.to_lowercase(), host_port(p.port));
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
        out.push((port_prefix.clone(), url));
        out.push((format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
        out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
        out.push((format!("{port_prefix}_ADDR"), ip.clone()));
    }
    out
}

/// The master services: always in every pod's environment.
const MASTER_SERVICES: &[&str] = &["kubernetes"];
/// The namespace of the master services.
const MASTER_NAMESPACE: &str = "default";

/// The Services have not been listed once yet, so the variables of a pod from the API cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("services have not yet been read at least once, cannot construct envvars")]
pub struct ServicesNotListed;

/// The service variables of a pod in `namespace` (`getServiceEnvVarMap`), sorted by name; for a pod
/// that is not `static_pod`, an error while `lister` has not listed Services once (a static pod gets
/// none then). No lister: none.
pub fn service_env(
    lister: Option<&dyn ServiceLister>,
    namespace: &str,
    enable_service_links: bool,
    static_pod: bool,
) -> Result<BTreeMap<String, String>, ServicesNotListed> {
    let mut out = BTreeMap::new();
    let Some(lister) = lister else { return Ok(out) };
    let listed = |namespace: &str| match lister.services(namespace) {
        Some(services) => Ok(services),
        None if static_pod => Ok(BTreeMap::new()),
        None => Err(ServicesNotListed),
    };
    let mut chosen: BTreeMap<String, Arc<ServiceFacts>> = BTreeMap::new();
    if enable_service_links {
        chosen = listed(namespace)?;
    }
    let masters = listed(MASTER_NAMESPACE)?;
    for name in MASTER_SERVICES {
        if let Some(facts) = masters.get(*name) {
            chosen.entry((*name).to_owned()).or_insert_with(|| facts.clone());
        }
    }
    for (name, facts) in &chosen {
        out.extend(service_vars(name, facts));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, port: i32, protocol: &str) -> ServicePortFacts {
        ServicePortFacts { name: name.into(), port, protocol: protocol.into() }
    }

    struct Fixed(Option<BTreeMap<String, BTreeMap<String, Arc<ServiceFacts>>>>);

    impl ServiceLister for Fixed {
        fn services(&self, namespace: &str) -> Option<BTreeMap<String, Arc<ServiceFacts>>> {
            Some(self.0.as_ref()?.get(namespace).cloned().unwrap_or_default())
        }
    }

    #[test]
    fn one_service_gives_the_kubelets_variables() {
        let facts = ServiceFacts {
            cluster_ip: "10.0.0.11".into(),
            ports: vec![port("", 8084, ""), port("http-alt", 8085, "UDP")],
        };
        let got: Vec<(String, String)> = service_vars("fooservice-x", &facts);
        let want: Vec<(String, String)> = [
            ("FOOSERVICE_X_SERVICE_HOST", "10.0.0.11"),
            ("FOOSERVICE_X_SERVICE_PORT", "8084"),
            ("FOOSERVICE_X_SERVICE_PORT_HTTP_ALT", "8085"),
            ("FOOSERVICE_X_PORT", "tcp://10.0.0.11:8084"),
            ("FOOSERVICE_X_PORT_8084_TCP", "tcp://10.0.0.11:8084"),
            ("FOOSERVICE_X_PORT_8084_TCP_PROTO", "tcp"),
            ("FOOSERVICE_X_PORT_8084_TCP_PORT", "8084"),
            ("FOOSERVICE_X_PORT_8084_TCP_ADDR", "10.0.0.11"),
            ("FOOSERVICE_X_PORT_8085_UDP", "udp://10.0.0.11:8085"),
            ("FOOSERVICE_X_PORT_8085_UDP_PROTO", "udp"),
            ("FOOSERVICE_X_PORT_8085_UDP_PORT", "8085"),
            ("FOOSERVICE_X_PORT_8085_UDP_ADDR", "10.0.0.11"),
        ]
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
        assert_eq!(got, want);
        let v6 = ServiceFacts { cluster_ip: "fd00::1".into(), ports: vec![port("", 443, "TCP")] };
        assert!(service_vars("k", &v6).contains(&("K_PORT".into(), "tcp://[fd00::1]:443".into())));
    }

    #[test]
    fn headless_and_ip_less_services_give_nothing() {
        let spec = |ip: Option<&str>| k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: ip.map(str::to_owned),
            ..Default::default()
        };
        assert_eq!(ServiceFacts::of(&spec(Some("None"))), None);
        assert_eq!(ServiceFacts::of(&spec(Some(""))), None);
        assert_eq!(ServiceFacts::of(&spec(None)), None);
        assert!(ServiceFacts::of(&spec(Some("10.0.0.1"))).is_some());
    }

    #[test]
    fn a_pod_gets_its_namespace_and_the_master_service() {
        let svc = |ip: &str| {
            Arc::new(ServiceFacts { cluster_ip: ip.into(), ports: vec![port("https", 443, "TCP")] })
        };
        let mut all = BTreeMap::new();
        all.insert(
            "default".to_owned(),
            BTreeMap::from([
                ("kubernetes".to_owned(), svc("10.0.0.1")),
                ("other".to_owned(), svc("10.0.0.2")),
            ]),
        );
        all.insert("app".to_owned(), BTreeMap::from([("web".to_owned(), svc("10.0.0.3"))]));
        let lister = Fixed(Some(all));
        let env = service_env(Some(&lister), "app", true, false).expect("synced");
        assert_eq!(env.get("KUBERNETES_SERVICE_HOST").map(String::as_str), Some("10.0.0.1"));
        assert_eq!(env.get("KUBERNETES_SERVICE_PORT_HTTPS").map(String::as_str), Some("443"));
        assert_eq!(env.get("WEB_SERVICE_HOST").map(String::as_str), Some("10.0.0.3"));
        assert!(!env.contains_key("OTHER_SERVICE_HOST"));
        // enableServiceLinks: false keeps only the master service.
        let env = service_env(Some(&lister), "app", false, false).expect("synced");
        assert!(env.contains_key("KUBERNETES_SERVICE_HOST") && !env.contains_key("WEB_SERVICE_HOST"));
        // In namespace default, every service there.
        let env = service_env(Some(&lister), "default", true, false).expect("synced");
        assert!(env.contains_key("OTHER_SERVICE_HOST"));
        // Not listed yet: an error; no lister: nothing.
        assert_eq!(service_env(Some(&Fixed(None)), "app", true, false), Err(ServicesNotListed));
        // a static pod starts without them (the API server may be unreachable)
        assert!(service_env(Some(&Fixed(None)), "app", true, true).expect("static").is_empty());
        assert!(service_env(None, "app", true, false).expect("standalone").is_empty());
    }
}
