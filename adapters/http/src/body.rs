//! Reading a request body under three bounds: its size (`max_body_bytes`, 413), a deadline from
//! the end of its headers (`body_timeout`, 408), and a node-wide budget of body bytes held in
//! memory at once (503 with `retry-after`). A body that declares its length reserves all of it
//! before a byte is read, so a client that declares much and sends little holds budget, not
//! memory beyond it, and only until its deadline.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::ApiError;

/// The node-wide budget of request-body bytes in memory, shared by every connection.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    /// One permit per byte.
    bytes: Arc<Semaphore>,
    /// The whole budget (for messages).
    total: usize,
}

impl BodyBudget {
    /// A budget of `total` bytes.
    #[must_use]
    pub fn new(total: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
            total,
        }
    }

    /// Bytes not held by a body right now.
    #[must_use]
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// Take `n` more bytes into `held`, at once or not at all (never waits: a node out of
    /// budget answers 503 rather than queueing bodies).
    fn take(&self, held: &mut Option<OwnedSemaphorePermit>, n: usize) -> Result<(), ApiError> {
        if n == 0 {
            return Ok(());
        }
        let refused = || {
            let mut e = ApiError::new(
                503,
                "busy",
                format!(
                    "the node holds its limit of request bodies in memory ({} bytes, QUEEN_BODY_BUDGET_BYTES); retry",
                    self.total
                ),
            );
            e.retry_after = Some(1);
            e
        };
        let n = u32::try_from(n).map_err(|_| refused())?;
        let permit = self
            .bytes
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| refused())?;
        match held {
            Some(h) => h.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }
}

/// A body read whole, with the budget it holds (released when this is dropped).
#[derive(Debug)]
pub(crate) struct HeldBody {
    /// The bytes.
    pub(crate) bytes: Bytes,
    /// The budget they hold.
    _permit: Option<OwnedSemaphorePermit>,
}

/// The bounds of one body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    /// Largest body (413 above).
    pub(crate) max_bytes: usize,
    /// How long the whole body may take to arrive (408 after).
    pub(crate) timeout: Duration,
}

/// Read `body` whole under `limits` and `budget`. `declared` is its `content-length`, if any.
pub(crate) async fn read<B>(
    body: B,
    declared: Option<usize>,
    limits: BodyLimits,
    budget: &BodyBudget,
) -> Result<HeldBody, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let too_large = || {
        ApiError::new(
            413,
            "payload_too_large",
            format!(
                "body must be at most {} bytes (QUEEN_MAX_BODY_BYTES)",
                limits.max_bytes
            ),
        )
    };
    if declared.is_some_and(|n| n > limits.max_bytes) {
        return Err(too_large());
    }
    let mut held = None;
    budget.take(&mut held, declared.unwrap_or(0))?;
    let reserved = declared.unwrap_or(0);
    let collect = async {
        let mut body = body;
        // Sized once from the declared length (already within the limit and the budget), so a
        // body arriving in many frames is not grown and copied step by step.
        let mut buf = BytesMut::with_capacity(reserved);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::new(400, "bad_body", format!("body could not be read: {e}"))
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let len = buf.len() + data.len();
            if len > limits.max_bytes {
                return Err(too_large());
            }
            // A body longer than it declared, or one without a declared length, takes budget
            // as it grows.
            if len > reserved {
                budget.take(&mut held, len - reserved.max(buf.len()))?;
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf.freeze())
    };
    match tokio::time::timeout(limits.timeout, collect).await {
        Ok(Ok(bytes)) => Ok(HeldBody {
            bytes,
            _permit: held,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::new(
            408,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms (QUEEN_BODY_TIMEOUT_MS)",
                limits.timeout.as_millis()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::body::Frame;

    fn limits(max: usize, ms: u64) -> BodyLimits {
        BodyLimits {
            max_bytes: max,
            timeout: Duration::from_millis(ms),
        }
    }

    #[tokio::test]
    async fn a_declared_body_holds_its_length_until_dropped() {
        let budget = BodyBudget::new(100);
        let b = read(
            Full::new(Bytes::from_static(b"0123456789")),
            Some(10),
            limits(50, 1000),
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(&b.bytes[..], b"0123456789");
        assert_eq!(budget.available(), 90);
        drop(b);
        assert_eq!(budget.available(), 100);
    }

    #[tokio::test]
    async fn over_budget_is_503_at_once_and_too_large_is_413() {
        let budget = BodyBudget::new(100);
        let first = read(
            Full::new(Bytes::from(vec![1u8; 60])),
            Some(60),
            limits(80, 1000),
            &budget,
        )
        .await
        .unwrap();
        let e = read(
            Full::new(Bytes::from(vec![1u8; 60])),
            Some(60),
            limits(80, 1000),
            &budget,
        )
        .await
        .unwrap_err();
        assert_eq!((e.status, e.code, e.retry_after), (503, "busy", Some(1)));
        let e = read(
            Full::new(Bytes::from(vec![1u8; 90])),
            Some(90),
            limits(80, 1000),
            &budget,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status, 413);
        // Undeclared lengths take budget as they grow.
        let e = read(
            Full::new(Bytes::from(vec![1u8; 60])),
            None,
            limits(80, 1000),
            &budget,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status, 503);
        drop(first);
        assert_eq!(
            budget.available(),
            100,
            "a refused body gives back what it took"
        );
        let b = read(
            Full::new(Bytes::from(vec![1u8; 60])),
            None,
            limits(80, 1000),
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(budget.available(), 40);
        drop(b);
    }

    /// Sends ten bytes, then nothing, forever (a client that stalls mid-body).
    struct Stalled(bool);

    impl hyper::body::Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.0 {
                std::task::Poll::Pending
            } else {
                self.0 = true;
                std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"0123456789")))))
            }
        }
    }

    #[tokio::test]
    async fn a_stalled_body_times_out_and_frees_its_budget() {
        let budget = BodyBudget::new(1000);
        let e = read(Stalled(false), Some(500), limits(1000, 100), &budget)
            .await
            .unwrap_err();
        assert_eq!((e.status, e.code), (408, "body_timeout"));
        assert_eq!(budget.available(), 1000);
    }
}
