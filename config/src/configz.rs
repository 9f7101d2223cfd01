//! `/configz`: the effective configuration (defaults applied, the file's fields and the flags merged) as
//! the kubelet shows it, `{"kubeletconfig": {...}}` with the KubeletConfiguration (v1beta1 field names and
//! value formats: durations as Go durations, `address` as text, `readOnlyPort` 0 when disabled). Like the
//! kubelet's, the object has no `kind` or `apiVersion` (the kubelet converts its configuration without
//! setting them). nodelet's own settings follow under `nodelet:`, as in the config file.
//!
//! Only fields nodelet acts on appear; a cluster-mode field only in cluster mode. Nothing secret is shown:
//! the values of `staticPodURLHeader` (they may carry credentials) are replaced by `<redacted>`, and so are
//! the user information and the query string of `staticPodURL` ([`redact_url`]). Paths to credential files (`tlsPrivateKeyFile`, `tokenAuthFile`) are
//! shown, as the kubelet shows them; their content never is.

use serde_json::{Map, Value, json};

use super::units::format_go_duration;
use super::{AuthorizationMode, Config, EvictionThreshold, ThresholdValue};

/// What replaces a secret value.
pub const REDACTED: &str = "<redacted>";

/// `url` as it may be shown (problems, events, logs, `/configz`, errors): its user information and its query
/// string, which may carry credentials, each replaced by `<redacted>`, and its fragment dropped
/// (`https://<redacted>@host:8443/pods?<redacted>`). A text that does not parse as a URL is redacted whole.
pub fn redact_url(url: &str) -> String {
    let Ok(parsed) = ::url::Url::parse(url) else { return format!("{REDACTED} (not a URL)") };
    let mut out = format!("{}:", parsed.scheme());
    if let Some(host) = parsed.host_str() {
        out.push_str("//");
        if !parsed.username().is_empty() || parsed.password().is_some() {
            out.push_str(REDACTED);
            out.push('@');
        }
        out.push_str(host);
        if let Some(port) = parsed.port() {
            out.push_str(&format!(":{port}"));
        }
    }
    out.push_str(parsed.path());
    if parsed.query().is_some() {
        out.push('?');
        out.push_str(REDACTED);
    }
    out
}

/// The body of `/configz`.
pub fn configz(config: &Config) -> Value {
    json!({ "kubeletconfig": kubelet_configuration(config) })
}

fn duration(d: std::time::Duration) -> Value {
    Value::from(format_go_duration(d))
}

/// Inserts `key: value` unless `value` is `None`.
fn put<T: Into<Value>>(map: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        map.insert(key.to_owned(), v.into());
    }
}

/// The effective KubeletConfiguration (see the [module docs](self)).
pub fn kubelet_configuration(c: &Config) -> Value {
    let mut m = Map::new();
    let path = |p: &std::path::Path| Value::from(p.display().to_string());

    // pod sources
    m.insert("enableServer".into(), c.server.enabled.into());
    put(&mut m, "staticPodPath", c.sources.static_pod_path.as_deref().map(path));
    m.insert("podLogsDir".into(), path(&c.pods.pod_logs_dir));
    m.insert("syncFrequency".into(), duration(c.sync_frequency));
    m.insert("fileCheckFrequency".into(), duration(c.sources.file_check_frequency));
    m.insert("httpCheckFrequency".into(), duration(c.sources.http_check_frequency));
    put(&mut m, "staticPodURL", c.sources.static_pod_url.as_deref().map(redact_url));
    if !c.sources.static_pod_url_headers.is_empty() {
        let mut headers: Map<String, Value> = Map::new();
        for (name, _) in &c.sources.static_pod_url_headers {
            let values = headers.entry(name.clone()).or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(list) = values {
                list.push(Value::from(REDACTED));
            }
        }
        m.insert("staticPodURLHeader".into(), Value::Object(headers));
    }

    // serving
    m.insert("address".into(), c.server.address.to_string().into());
    m.insert("port".into(), c.server.port.into());
    m.insert("readOnlyPort".into(), c.server.read_only_port.unwrap_or(0).into());
    if let Some(tls) = &c.server.tls {
        m.insert("tlsCertFile".into(), path(&tls.cert_file));
        m.insert("tlsPrivateKeyFile".into(), path(&tls.key_file));
    }
    let auth = &c.server.auth;
    let mut x509 = Map::new();
    put(&mut x509, "clientCAFile", auth.client_ca_file.as_deref().map(path));
    let mut webhook = Map::new();
    webhook.insert("enabled".into(), auth.token_webhook.is_some().into());
    put(&mut webhook, "cacheTTL", auth.token_webhook.map(|w| duration(w.cache_ttl)));
    m.insert(
        "authentication".into(),
        json!({ "x509": x509, "webhook": webhook, "anonymous": { "enabled": auth.anonymous } }),
    );
    let authorization = match auth.authorization {
        AuthorizationMode::AlwaysAllow => json!({ "mode": "AlwaysAllow", "webhook": {} }),
        AuthorizationMode::Webhook { cache_authorized_ttl, cache_unauthorized_ttl } => json!({
            "mode": "Webhook",
            "webhook": {
                "cacheAuthorizedTTL": duration(cache_authorized_ttl),
                "cacheUnauthorizedTTL": duration(cache_unauthorized_ttl),
            },
        }),
    };
    m.insert("authorization".into(), authorization);
    m.insert("streamingConnectionIdleTimeout".into(), duration(c.server.streaming_connection_idle_timeout));
    m.insert("healthzPort".into(), c.server.healthz.map_or(0, |h| h.port()).into());
    if let Some(h) = c.server.healthz {
        m.insert("healthzBindAddress".into(), h.ip().to_string().into());
    }

    // pods and DNS
    m.insert("clusterDomain".into(), c.pods.cluster_domain.clone().into());
    if !c.pods.cluster_dns.is_empty() {
        let dns: Vec<Value> = c.pods.cluster_dns.iter().map(|ip| ip.to_string().into()).collect();
        m.insert("clusterDNS".into(), dns.into());
    }
    put(&mut m, "cgroupRoot", c.pods.cgroup_root.clone());
    m.insert("maxPods".into(), c.pods.max_pods.into());
    m.insert("seccompDefault".into(), c.pods.seccomp_default.into());
    if !c.pods.allowed_unsafe_sysctls.is_empty() {
        m.insert("allowedUnsafeSysctls".into(), c.pods.allowed_unsafe_sysctls.clone().into());
    }
    m.insert("podPidsLimit".into(), c.pods.pod_pids_limit.unwrap_or(-1).into());
    m.insert("resolvConf".into(), c.pods.resolv_conf.as_deref().map_or_else(|| Value::from(""), path));
    m.insert("podCIDR".into(), c.runtime.embedded.pod_cidr.to_string().into());

    // runtime
    put(&mut m, "containerRuntimeEndpoint", c.runtime.endpoint.clone());
    m.insert("runtimeRequestTimeout".into(), duration(c.runtime.request_timeout));
    m.insert("serializeImagePulls".into(), c.image_pulls.serialize.into());
    put(&mut m, "maxParallelImagePulls", c.image_pulls.max_parallel);
    m.insert(
        "crashLoopBackOff".into(),
        json!({ "maxContainerRestartPeriod": duration(c.backoff.container_restart.max) }),
    );

    // eviction, image GC, container logs, volume stats
    m.insert("evictionHard".into(), thresholds(&c.eviction.hard));
    if !c.eviction.soft.is_empty() {
        m.insert("evictionSoft".into(), thresholds(&c.eviction.soft));
    }
    if !c.eviction.soft_grace_period.is_empty() {
        let grace: Map<String, Value> =
            c.eviction.soft_grace_period.iter().map(|(k, d)| (k.clone(), duration(*d))).collect();
        m.insert("evictionSoftGracePeriod".into(), grace.into());
    }
    m.insert("evictionPressureTransitionPeriod".into(), duration(c.eviction.pressure_transition_period));
    m.insert("evictionMaxPodGracePeriod".into(), c.eviction.max_pod_grace_period.into());
    m.insert("localStorageCapacityIsolation".into(), c.eviction.local_storage_capacity_isolation.into());
    if !c.eviction.minimum_reclaim.is_empty() {
        let reclaim: Map<String, Value> =
            c.eviction.minimum_reclaim.iter().map(|(k, v)| (k.clone(), threshold(*v))).collect();
        m.insert("evictionMinimumReclaim".into(), reclaim.into());
    }
    m.insert("imageGCHighThresholdPercent".into(), c.image_gc.high_threshold_percent.into());
    m.insert("imageGCLowThresholdPercent".into(), c.image_gc.low_threshold_percent.into());
    m.insert("imageMinimumGCAge".into(), duration(c.image_gc.minimum_age));
    m.insert(
        "imageMaximumGCAge".into(),
        duration(c.image_gc.maximum_age.unwrap_or(std::time::Duration::ZERO)),
    );
    m.insert("containerLogMaxSize".into(), quantity(c.container_logs.max_size).into());
    m.insert("containerLogMaxFiles".into(), c.container_logs.max_files.into());
    m.insert("containerLogMonitorInterval".into(), duration(c.container_logs.monitor_interval));
    m.insert("volumeStatsAggPeriod".into(), duration(c.storage.volume_stats_agg_period));

    // cluster mode
    if let Some(cluster) = &c.cluster {
        m.insert("registerNode".into(), cluster.register_node.into());
        if !cluster.register_with_taints.is_empty() {
            m.insert(
                "registerWithTaints".into(),
                serde_json::to_value(&cluster.register_with_taints).unwrap_or_default(),
            );
        }
        m.insert("kubeAPIQPS".into(), cluster.kube_api_qps.into());
        m.insert("kubeAPIBurst".into(), cluster.kube_api_burst.into());
        m.insert("nodeStatusUpdateFrequency".into(), duration(cluster.node_status_update_frequency));
        m.insert("nodeStatusReportFrequency".into(), duration(cluster.node_status_report_frequency));
        m.insert("nodeLeaseDurationSeconds".into(), cluster.node_lease_duration.as_secs().into());
        m.insert("rotateCertificates".into(), cluster.rotate_certificates.into());
        m.insert("serverTLSBootstrap".into(), cluster.server_tls_bootstrap.into());
    }

    // logging
    let mut logging = Map::new();
    logging.insert("format".into(), c.logging.format.name().into());
    logging.insert("verbosity".into(), c.logging.verbosity.unwrap_or(0).into());
    m.insert("logging".into(), logging.into());

    m.insert("nodelet".into(), nodelet_section(c));
    Value::Object(m)
}

/// The `nodelet:` section: nodelet's own settings.
fn nodelet_section(c: &Config) -> Value {
    let path = |p: &std::path::Path| Value::from(p.display().to_string());
    let backoff = |b: &super::BackOff| json!({ "initial": duration(b.initial), "max": duration(b.max), "resetAfter": duration(b.reset_after) });
    let mut n = Map::new();
    n.insert("allowPrivileged".into(), c.pods.allow_privileged.into());
    put(&mut n, "maxTerminationGracePeriodSeconds", c.pods.max_grace_period.map(|d| d.as_secs()));
    let levels = &c.pods.pod_security;
    n.insert(
        "podSecurity".into(),
        json!({"file": levels.file.as_str(), "url": levels.url.as_str(), "http": levels.http.as_str(), "api": levels.api.as_str()}),
    );
    n.insert("httpPodNamespaces".into(), c.pods.http_pod_namespaces.clone().into());
    n.insert("httpPodLabels".into(), c.pods.http_pod_labels.clone().into());
    n.insert(
        "allowedHostPaths".into(),
        c.pods
            .allowed_host_paths
            .iter()
            .map(|p| Value::from(p.display().to_string()))
            .collect::<Vec<_>>()
            .into(),
    );
    put(&mut n, "tokenAuthFile", c.server.auth.token_auth_file.as_deref().map(path));
    n.insert("maxStreamingSessionsPerUser".into(), c.server.max_streaming_sessions_per_user.into());
    put(&mut n, "manifestHTTPAddress", c.sources.manifest_http_addr.map(|a| a.to_string()));
    n.insert("podInfraContainerImage".into(), c.runtime.pod_infra_container_image.clone().into());
    if c.runtime.endpoint.is_none() {
        n.insert("containerdPath".into(), path(&c.runtime.embedded.containerd_path));
        put(&mut n, "containerdConfigExtra", c.runtime.embedded.config_extra.as_deref().map(path));
        n.insert("cniBridge".into(), c.runtime.embedded.cni_bridge.clone().into());
    }
    put(&mut n, "preloadImages", c.runtime.preload_images.as_deref().map(path));
    n.insert("containerRestartBackOff".into(), backoff(&c.backoff.container_restart));
    n.insert("imagePullBackOff".into(), backoff(&c.backoff.image_pull));
    n.insert("plegRelistPeriod".into(), duration(c.pleg_relist_period));
    n.insert("plegEventedRelistPeriod".into(), duration(c.pleg_evented_relist_period));
    let mut storage = Map::new();
    storage.insert("localPath".into(), json!({ "basePath": path(&c.storage.local_base_path) }));
    if let Some(vg) = &c.storage.lvm_volume_group {
        storage.insert("lvm".into(), json!({ "volumeGroup": vg }));
    }
    storage.insert("csi".into(), json!({ "pluginDir": path(&c.storage.csi_plugin_dir) }));
    n.insert("storage".into(), storage.into());
    n.insert("imageGCPeriod".into(), duration(c.image_gc.period));
    n.insert("evictionMonitoringPeriod".into(), duration(c.eviction.monitoring_period));
    n.insert("localStorageEntryBudget".into(), c.eviction.local_storage_entry_budget.into());
    let gc = &c.container_gc;
    n.insert(
        "containerGC".into(),
        json!({
            "period": duration(gc.period),
            "minAge": duration(gc.min_age),
            "maxPerPodContainer": gc.max_per_pod_container,
            "maxContainers": gc.max_containers.map_or(-1, i64::from),
        }),
    );
    Value::Object(n)
}

fn thresholds(list: &[EvictionThreshold]) -> Value {
    list.iter().map(|t| (t.signal.clone(), threshold(t.value))).collect::<Map<String, Value>>().into()
}

fn threshold(v: ThresholdValue) -> Value {
    match v {
        ThresholdValue::Quantity(q) => quantity(q).into(),
        ThresholdValue::Percentage(_) => v.to_string().into(),
    }
}

/// Bytes as a Kubernetes quantity with the largest binary suffix that divides them (`10Mi`).
fn quantity(bytes: u64) -> String {
    for (suffix, unit) in [("Ti", 1_u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if bytes != 0 && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_use_binary_suffixes() {
        assert_eq!(quantity(10 << 20), "10Mi");
        assert_eq!(quantity(1536), "1536");
        assert_eq!(quantity(0), "0");
        assert_eq!(quantity(3 << 30), "3Gi");
    }
}
