//! The HTTP client's timeouts, in a file of their own because two clients use them: the S3
//! client's options and the public-only connector that replaces its HTTP client.

use std::time::Duration;

/// How long one HTTP request may take, including sending an 8 MiB part on a slow link.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long to wait for a connection.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
