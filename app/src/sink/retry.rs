//! Sink KV writes that may be repeated safely (a lease given back, a presence row removed),
//! retried for a bounded time while they fail. Such a write mostly fails while raft leadership
//! moves (SIGTERM hands it over while the sink drains), and the answer "leadership changed"
//! clears within a second or so.

use std::fmt::Display;
use std::time::Duration;

use queen_domain::kv::{KvOp, KvOutcome};

use super::Shared;

/// Time between two tries.
const RETRY_EVERY: Duration = Duration::from_millis(300);

impl Shared {
    /// Run the KV write `ops` until it succeeds or `within` has passed; `None` when it gave up
    /// (one warning naming `what` then). Only for writes whose repetition does no harm.
    pub(super) async fn kv_write_retrying(
        &self,
        ops: &[KvOp],
        what: &str,
        within: Duration,
    ) -> Option<KvOutcome> {
        retry_for(what, within, RETRY_EVERY, || self.log.sink_kv(ops.to_vec())).await
    }
}

/// Call `call` until it answers `Ok`, `every` apart, for at most `within` (at least one try);
/// `None` with one warning when the time is up.
async fn retry_for<T, E: Display, F: Future<Output = Result<T, E>>>(
    what: &str,
    within: Duration,
    every: Duration,
    mut call: impl FnMut() -> F,
) -> Option<T> {
    let until = tokio::time::Instant::now() + within;
    for attempt in 1u32.. {
        match call().await {
            Ok(v) => return Some(v),
            Err(e) if tokio::time::Instant::now() + every >= until => {
                tracing::warn!(target: "queen-s3", attempt, error = %e, "{what} failed; giving up");
                return None;
            }
            Err(e) => {
                tracing::debug!(target: "queen-s3", attempt, error = %e, "{what} failed; retrying");
                tokio::time::sleep(every).await;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const EVERY: Duration = Duration::from_millis(10);

    #[tokio::test]
    async fn a_write_that_fails_a_few_times_is_retried_until_it_succeeds() {
        let calls = Cell::new(0);
        let got = retry_for("write", Duration::from_secs(5), EVERY, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n < 4 {
                    Err("leadership changed")
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(got, Some(4));
        assert_eq!(calls.get(), 4);
    }

    #[tokio::test]
    async fn a_write_that_keeps_failing_gives_up_when_the_time_is_up() {
        let calls = Cell::new(0u32);
        let started = std::time::Instant::now();
        let got: Option<()> = retry_for("write", Duration::from_millis(100), EVERY, || {
            calls.set(calls.get() + 1);
            async { Err("no leader") }
        })
        .await;
        assert_eq!(got, None);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "gave up after {took:?}");
        assert!(
            (2..=11).contains(&calls.get()),
            "{} tries in 100 ms, 10 ms apart",
            calls.get()
        );
    }

    #[tokio::test]
    async fn a_write_is_tried_once_even_with_no_time_left() {
        let calls = Cell::new(0u32);
        let got: Option<()> = retry_for("write", Duration::ZERO, EVERY, || {
            calls.set(calls.get() + 1);
            async { Err("no leader") }
        })
        .await;
        assert_eq!((got, calls.get()), (None, 1));
    }
}
