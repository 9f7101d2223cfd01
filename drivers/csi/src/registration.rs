//! The kubelet's plugin registration protocol (`pluginregistration.v1`), node side: a plugin such
//! as `node-driver-registrar` serves `Registration` on a socket in the plugin registration
//! directory; nodelet calls `GetInfo`, validates the answer as the kubelet's CSI plugin handler
//! does (type `CSIPlugin`, a supported CSI version, an endpoint), and reports the outcome with
//! `NotifyRegistrationStatus` (a registrar exits when told it is not registered).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nodelet_proto::pluginregistration::v1::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};

use crate::client::{CsiClientConfig, unix_channel};
use crate::error::CsiError;

/// The plugin type of CSI drivers.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// What a registration socket says of its plugin, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The driver name.
    pub name: String,
    /// The driver's own socket.
    pub endpoint: PathBuf,
    /// The versions it offers.
    pub versions: Vec<String>,
}

/// Why a registration socket's plugin is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    /// Not a CSI plugin.
    #[error("plugin {name:?} has type {kind:?}; only {CSI_PLUGIN_TYPE} plugins are supported")]
    UnsupportedType {
        /// Its name.
        name: String,
        /// Its type.
        kind: String,
    },
    /// None of its versions is a CSI version nodelet speaks (1.x).
    #[error("CSI driver {name:?} supports none of nodelet's CSI versions (1.x): it offers {versions:?}")]
    UnsupportedVersions {
        /// Its name.
        name: String,
        /// What it offers.
        versions: Vec<String>,
    },
    /// No endpoint, or one that is not an absolute path.
    #[error("CSI driver {name:?} gave no usable endpoint: {endpoint:?}")]
    BadEndpoint {
        /// Its name.
        name: String,
        /// What it gave.
        endpoint: String,
    },
}

/// Validates a plugin's `GetInfo` answer as the kubelet does for CSI plugins.
pub fn validate(
    kind: &str,
    name: &str,
    endpoint: &str,
    versions: &[String],
) -> Result<Registration, RegistrationError> {
    if kind != CSI_PLUGIN_TYPE {
        return Err(RegistrationError::UnsupportedType { name: name.to_owned(), kind: kind.to_owned() });
    }
    let speaks_v1 = versions.iter().any(|v| {
        let v = v.trim_start_matches('v');
        v == "1" || v.starts_with("1.")
    });
    if !speaks_v1 {
        return Err(RegistrationError::UnsupportedVersions {
            name: name.to_owned(),
            versions: versions.to_vec(),
        });
    }
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.is_empty() || !Path::new(path).is_absolute() {
        return Err(RegistrationError::BadEndpoint { name: name.to_owned(), endpoint: endpoint.to_owned() });
    }
    Ok(Registration { name: name.to_owned(), endpoint: PathBuf::from(path), versions: versions.to_vec() })
}

/// A registration socket's client.
#[derive(Debug, Clone)]
pub struct RegistrationSocket {
    client: RegistrationClient<tonic::transport::Channel>,
    socket: PathBuf,
    timeout: Duration,
}

impl RegistrationSocket {
    /// Connects to `socket` (each call then has `timeout` as deadline).
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self, CsiError> {
        let config = CsiClientConfig { call_timeout: timeout, connect_timeout: timeout };
        let channel = unix_channel(socket, &config).await?;
        Ok(Self { client: RegistrationClient::new(channel), socket: socket.to_path_buf(), timeout })
    }

    /// `GetInfo`: the plugin's type, name, endpoint and versions, unvalidated. A socket that does not
    /// serve the registration protocol answers `UNIMPLEMENTED`.
    pub async fn info(&self) -> Result<(String, String, String, Vec<String>), CsiError> {
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(InfoRequest {});
        request.set_timeout(self.timeout);
        let info = match tokio::time::timeout(self.timeout, client.get_info(request)).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => return Err(CsiError::from_status("GetInfo", status)),
            Err(_) => {
                return Err(CsiError::Connect {
                    socket: self.socket.display().to_string(),
                    reason: format!("GetInfo timed out after {:?}", self.timeout),
                });
            }
        };
        Ok((info.r#type, info.name, info.endpoint, info.supported_versions))
    }

    /// `NotifyRegistrationStatus`: tells the plugin whether it is registered (and why not).
    pub async fn notify(&self, registered: bool, error: &str) -> Result<(), CsiError> {
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(RegistrationStatus {
            plugin_registered: registered,
            error: error.to_owned(),
        });
        request.set_timeout(self.timeout);
        match tokio::time::timeout(self.timeout, client.notify_registration_status(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(CsiError::from_status("NotifyRegistrationStatus", status)),
            Err(_) => Err(CsiError::Connect {
                socket: self.socket.display().to_string(),
                reason: format!("NotifyRegistrationStatus timed out after {:?}", self.timeout),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csi_plugins_with_a_v1_version_and_an_absolute_endpoint_are_taken() {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let ok = validate(
            "CSIPlugin",
            "hostpath.csi.k8s.io",
            "/var/lib/nodelet/plugins/h/csi.sock",
            &v(&["1.0.0"]),
        );
        assert_eq!(ok.map(|r| r.endpoint), Ok(PathBuf::from("/var/lib/nodelet/plugins/h/csi.sock")));
        let unix = validate("CSIPlugin", "d", "unix:///run/d.sock", &v(&["v1.2.0"]));
        assert_eq!(unix.map(|r| r.endpoint), Ok(PathBuf::from("/run/d.sock")));
        assert!(matches!(
            validate("DevicePlugin", "gpu", "/x", &v(&["1.0.0"])),
            Err(RegistrationError::UnsupportedType { .. })
        ));
        assert!(matches!(
            validate("CSIPlugin", "d", "/x", &v(&["0.3.0"])),
            Err(RegistrationError::UnsupportedVersions { .. })
        ));
        assert!(matches!(
            validate("CSIPlugin", "d", "relative.sock", &v(&["1.0.0"])),
            Err(RegistrationError::BadEndpoint { .. })
        ));
        assert!(matches!(
            validate("CSIPlugin", "d", "", &v(&["1.0.0"])),
            Err(RegistrationError::BadEndpoint { .. })
        ));
    }
}
