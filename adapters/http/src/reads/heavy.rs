//! Status reads that do bounded but real work (a page of partitions, a pending total over up to
//! `pages::WALK_BUDGET` partitions) run beside the write path, never on it: on a blocking thread,
//! at most a few at a time, so readers hammering them cannot take the runtime threads that
//! serve pushes. Also the paging parameters these routes share (`limit`, `after`) and the
//! header an array answer carries its continuation in.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::pages::MAX_PAGE;
use queen_ports::ClientApi;
use tokio::sync::Semaphore;

use super::{q_get, q_num};
use crate::api::ApiError;

/// The header an array answer (`GET /api/v1/consumer-groups`, `…/lagging`) names the cursor of
/// its next page in; absent on the last page.
pub(crate) const NEXT_CURSOR_HEADER: &str = "x-queen-next-cursor";

/// Heavy reads that may run at once on this node: half the cores (at least one), so the rest
/// stay with the write path.
fn permits() -> &'static Arc<Semaphore> {
    static PERMITS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    PERMITS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        Arc::new(Semaphore::new((cores / 2).max(1)))
    })
}

/// Run `work` on a blocking thread once a heavy-read permit is free; the caller awaits it
/// without holding a runtime thread.
pub(crate) async fn off_runtime<A, T>(
    api: &Arc<A>,
    work: impl FnOnce(&A) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError>
where
    A: ClientApi,
    T: Send + 'static,
{
    let permit = permits()
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::new(503, "unavailable", "the node is shutting down"))?;
    let api = api.clone();
    tokio::task::spawn_blocking(move || {
        let out = work(&api);
        drop(permit);
        out
    })
    .await
    .map_err(|_| ApiError::new(500, "internal", "a status read failed"))?
}

/// The `limit` of a page: `default` when absent, at least 1 and at most [`MAX_PAGE`].
pub(crate) fn page_limit(q: &[(String, String)], default: usize) -> Result<usize, ApiError> {
    let asked = q_num(q, "limit", default as u64)?;
    Ok(usize::try_from(asked)
        .unwrap_or(MAX_PAGE)
        .clamp(1, MAX_PAGE))
}

/// A partition-id cursor (`after`), as the previous page's `nextCursor` gave it.
pub(crate) fn after_pid(q: &[(String, String)]) -> Result<Option<u64>, ApiError> {
    q_get(q, "after")
        .map(|a| {
            a.parse::<u64>()
                .map_err(|_| ApiError::bad_request("after", "is not a cursor this broker issued"))
        })
        .transpose()
}

/// An opaque cursor of bytes (`after`), as the previous page gave it (lowercase hex).
pub(crate) fn after_bytes(q: &[(String, String)]) -> Result<Option<Vec<u8>>, ApiError> {
    q_get(q, "after").map(unhex).transpose()
}

/// Bytes as a cursor.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Result<Vec<u8>, ApiError> {
    let bad = || ApiError::bad_request("after", "is not a cursor this broker issued");
    if !text.len().is_multiple_of(2) || text.len() > 1024 {
        return Err(bad());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// The answer with its next page's cursor in [`NEXT_CURSOR_HEADER`] when there is one.
pub(crate) fn with_next(
    mut r: Response<Full<Bytes>>,
    next: Option<String>,
) -> Response<Full<Bytes>> {
    if let Some(v) = next.and_then(|n| hyper::header::HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert(NEXT_CURSOR_HEADER, v);
    }
    r
}
