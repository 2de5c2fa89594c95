//! Plans and their limits: the four seeded plans, a cluster's overrides on top (a `null`
//! override means unlimited), and the token bucket the rate limits count with. Pure: the
//! caller passes the time.

use serde_json::{Map, Value};

use super::routes::Feature;

/// A plan's limits; `None` is unlimited.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Requests a second, and the burst.
    pub req_per_sec: Option<u64>,
    /// Burst of requests.
    pub req_burst: Option<u64>,
    /// Pushed messages a second.
    pub msgs_per_sec: Option<u64>,
    /// Burst of messages.
    pub msgs_burst: Option<u64>,
    /// Queues of the cluster.
    pub max_queues: Option<u64>,
    /// Partitions of one queue.
    pub max_partitions_per_queue: Option<u64>,
    /// Long polls waiting at once (per node).
    pub max_parked_pops: Option<u64>,
    /// One message's payload, bytes.
    pub max_payload_bytes: Option<u64>,
    /// Items of one push.
    pub max_batch_items: Option<u64>,
    /// Bytes the cluster may keep (not enforced yet: see `docs/tenants.md`).
    pub max_retained_bytes: Option<u64>,
    /// Longest retention a queue may be configured with, seconds.
    pub max_retention_seconds: Option<u64>,
    /// Messages pushed in a calendar month (UTC).
    pub monthly_msgs_quota: Option<u64>,
    /// The feature families the plan opens.
    pub features: Map<String, Value>,
}

const KIB: u64 = 1024;
const GIB: u64 = 1024 * 1024 * 1024;
const DAY: u64 = 86_400;

fn features(extra: bool) -> Map<String, Value> {
    let mut m = Map::new();
    for f in ["kv", "timers", "ephemeral"] {
        m.insert(f.to_owned(), Value::Bool(true));
    }
    if extra {
        for f in ["streams", "traces"] {
            m.insert(f.to_owned(), Value::Bool(true));
        }
    }
    m
}

/// A seeded plan by its code.
#[must_use]
pub fn seeded(code: &str) -> Option<Plan> {
    // (req/s, burst, msgs/s, burst, queues, partitions, parked, payload, batch, retained,
    //  retention, streams and traces)
    let row = match code {
        "free" => (
            5,
            25,
            20,
            100,
            20,
            8,
            50,
            256 * KIB,
            1000,
            GIB,
            7 * DAY,
            false,
        ),
        "dev" => (
            10,
            50,
            40,
            200,
            50,
            16,
            150,
            512 * KIB,
            2000,
            3 * GIB,
            14 * DAY,
            false,
        ),
        "pro" => (
            50,
            200,
            200,
            800,
            200,
            32,
            1000,
            1024 * KIB,
            5000,
            20 * GIB,
            30 * DAY,
            true,
        ),
        "dedicated-s" => (
            200,
            800,
            600,
            2000,
            1000,
            64,
            5000,
            4096 * KIB,
            10_000,
            200 * GIB,
            90 * DAY,
            true,
        ),
        _ => return None,
    };
    Some(Plan {
        req_per_sec: Some(row.0),
        req_burst: Some(row.1),
        msgs_per_sec: Some(row.2),
        msgs_burst: Some(row.3),
        max_queues: Some(row.4),
        max_partitions_per_queue: Some(row.5),
        max_parked_pops: Some(row.6),
        max_payload_bytes: Some(row.7),
        max_batch_items: Some(row.8),
        max_retained_bytes: Some(row.9),
        max_retention_seconds: Some(row.10),
        monthly_msgs_quota: None,
        features: features(row.11),
    })
}

/// A cluster's plan with its overrides applied (an unknown plan code has no limits).
#[must_use]
pub fn effective(code: &str, overrides: &Map<String, Value>) -> Plan {
    let mut p = seeded(code).unwrap_or_default();
    for (k, v) in overrides {
        let n = v.as_u64();
        let slot = match k.as_str() {
            "max_req_per_sec" => &mut p.req_per_sec,
            "req_burst" => &mut p.req_burst,
            "max_msgs_per_sec" => &mut p.msgs_per_sec,
            "msgs_burst" => &mut p.msgs_burst,
            "max_queues" => &mut p.max_queues,
            "max_partitions_per_queue" => &mut p.max_partitions_per_queue,
            "max_parked_pops" => &mut p.max_parked_pops,
            "max_payload_bytes" => &mut p.max_payload_bytes,
            "max_batch_items" => &mut p.max_batch_items,
            "max_retained_bytes" => &mut p.max_retained_bytes,
            "max_retention_seconds" => &mut p.max_retention_seconds,
            "monthly_msgs_quota" => &mut p.monthly_msgs_quota,
            "features" => {
                if let Value::Object(f) = v {
                    for (name, on) in f {
                        p.features.insert(name.clone(), on.clone());
                    }
                }
                continue;
            }
            _ => continue,
        };
        *slot = n;
    }
    p
}

impl Plan {
    /// Whether the plan opens a feature family (a missing key counts as closed).
    #[must_use]
    pub fn has(&self, f: Feature) -> bool {
        let name = match f {
            Feature::Kv => "kv",
            Feature::Timers => "timers",
            Feature::Ephemeral => "ephemeral",
            Feature::Streams => "streams",
            Feature::Traces => "traces",
        };
        self.features.get(name).and_then(Value::as_bool) == Some(true)
    }
}

/// A token bucket: `rate` tokens a second, at most `burst` held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    tokens: f64,
    /// When it was last filled, µs.
    at: u64,
}

impl Bucket {
    /// A full bucket at `now` (µs).
    #[must_use]
    pub fn full(burst: u64, now: u64) -> Self {
        Self {
            tokens: burst as f64,
            at: now,
        }
    }

    /// Take `n` tokens at `now` (µs); when there are too few, nothing is taken and the answer is
    /// the whole seconds until there would be enough (1 to 60).
    ///
    /// # Errors
    /// The seconds to wait.
    pub fn take(&mut self, n: u64, rate: u64, burst: u64, now: u64) -> Result<(), u32> {
        let elapsed = now.saturating_sub(self.at) as f64 / 1e6;
        self.at = now.max(self.at);
        self.tokens = (self.tokens + elapsed * rate as f64).min(burst as f64);
        let want = n as f64;
        if self.tokens >= want {
            self.tokens -= want;
            return Ok(());
        }
        if rate == 0 {
            return Err(60);
        }
        let wait = ((want.min(burst.max(1) as f64) - self.tokens) / rate as f64).ceil();
        Err((wait as u32).clamp(1, 60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_seeded_and_overrides_apply() {
        let dev = seeded("dev").expect("dev");
        assert_eq!(dev.req_per_sec, Some(10));
        assert_eq!(dev.max_payload_bytes, Some(512 * 1024));
        assert!(dev.has(Feature::Kv) && !dev.has(Feature::Streams));
        assert!(seeded("pro").expect("pro").has(Feature::Traces));
        let mut o = Map::new();
        o.insert("max_req_per_sec".into(), Value::Null);
        o.insert("max_batch_items".into(), Value::from(3));
        o.insert(
            "features".into(),
            serde_json::json!({"streams": true, "kv": false}),
        );
        let p = effective("dev", &o);
        assert_eq!(p.req_per_sec, None, "null is unlimited");
        assert_eq!(p.max_batch_items, Some(3));
        assert!(p.has(Feature::Streams) && !p.has(Feature::Kv));
        assert_eq!(effective("nope", &Map::new()), Plan::default());
    }

    #[test]
    fn a_bucket_refills_at_its_rate_and_caps_at_its_burst() {
        let mut b = Bucket::full(5, 0);
        for _ in 0..5 {
            assert_eq!(b.take(1, 2, 5, 0), Ok(()));
        }
        assert_eq!(b.take(1, 2, 5, 0), Err(1));
        // Half a second at 2/s: one token.
        assert_eq!(b.take(1, 2, 5, 500_000), Ok(()));
        assert_eq!(b.take(1, 2, 5, 500_000), Err(1));
        // A long pause refills to the burst only.
        assert_eq!(b.take(5, 2, 5, 100_000_000), Ok(()));
        assert_eq!(b.take(1, 2, 5, 100_000_000), Err(1));
        // Asking more than the burst waits for the burst.
        assert_eq!(Bucket::full(0, 0).take(100, 10, 20, 0), Err(2));
    }
}
