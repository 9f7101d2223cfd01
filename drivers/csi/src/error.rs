//! The error type of CSI calls, with the kubelet's final/uncertain classification.

use std::time::Duration;

/// gRPC codes after which the operation may still be in progress (or done) in the driver: the kubelet's
/// `isFinalError` treats exactly these as not final [K:pkg/volume/csi/csi_client.go].
const UNCERTAIN_CODES: [tonic::Code; 5] = [
    tonic::Code::Cancelled,
    tonic::Code::DeadlineExceeded,
    tonic::Code::Unavailable,
    tonic::Code::ResourceExhausted,
    tonic::Code::Aborted,
];

/// Errors returned by [`CsiClient`](crate::CsiClient) and the [`Registry`](crate::Registry).
///
/// Every variant that belongs to a call names it (`"NodeStageVolume"`, …). The important question for a
/// caller is [`is_uncertain`](Self::is_uncertain): after an uncertain error of `NodeStageVolume` or
/// `NodePublishVolume` the volume may be mounted, so the volume reconciler must record it as "maybe mounted"
/// and tear it down (or retry) rather than forget it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CsiError {
    /// The endpoint is not a unix socket address this client understands.
    #[error("invalid CSI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        reason: String,
    },

    /// Connecting to the driver's socket failed (missing, refused, permission denied, …) or did not finish
    /// within the connect timeout.
    #[error("cannot connect to CSI driver at {socket}: {reason}")]
    Connect {
        /// The socket path that was dialled.
        socket: String,
        /// The transport error and its causes.
        reason: String,
    },

    /// The client-side deadline expired before the driver answered. The call was cancelled, but the
    /// driver may have done (part of) the work.
    #[error("CSI {call} timed out after {after:?}")]
    Timeout {
        /// The gRPC method, e.g. `"NodePublishVolume"`.
        call: &'static str,
        /// The deadline that expired.
        after: Duration,
    },

    /// The call failed in the transport (connection reset, driver killed mid-call, socket gone, …): tonic
    /// reports these as a gRPC status with a source error (often `UNKNOWN: transport error`), but the
    /// driver never answered. Always uncertain, as any non-gRPC error is for the kubelet.
    #[error("CSI {call} transport failure ({code:?}): {reason}")]
    Transport {
        /// The gRPC method.
        call: &'static str,
        /// The code tonic chose for the failure.
        code: tonic::Code,
        /// The transport error and its causes.
        reason: String,
    },

    /// The driver returned a gRPC status.
    #[error("CSI {call} failed ({code:?}): {message}")]
    Status {
        /// The gRPC method.
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The driver's message.
        message: String,
    },

    /// The driver answered OK but the response breaks the CSI contract (a REQUIRED field is missing).
    #[error("CSI {call}: invalid response: {reason}")]
    InvalidResponse {
        /// The gRPC method.
        call: &'static str,
        /// What was missing or malformed.
        reason: String,
    },
}

impl CsiError {
    /// Converts the gRPC status a `call` failed with: [`Transport`](Self::Transport) when tonic made it
    /// from a transport error (the status carries a source error), [`Status`](Self::Status) when the
    /// driver sent it.
    pub fn from_status(call: &'static str, status: tonic::Status) -> Self {
        use std::error::Error as _;
        if let Some(source) = status.source() {
            let mut reason = status.message().to_owned();
            let mut next = Some(source);
            while let Some(e) = next {
                let text = e.to_string();
                if !reason.contains(&text) {
                    reason.push_str(": ");
                    reason.push_str(&text);
                }
                next = e.source();
            }
            return CsiError::Transport { call, code: status.code(), reason };
        }
        CsiError::Status { call, code: status.code(), message: status.message().to_owned() }
    }

    /// True when the operation may still be in progress in the driver, or may have completed: the call
    /// timed out, was cancelled, the driver was unavailable, out of resources or busy with the same volume
    /// (`ABORTED`), or the failure happened in the transport before any status was received.
    ///
    /// This is the kubelet's `!isFinalError`: after an uncertain `NodeStageVolume`/`NodePublishVolume`
    /// the volume must be treated as possibly mounted (the kubelet's "uncertain" mount state). An
    /// [`InvalidResponse`](Self::InvalidResponse) also counts as uncertain: the driver did *something*.
    pub fn is_uncertain(&self) -> bool {
        match self {
            CsiError::InvalidEndpoint { .. } => false,
            CsiError::Connect { .. }
            | CsiError::Transport { .. }
            | CsiError::Timeout { .. }
            | CsiError::InvalidResponse { .. } => true,
            CsiError::Status { code, .. } => UNCERTAIN_CODES.contains(code),
        }
    }

    /// True when the operation certainly did not happen (or failed for good): the opposite of
    /// [`is_uncertain`](Self::is_uncertain). `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
    /// `FAILED_PRECONDITION`, `UNIMPLEMENTED`, `INTERNAL`, … are final.
    pub fn is_final(&self) -> bool {
        !self.is_uncertain()
    }

    /// True when the driver answered `NOT_FOUND` (e.g. an unknown volume ID).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }

    /// True when the driver does not implement the call (`UNIMPLEMENTED`).
    pub fn is_unimplemented(&self) -> bool {
        self.code() == Some(tonic::Code::Unimplemented)
    }

    /// True when the driver could not be reached: connect or transport failure, or `UNAVAILABLE`.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, CsiError::Connect { .. } | CsiError::Transport { .. })
            || self.code() == Some(tonic::Code::Unavailable)
    }

    /// The gRPC status code this error is or stands for (a client timeout is `DEADLINE_EXCEEDED`).
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CsiError::Status { code, .. } | CsiError::Transport { code, .. } => Some(*code),
            CsiError::Timeout { .. } => Some(tonic::Code::DeadlineExceeded),
            _ => None,
        }
    }

    /// The CSI call that failed, when the error belongs to one.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            CsiError::Timeout { call, .. }
            | CsiError::Status { call, .. }
            | CsiError::Transport { call, .. }
            | CsiError::InvalidResponse { call, .. } => Some(call),
            _ => None,
        }
    }
}

/// `Result` with [`CsiError`].
pub type Result<T, E = CsiError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code) -> CsiError {
        CsiError::from_status("NodeStageVolume", tonic::Status::new(code, "msg"))
    }

    #[test]
    fn classification_follows_the_kubelet() {
        for code in [
            tonic::Code::Cancelled,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Unavailable,
            tonic::Code::ResourceExhausted,
            tonic::Code::Aborted,
        ] {
            assert!(status(code).is_uncertain(), "{code:?} must be uncertain");
        }
        for code in [
            tonic::Code::InvalidArgument,
            tonic::Code::NotFound,
            tonic::Code::AlreadyExists,
            tonic::Code::FailedPrecondition,
            tonic::Code::PermissionDenied,
            tonic::Code::OutOfRange,
            tonic::Code::Unimplemented,
            tonic::Code::Internal,
            tonic::Code::Unknown,
            tonic::Code::Unauthenticated,
        ] {
            assert!(status(code).is_final(), "{code:?} must be final");
        }
        assert!(
            CsiError::Timeout { call: "NodePublishVolume", after: Duration::from_secs(120) }.is_uncertain()
        );
        assert!(CsiError::Connect { socket: "/x.sock".into(), reason: "refused".into() }.is_uncertain());
        assert!(CsiError::InvalidEndpoint { endpoint: "tcp://x".into(), reason: "no".into() }.is_final());
    }

    #[test]
    fn transport_failures_are_uncertain_whatever_their_code() {
        // tonic turns a reset connection into UNKNOWN "transport error" with the cause as source.
        let status = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )));
        assert_eq!(status.code(), tonic::Code::Unknown);
        let e = CsiError::from_status("NodePublishVolume", status);
        assert!(matches!(e, CsiError::Transport { .. }), "{e:?}");
        assert!(e.is_uncertain() && e.is_unavailable());
        assert!(e.to_string().contains("connection reset by peer"), "{e}");
        // The same code sent by a driver is final.
        assert!(status_is_final(tonic::Code::Unknown));
    }

    fn status_is_final(code: tonic::Code) -> bool {
        status(code).is_final()
    }

    #[test]
    fn predicates_and_display() {
        let e = status(tonic::Code::NotFound);
        assert!(e.is_not_found());
        assert_eq!(e.call(), Some("NodeStageVolume"));
        assert_eq!(e.to_string(), "CSI NodeStageVolume failed (NotFound): msg");
        assert!(status(tonic::Code::Unimplemented).is_unimplemented());
        assert!(status(tonic::Code::Unavailable).is_unavailable());
        let t = CsiError::Timeout { call: "Probe", after: Duration::from_secs(120) };
        assert_eq!(t.code(), Some(tonic::Code::DeadlineExceeded));
        assert_eq!(t.to_string(), "CSI Probe timed out after 120s");
    }
}
