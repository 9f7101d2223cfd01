//! The cluster's Services, for service environment variables ([`nodelet_cri::service_env`]): a list
//! and watch of the Services of all namespaces (as the kubelet's service informer; the Node
//! authorizer lets a node list and watch them), kept in memory as only what the variables need (name,
//! cluster IP, ports) of the Services that have a cluster IP. Until the first list arrived, the lister
//! answers "not synced" and containers wait (their start fails and is retried); after a failed watch
//! the list is read again with back-off and replaces what was kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use nodelet_cri::service_env::{ServiceFacts, ServiceLister};
use tokio_util::sync::CancellationToken;

/// Namespace → name → facts.
type ByNamespace = HashMap<String, BTreeMap<String, Arc<ServiceFacts>>>;

#[derive(Default)]
struct State {
    services: ByNamespace,
    synced: bool,
}

/// The Services the API server has; "not synced" until the first list arrived. Cheap to clone.
#[derive(Clone, Default)]
pub struct ApiServices {
    state: Arc<RwLock<State>>,
}

impl std::fmt::Debug for ApiServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServices").finish_non_exhaustive()
    }
}

impl ServiceLister for ApiServices {
    fn services(&self, namespace: &str) -> Option<BTreeMap<String, Arc<ServiceFacts>>> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        state.synced.then(|| state.services.get(namespace).cloned().unwrap_or_default())
    }
}

/// `(namespace, name, facts)` of a Service; facts `None` without a cluster IP.
fn facts_of(service: &Service) -> Option<(String, String, Option<Arc<ServiceFacts>>)> {
    let namespace = service.metadata.namespace.clone()?;
    let name = service.metadata.name.clone()?;
    let facts = service.spec.as_ref().and_then(ServiceFacts::of).map(Arc::new);
    Some((namespace, name, facts))
}

fn put(map: &mut ByNamespace, service: &Service) {
    let Some((namespace, name, facts)) = facts_of(service) else { return };
    match facts {
        Some(facts) => {
            map.entry(namespace).or_default().insert(name, facts);
        }
        None => remove(map, &namespace, &name),
    }
}

fn remove(map: &mut ByNamespace, namespace: &str, name: &str) {
    if let Some(names) = map.get_mut(namespace) {
        names.remove(name);
        if names.is_empty() {
            map.remove(namespace);
        }
    }
}

impl ApiServices {
    /// Lists and watches Services until `shutdown` (listing again with back-off after errors).
    pub(crate) async fn run(self, client: Client, shutdown: CancellationToken) {
        let api: Api<Service> = Api::all(client);
        let stream = watcher::watcher(api, super::watch_config()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        // A list in progress: replaces everything once complete.
        let mut listing: Option<ByNamespace> = None;
        let mut failing = false;
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = stream.next() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            match event {
                Ok(Event::Init) => listing = Some(ByNamespace::new()),
                Ok(Event::InitApply(service)) => {
                    if let Some(map) = listing.as_mut() {
                        put(map, &service);
                    }
                }
                Ok(Event::InitDone) => {
                    failing = false;
                    let services = listing.take().unwrap_or_default();
                    let count: usize = services.values().map(BTreeMap::len).sum();
                    let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
                    state.services = services;
                    if !state.synced {
                        tracing::info!(
                            services = count,
                            "Services listed: service environment variables available"
                        );
                    }
                    state.synced = true;
                }
                Ok(Event::Apply(service)) => {
                    put(&mut self.state.write().unwrap_or_else(PoisonError::into_inner).services, &service);
                }
                Ok(Event::Delete(service)) => {
                    if let Some((namespace, name, _)) = facts_of(&service) {
                        remove(
                            &mut self.state.write().unwrap_or_else(PoisonError::into_inner).services,
                            &namespace,
                            &name,
                        );
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "watching Services failed; retrying");
                        failing = true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(namespace: &str, name: &str, ip: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"clusterIP": ip, "ports": [{"port": 80}]},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn only_services_with_a_cluster_ip_are_kept_and_changes_apply() {
        let mut map = ByNamespace::new();
        put(&mut map, &service("a", "web", "10.0.0.1"));
        put(&mut map, &service("a", "headless", "None"));
        assert_eq!(map.get("a").map(|m| m.keys().cloned().collect::<Vec<_>>()), Some(vec!["web".to_owned()]));
        // Made headless: dropped.
        put(&mut map, &service("a", "web", "None"));
        assert!(map.is_empty());
        put(&mut map, &service("b", "db", "10.0.0.2"));
        remove(&mut map, "b", "db");
        assert!(map.is_empty());
    }

    #[test]
    fn not_synced_until_listed() {
        let services = ApiServices::default();
        assert_eq!(services.services("a"), None);
        services.state.write().unwrap_or_else(PoisonError::into_inner).synced = true;
        assert_eq!(services.services("a"), Some(BTreeMap::new()));
    }
}
