//! List filters for sandboxes and containers.
//!
//! The runtime applies all set criteria together (AND). Label selectors match exact key/value pairs.

use std::collections::HashMap;

use k8s_cri::v1;

use crate::labels;

/// Filter for [`CriClient::list_pod_sandboxes`](crate::CriClient::list_pod_sandboxes).
///
/// ```
/// use nodelet_cri::{SandboxFilter, proto::PodSandboxState};
/// let ready_nodelet_sandboxes = SandboxFilter::managed().state(PodSandboxState::SandboxReady);
/// # let _ = ready_nodelet_sandboxes;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Only the sandbox with this ID (the runtime also accepts a unique ID prefix).
    pub id: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<v1::PodSandboxState>,
    /// Only sandboxes carrying all these labels.
    pub labels: HashMap<String, String>,
}

impl SandboxFilter {
    /// No filter: every sandbox of the runtime, including ones nodelet did not create.
    pub fn all() -> Self {
        SandboxFilter::default()
    }

    /// Sandboxes carrying the nodelet marker label ([`labels::MANAGED`]).
    pub fn managed() -> Self {
        SandboxFilter::default().label(labels::MANAGED, labels::MANAGED_VALUE)
    }

    /// Restricts to one sandbox ID.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Restricts to a state.
    pub fn state(mut self, state: v1::PodSandboxState) -> Self {
        self.state = Some(state);
        self
    }

    /// Adds a required label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The protobuf form, `None` when nothing is filtered.
    pub fn to_proto(&self) -> Option<v1::PodSandboxFilter> {
        if *self == SandboxFilter::default() {
            return None;
        }
        Some(v1::PodSandboxFilter {
            id: self.id.clone().unwrap_or_default(),
            state: self.state.map(|s| v1::PodSandboxStateValue { state: s as i32 }),
            label_selector: self.labels.clone(),
        })
    }
}

/// Filter for [`CriClient::list_containers`](crate::CriClient::list_containers).
///
/// ```
/// use nodelet_cri::{ContainerFilter, proto::ContainerState};
/// let running_in_pod = ContainerFilter::managed().pod_sandbox_id("5f0c…").state(ContainerState::ContainerRunning);
/// # let _ = running_in_pod;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    /// Only the container with this ID (the runtime also accepts a unique ID prefix).
    pub id: Option<String>,
    /// Only containers in this state.
    pub state: Option<v1::ContainerState>,
    /// Only containers of this sandbox.
    pub pod_sandbox_id: Option<String>,
    /// Only containers carrying all these labels.
    pub labels: HashMap<String, String>,
}

impl ContainerFilter {
    /// No filter: every container of the runtime, including ones nodelet did not create.
    pub fn all() -> Self {
        ContainerFilter::default()
    }

    /// Containers carrying the nodelet marker label ([`labels::MANAGED`]).
    pub fn managed() -> Self {
        ContainerFilter::default().label(labels::MANAGED, labels::MANAGED_VALUE)
    }

    /// Restricts to one container ID.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Restricts to a state.
    pub fn state(mut self, state: v1::ContainerState) -> Self {
        self.state = Some(state);
        self
    }

    /// Restricts to the containers of one sandbox.
    pub fn pod_sandbox_id(mut self, id: impl Into<String>) -> Self {
        self.pod_sandbox_id = Some(id.into());
        self
    }

    /// Adds a required label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The protobuf form, `None` when nothing is filtered.
    pub fn to_proto(&self) -> Option<v1::ContainerFilter> {
        if *self == ContainerFilter::default() {
            return None;
        }
        Some(v1::ContainerFilter {
            id: self.id.clone().unwrap_or_default(),
            state: self.state.map(|s| v1::ContainerStateValue { state: s as i32 }),
            pod_sandbox_id: self.pod_sandbox_id.clone().unwrap_or_default(),
            label_selector: self.labels.clone(),
        })
    }

    /// The stats-filter form used by
    /// [`CriClient::list_container_stats`](crate::CriClient::list_container_stats). The runtime's stats filter
    /// has no state criterion, so [`state`](Self::state) is ignored there.
    pub fn to_stats_proto(&self) -> Option<v1::ContainerStatsFilter> {
        if self.id.is_none() && self.pod_sandbox_id.is_none() && self.labels.is_empty() {
            return None;
        }
        Some(v1::ContainerStatsFilter {
            id: self.id.clone().unwrap_or_default(),
            pod_sandbox_id: self.pod_sandbox_id.clone().unwrap_or_default(),
            label_selector: self.labels.clone(),
        })
    }
}

impl SandboxFilter {
    /// The stats-filter form used by
    /// [`CriClient::list_pod_sandbox_stats`](crate::CriClient::list_pod_sandbox_stats). The runtime's stats
    /// filter has no state criterion, so [`state`](Self::state) is ignored there.
    pub fn to_stats_proto(&self) -> Option<v1::PodSandboxStatsFilter> {
        if self.id.is_none() && self.labels.is_empty() {
            return None;
        }
        Some(v1::PodSandboxStatsFilter {
            id: self.id.clone().unwrap_or_default(),
            label_selector: self.labels.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_forms() {
        assert_eq!(SandboxFilter::all().to_proto(), None);
        assert_eq!(ContainerFilter::all().to_proto(), None);
        assert_eq!(ContainerFilter::all().state(v1::ContainerState::ContainerExited).to_stats_proto(), None);

        let f = SandboxFilter::managed().state(v1::PodSandboxState::SandboxNotready).to_proto();
        let f = f.expect("filter");
        assert_eq!(
            f.state,
            Some(v1::PodSandboxStateValue { state: v1::PodSandboxState::SandboxNotready as i32 })
        );
        assert_eq!(f.label_selector.get(labels::MANAGED).map(String::as_str), Some("true"));
        assert!(f.id.is_empty());

        let c = ContainerFilter::managed().pod_sandbox_id("abc").id("def").to_proto().expect("filter");
        assert_eq!((c.id.as_str(), c.pod_sandbox_id.as_str(), c.state), ("def", "abc", None));
        let s = ContainerFilter::all().pod_sandbox_id("abc").to_stats_proto().expect("filter");
        assert_eq!(s.pod_sandbox_id, "abc");
        let s = SandboxFilter::all().id("p").to_stats_proto().expect("filter");
        assert_eq!(s.id, "p");
    }
}
