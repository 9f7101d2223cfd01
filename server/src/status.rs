//! Error responses as `Status` objects, the way the API server writes them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;

/// A `Status` failure response: `{"kind":"Status","apiVersion":"v1","status":"Failure","message":..,
/// "reason":..,"code":..}`. The reason is the API server's `StatusReason` for the code.
pub(crate) fn failure(code: StatusCode, message: impl Into<String>) -> Response {
    let status = Status {
        code: Some(i32::from(code.as_u16())),
        message: Some(message.into()),
        reason: Some(reason(code).to_owned()),
        status: Some("Failure".to_owned()),
        ..Status::default()
    };
    match serde_json::to_vec(&status) {
        Ok(body) => {
            let mut response = (code, body).into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        // Serializing a Status made only of strings cannot fail; answer in plain text if it ever does.
        Err(_) => (code, code.canonical_reason().unwrap_or("error").to_owned()).into_response(),
    }
}

/// The API server's `metav1.StatusReason` for an HTTP code.
fn reason(code: StatusCode) -> &'static str {
    match code {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
        StatusCode::CONFLICT => "Conflict",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        _ => "InternalError",
    }
}
