//! Where a sink's bucket is: the endpoint, the bucket and the region checked before any request
//! is made, with the lake's own rules (`queen_lake::check_endpoint`, `check_bucket`), and the
//! errors worded for the variable (or, through `tenant_settings`, the document's field) without
//! repeating a value, since an endpoint may carry a password. Whether the endpoint's addresses
//! are checked depends on who named it: the operator's `QUEEN_S3_ENDPOINT` is trusted, a
//! tenant's endpoint is public-only unless `QUEEN_S3_ALLOW_PRIVATE_ENDPOINTS=true`.

use queen_lake::AddressPolicy;

use super::{SinkConfigError, help};

fn refused(var: &str, problem: &queen_lake::EndpointError) -> SinkConfigError {
    SinkConfigError(format!("{var} {problem}. {}", help(var)))
}

/// An `http(s)://host[:port]` endpoint from `QUEEN_S3_ENDPOINT`, normalised; its addresses are
/// judged by `policy` (literal ones here, names at every connection).
pub(super) fn s3_endpoint(text: &str, policy: AddressPolicy) -> Result<String, SinkConfigError> {
    queen_lake::check_endpoint(text, policy).map_err(|e| refused("QUEEN_S3_ENDPOINT", &e))
}

/// A bucket name S3 accepts (`QUEEN_S3_BUCKET`).
pub(super) fn s3_bucket(name: &str) -> Result<(), SinkConfigError> {
    queen_lake::check_bucket(name).map_err(|e| refused("QUEEN_S3_BUCKET", &e))
}

/// A folder name inside the local lake folder (`QUEEN_S3_BUCKET` with `file://`): one path
/// segment, so the lake stays inside the folder the endpoint names.
pub(super) fn folder_bucket(name: &str) -> Result<(), SinkConfigError> {
    let bad = name == "."
        || name == ".."
        || name.contains(['/', '\\'])
        || name.chars().any(char::is_control);
    if bad {
        return Err(refused(
            "QUEEN_S3_BUCKET",
            &queen_lake::EndpointError("must be one folder name (no /, \\, . or ..)"),
        ));
    }
    Ok(())
}

/// A region: letters, digits, hyphens and underscores (it becomes part of AWS's host name when
/// no endpoint is set).
pub(super) fn s3_region(region: &str) -> Result<(), SinkConfigError> {
    let ok = (1..=64).contains(&region.len())
        && region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(refused(
            "QUEEN_S3_REGION",
            &queen_lake::EndpointError(
                "may hold only letters, digits, hyphens and underscores (at most 64)",
            ),
        ))
    }
}
