//! The S3 side of the lake: the client's timeouts and retries, the endpoint, opening the store,
//! and reading an HTTP status and retryability out of its errors.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use super::guarded::{PublicOnlyConnector, is_refused_address};
use super::timeouts::{CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use super::{S3Target, Sse};
use crate::endpoint::{AddressPolicy, check_endpoint};
use crate::error::{Failure, FailureReason, LakeError};

pub(super) fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    }
}

/// `https://host` → `https://<bucket>.host` for virtual-hosted requests to a custom endpoint
/// (object_store expects the bucket in such an endpoint already).
pub(super) fn virtual_hosted_endpoint(endpoint: &str, bucket: &str) -> String {
    match endpoint.split_once("://") {
        Some((scheme, rest)) if !rest.starts_with(&format!("{bucket}.")) => {
            format!("{scheme}://{bucket}.{rest}")
        }
        _ => endpoint.to_owned(),
    }
}

pub(super) fn open_s3(t: &S3Target) -> Result<Arc<dyn ObjectStore>, LakeError> {
    if t.bucket.trim().is_empty() {
        return Err(LakeError::Config("bucket is empty".into()));
    }
    if t.region.trim().is_empty() {
        return Err(LakeError::Config("region is empty".into()));
    }
    if t.access_key.trim().is_empty() || t.secret_key.is_empty() {
        return Err(LakeError::Config(
            "the access key and the secret key must both be set".into(),
        ));
    }
    let mut builder = AmazonS3Builder::new()
        .with_region(t.region.trim())
        .with_bucket_name(t.bucket.trim())
        .with_access_key_id(t.access_key.trim())
        .with_secret_access_key(t.secret_key.expose())
        .with_virtual_hosted_style_request(!t.path_style)
        .with_retry(retry_config())
        .with_client_options(
            ClientOptions::new()
                .with_timeout(REQUEST_TIMEOUT)
                .with_connect_timeout(CONNECT_TIMEOUT),
        );
    if let Some(endpoint) = t
        .endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        // The same rules as the configuration's, again here: no user name or password (they
        // would end up in logs and errors), no path, query or fragment; the error never echoes.
        let endpoint = check_endpoint(endpoint, t.addresses)
            .map_err(|e| LakeError::Config(format!("endpoint {e}")))?;
        let endpoint = if t.path_style {
            endpoint
        } else {
            virtual_hosted_endpoint(&endpoint, t.bucket.trim())
        };
        builder = builder
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint);
    }
    if t.addresses == AddressPolicy::PublicOnly {
        builder = builder.with_http_connector(PublicOnlyConnector {
            allow_http: t
                .endpoint
                .as_deref()
                .is_some_and(|e| e.trim().starts_with("http://")),
        });
    }
    builder = match &t.sse {
        None => builder,
        Some(Sse::Kms { key_id: Some(id) }) => builder.with_sse_kms_encryption(id.clone()),
        Some(sse) => {
            let key = AmazonS3ConfigKey::from_str("aws_server_side_encryption")
                .map_err(|e| LakeError::Config(format!("sse: {e}")))?;
            builder.with_config(key, sse.to_string())
        }
    };
    // The builder's errors name settings, never their secret values.
    let store = builder
        .build()
        .map_err(|e| LakeError::Config(e.to_string()))?;
    Ok(Arc::new(store))
}

/// The status an `object_store` error stands for (see [`RequestObserver`]).
pub(crate) fn status_of(e: &object_store::Error) -> u16 {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => 404,
        // S3 answers 412 to a create-only put that finds the key taken.
        E::AlreadyExists { .. } | E::Precondition { .. } => 412,
        E::NotModified { .. } => 304,
        E::PermissionDenied { .. } => 403,
        E::Unauthenticated { .. } => 401,
        _ => status_in_text(e).unwrap_or(0),
    }
}

/// object_store does not expose the status of its other HTTP errors as a value; its message
/// says `status code: 503 Service Unavailable` when the service answered.
pub(super) fn status_in_text(e: &(dyn std::error::Error + 'static)) -> Option<u16> {
    let mut current = Some(e);
    while let Some(err) = current {
        let text = err.to_string();
        if let Some(at) = text.find("status code: ") {
            let digits = text.get(at + 13..at + 16)?;
            return digits.parse().ok();
        }
        current = err.source();
    }
    None
}

pub(super) fn retryable(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    match e {
        E::Generic { .. } => match status_of(e) {
            408 | 429 => true,
            400..=499 => false,
            _ => true,
        },
        E::JoinError { .. } => true,
        _ => false,
    }
}

/// A status and a class for an `object_store` error; its text (which holds the peer's answer)
/// is read for the status only and then dropped.
pub(crate) fn classify(e: &object_store::Error) -> Failure {
    let status = status_of(e);
    let reason = match status {
        0 => transport_reason(e),
        300..=399 => FailureReason::Redirected,
        401 => FailureReason::Unauthenticated,
        403 => FailureReason::AccessDenied,
        404 => FailureReason::NotFound,
        409 | 412 => FailureReason::Conflict,
        429 => FailureReason::Throttled,
        400..=499 => FailureReason::Rejected,
        500..=599 => FailureReason::ServerError,
        _ => FailureReason::Other,
    };
    Failure { status, reason }
}

/// Why no answer came: a refused address, a timeout, or no connection.
fn transport_reason(e: &object_store::Error) -> FailureReason {
    if is_refused_address(e) {
        return FailureReason::RefusedAddress;
    }
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(http) = err.downcast_ref::<object_store::client::HttpError>() {
            return match http.kind() {
                object_store::client::HttpErrorKind::Timeout => FailureReason::Timeout,
                object_store::client::HttpErrorKind::Connect
                | object_store::client::HttpErrorKind::Request
                | object_store::client::HttpErrorKind::Interrupted => FailureReason::Unreachable,
                _ => FailureReason::Other,
            };
        }
        current = err.source();
    }
    FailureReason::Other
}

pub(super) fn store_error(
    operation: &'static str,
    key: &str,
    source: object_store::Error,
) -> LakeError {
    LakeError::Store {
        operation,
        key: key.to_owned(),
        retryable: retryable(&source) && !is_refused_address(&source),
        failure: classify(&source),
    }
}

pub(super) fn parse_key(key: &str) -> Result<Path, LakeError> {
    Path::parse(key).map_err(|e| LakeError::InvalidKey {
        key: key.to_owned(),
        reason: e.to_string(),
    })
}
