//! The error type of every fallible operation of this crate.

use std::time::Duration;

/// Errors returned by [`CriClient`](crate::CriClient) and the event stream machinery.
///
/// Every variant that comes from a gRPC call names the call (`"RunPodSandbox"`, `"ContainerStatus"`, …) so a
/// log line is useful on its own. Use the predicates ([`is_not_found`](Self::is_not_found),
/// [`is_timeout`](Self::is_timeout), …) rather than matching on variants when only the class matters.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CriError {
    /// The configured endpoint is not a unix socket address this client understands.
    #[error("invalid CRI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The initial connection to the runtime socket failed (socket missing, permission denied, refused, …).
    #[error("cannot connect to container runtime at {endpoint}: {reason}")]
    Connect {
        /// The socket path that was dialled.
        endpoint: String,
        /// The transport error and its causes.
        reason: String,
    },

    /// The initial connection to the runtime socket did not complete within the connect timeout.
    #[error("timed out after {after:?} connecting to container runtime at {endpoint}")]
    ConnectTimeout {
        /// The socket path that was dialled.
        endpoint: String,
        /// The connect timeout that expired.
        after: Duration,
    },

    /// The client-side deadline of a call expired before the runtime answered. The call was cancelled.
    #[error("CRI {call} timed out after {after:?}")]
    Timeout {
        /// The gRPC method, e.g. `"StopContainer"`.
        call: &'static str,
        /// The deadline that expired.
        after: Duration,
    },

    /// The runtime answered `NOT_FOUND`: the sandbox, container or image does not exist (any more).
    #[error("CRI {call}: not found: {message}")]
    NotFound {
        /// The gRPC method.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },

    /// The runtime does not implement this call (`UNIMPLEMENTED`), e.g. `GetContainerEvents` on containerd 1.6.
    #[error("CRI {call} is not implemented by the runtime: {message}")]
    Unimplemented {
        /// The gRPC method.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },

    /// Any other gRPC status returned by the runtime (or by the transport, e.g. `UNAVAILABLE` when the socket
    /// went away after the initial connection).
    #[error("CRI {call} failed ({code:?}): {message}")]
    Status {
        /// The gRPC method.
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The runtime's message.
        message: String,
    },

    /// The runtime answered successfully but the response lacks a field the CRI contract requires.
    #[error("CRI {call}: invalid response: {reason}")]
    InvalidResponse {
        /// The gRPC method.
        call: &'static str,
        /// What was missing or malformed.
        reason: String,
    },
}

impl CriError {
    /// Converts a gRPC status returned by `call` into the matching variant.
    pub fn from_status(call: &'static str, status: tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            tonic::Code::NotFound => CriError::NotFound { call, message },
            tonic::Code::Unimplemented => CriError::Unimplemented { call, message },
            code => CriError::Status { call, code, message },
        }
    }

    /// True when the runtime reported that the object does not exist.
    ///
    /// Reconcilers treat this as success for stop/remove and as "gone" for status calls.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::NotFound { .. })
    }

    /// True when the runtime does not implement the call.
    pub fn is_unimplemented(&self) -> bool {
        matches!(self, CriError::Unimplemented { .. })
    }

    /// True when a deadline expired: either this client's deadline ([`CriError::Timeout`],
    /// [`CriError::ConnectTimeout`]) or the runtime's own (`DEADLINE_EXCEEDED`, e.g. an `ExecSync` command
    /// that outlived its timeout).
    pub fn is_timeout(&self) -> bool {
        match self {
            CriError::Timeout { .. } | CriError::ConnectTimeout { .. } => true,
            CriError::Status { code, .. } => *code == tonic::Code::DeadlineExceeded,
            _ => false,
        }
    }

    /// True when the error says the runtime could not be reached (initial connect failure or `UNAVAILABLE`).
    /// Such errors are worth retrying with backoff.
    pub fn is_unavailable(&self) -> bool {
        match self {
            CriError::Connect { .. } | CriError::ConnectTimeout { .. } => true,
            CriError::Status { code, .. } => *code == tonic::Code::Unavailable,
            _ => false,
        }
    }

    /// The gRPC status code this error corresponds to, if it came from (or stands for) a gRPC status.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CriError::NotFound { .. } => Some(tonic::Code::NotFound),
            CriError::Unimplemented { .. } => Some(tonic::Code::Unimplemented),
            CriError::Status { code, .. } => Some(*code),
            CriError::Timeout { .. } => Some(tonic::Code::DeadlineExceeded),
            _ => None,
        }
    }

    /// The CRI call that failed, when the error belongs to one.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            CriError::Timeout { call, .. }
            | CriError::NotFound { call, .. }
            | CriError::Unimplemented { call, .. }
            | CriError::Status { call, .. }
            | CriError::InvalidResponse { call, .. } => Some(call),
            _ => None,
        }
    }
}

/// `Result` with [`CriError`].
pub type Result<T, E = CriError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping_and_predicates() {
        let e = CriError::from_status("ContainerStatus", tonic::Status::not_found("no such container"));
        assert!(e.is_not_found());
        assert_eq!(e.call(), Some("ContainerStatus"));
        assert_eq!(e.code(), Some(tonic::Code::NotFound));
        assert!(e.to_string().contains("ContainerStatus"));
        assert!(e.to_string().contains("no such container"));

        let e = CriError::from_status("GetContainerEvents", tonic::Status::unimplemented("nope"));
        assert!(e.is_unimplemented());
        assert!(!e.is_not_found());

        let e = CriError::from_status("ExecSync", tonic::Status::deadline_exceeded("timeout 1s exceeded"));
        assert!(e.is_timeout());
        assert!(matches!(e, CriError::Status { code: tonic::Code::DeadlineExceeded, .. }));

        let e = CriError::from_status("Version", tonic::Status::unavailable("transport error"));
        assert!(e.is_unavailable());
        assert!(!e.is_timeout());

        let e = CriError::Timeout { call: "StopPodSandbox", after: Duration::from_secs(120) };
        assert!(e.is_timeout());
        assert_eq!(e.to_string(), "CRI StopPodSandbox timed out after 120s");
    }
}
