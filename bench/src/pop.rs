//! One consumer step: pop from a queue, then ack everything the answer held with one
//! `ack/batch` to the same node. Shared by the pop + ack phases (`pop 100 + ack`) and the
//! partition-scale drain (`partitions`), which also needs the pop's own latency and the
//! broker's autopilot echo.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::Target;

/// What a pop answer holds that its ack needs, each as the JSON text it came as.
#[derive(serde::Deserialize)]
struct Popped<'a> {
    #[serde(borrow)]
    messages: Vec<PoppedMessage<'a>>,
    #[serde(rename = "leaseId", borrow)]
    lease_id: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    autopilot: Option<&'a serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
struct PoppedMessage<'a> {
    #[serde(rename = "transactionId", borrow)]
    transaction_id: &'a serde_json::value::RawValue,
    #[serde(rename = "partitionId", borrow)]
    partition_id: &'a serde_json::value::RawValue,
}

/// One pop answered with messages, and their ack.
pub(crate) struct PopAck {
    /// Messages popped and acked.
    pub messages: u64,
    /// The pop request's latency.
    pub pop: Duration,
    /// The ack request's latency.
    pub ack: Duration,
    /// The answer's `autopilot` echo as JSON text, if it had one.
    pub echo: Option<String>,
}

/// Pop up to 100 messages of queue `bench` (its default group) from node `i` of `t`, then ack
/// them all completed with one `ack/batch` to the same node: the messages acked, or `None` when
/// the pop found nothing.
pub(crate) async fn pop_ack_one(t: &Target, i: u64) -> Result<Option<u64>, String> {
    Ok(
        pop_ack(t, i, "/api/v1/pop/queue/bench?batch=100&wait=false")
            .await?
            .map(|p| p.messages),
    )
}

/// `GET path` (a pop) on node `i` of `t`, then one `ack/batch` of every message it answered
/// with, to the same node; `None` when the pop found nothing (204 or no messages).
pub(crate) async fn pop_ack(t: &Target, i: u64, path: &str) -> Result<Option<PopAck>, String> {
    let started = Instant::now();
    let (status, body) = t.call_at(i, "GET", path, None).await?;
    let pop = started.elapsed();
    if status == 204 {
        return Ok(None);
    }
    // Only the fields an ack names are read (the payloads are skipped, not built), and the
    // ack body is written straight out: the client shares the cores with the servers.
    let popped: Popped<'_> = serde_json::from_slice(&body).map_err(|e| {
        format!(
            "pop answered {status}: {e}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
    })?;
    let n = popped.messages.len() as u64;
    if n == 0 {
        return Ok(None);
    }
    let lease = popped.lease_id.map_or("null", |l| l.get());
    let mut ack = String::with_capacity(32 + popped.messages.len() * 160);
    ack.push_str("{\"acknowledgments\":[");
    for (k, m) in popped.messages.iter().enumerate() {
        if k > 0 {
            ack.push(',');
        }
        let _ = write!(
            ack,
            "{{\"transactionId\":{},\"partitionId\":{},\"leaseId\":{lease},\"status\":\"completed\"}}",
            m.transaction_id.get(),
            m.partition_id.get()
        );
    }
    ack.push_str("]}");
    let acked = Instant::now();
    match t.call_at(i, "POST", "/api/v1/ack/batch", Some(ack)).await? {
        (200, b) if contains(&b, b"\"success\":false") => Err(format!(
            "ack/batch refused some acknowledgments: {}",
            String::from_utf8_lossy(&b[..b.len().min(300)])
        )),
        (200, _) => Ok(Some(PopAck {
            messages: n,
            pop,
            ack: acked.elapsed(),
            echo: popped.autopilot.map(|a| a.get().to_owned()),
        })),
        (code, b) => Err(format!(
            "ack/batch answered {code}: {}",
            String::from_utf8_lossy(&b[..b.len().min(300)])
        )),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
