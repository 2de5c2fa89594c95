//! What `configure` accepts, the node's ceilings, and the bounds a queue works under.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// What a push does when it would take a queue over `maxBytes` or `maxLength`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    /// Refuse the push (429 with `retry-after`); nothing of it is kept.
    #[serde(rename = "reject")]
    Reject,
    /// Keep the push and drop the queue's oldest messages until it fits (a feed).
    #[serde(rename = "dropOldest")]
    DropOldest,
}

impl Policy {
    /// The wire spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Reject => "reject",
            Policy::DropOldest => "dropOldest",
        }
    }
}

/// How long a waiting pop may hold on once something is there, to fill its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// At most this many milliseconds after the first message was seen.
    pub ms: u64,
    /// Or until this many messages are there.
    pub count: u32,
}

/// A queue's options as configured: only what the client gave (stored in the replicated KV).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Declared {
    /// Bytes the queue may hold on one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Messages the queue may hold on one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    /// What a breached bound does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    /// Messages older than this are dropped (0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// How long a delivered message is leased before it is delivered again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<u64>,
    /// Redeliveries after the first delivery; then the message is dropped and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_limit: Option<u32>,
    /// The waiting pop's window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_buffer: Option<Window>,
}

/// The most messages a queue may be configured to hold on one node.
pub const MAX_LENGTH_CEILING: u64 = 10_000_000;
/// The longest `ttlSeconds` (a week).
pub const MAX_TTL_SECONDS: u64 = 7 * 24 * 3600;
/// The longest `leaseSeconds` (a day).
pub const MAX_LEASE_SECONDS: u64 = 86_400;
/// The highest `retryLimit`.
pub const MAX_RETRY_LIMIT: u32 = 1000;
/// The longest `windowBuffer.ms` (a waiting pop answers within its own timeout anyway).
pub const MAX_WINDOW_MS: u64 = 60_000;
/// The largest `windowBuffer.count`.
pub const MAX_WINDOW_COUNT: u32 = 10_000;

fn uint(m: &Map<String, Value>, key: &str, min: u64, max: u64) -> Result<Option<u64>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| (min..=max).contains(n))
            .map(Some)
            .ok_or_else(|| format!("must be a whole number from {min} to {max}")),
    }
}

impl Declared {
    /// Read the `options` object of a `configure` body. The list of keys is closed: an unknown
    /// one is refused, never dropped, since every option bounds something.
    ///
    /// # Errors
    /// `(field, problem)`, the field as the client wrote it (`options.maxBytes`).
    pub fn parse(options: Option<&Value>) -> Result<Self, (String, String)> {
        let m = match options {
            None | Some(Value::Null) => return Ok(Self::default()),
            Some(Value::Object(m)) => m,
            Some(_) => return Err(("options".into(), "must be an object".into())),
        };
        let field = |k: &str| format!("options.{k}");
        const KNOWN: [&str; 7] = [
            "maxBytes",
            "maxLength",
            "policy",
            "ttlSeconds",
            "leaseSeconds",
            "retryLimit",
            "windowBuffer",
        ];
        if let Some(k) = m.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err((
                field(k),
                format!(
                    "is not an option of an ephemeral queue (known: {})",
                    KNOWN.join(", ")
                ),
            ));
        }
        let policy = match m.get("policy") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "reject" => Some(Policy::Reject),
            Some(Value::String(s))
                if matches!(s.as_str(), "dropOldest" | "drop_oldest" | "drop-oldest") =>
            {
                Some(Policy::DropOldest)
            }
            Some(_) => {
                return Err((
                    field("policy"),
                    "must be \"reject\" or \"dropOldest\"".into(),
                ));
            }
        };
        let window_buffer = match m.get("windowBuffer") {
            None | Some(Value::Null) => None,
            Some(Value::Object(w)) => {
                if let Some(k) = w.keys().find(|k| !matches!(k.as_str(), "ms" | "count")) {
                    return Err((
                        format!("options.windowBuffer.{k}"),
                        "is not known (ms, count)".into(),
                    ));
                }
                let ms = uint(w, "ms", 0, MAX_WINDOW_MS)
                    .map_err(|e| ("options.windowBuffer.ms".to_owned(), e))?
                    .unwrap_or(0);
                let count = uint(w, "count", 1, u64::from(MAX_WINDOW_COUNT))
                    .map_err(|e| ("options.windowBuffer.count".to_owned(), e))?
                    .unwrap_or(u64::from(MAX_WINDOW_COUNT));
                Some(Window {
                    ms,
                    count: u32::try_from(count).unwrap_or(MAX_WINDOW_COUNT),
                })
            }
            Some(_) => {
                return Err((
                    field("windowBuffer"),
                    "must be an object {ms, count}".into(),
                ));
            }
        };
        let num = |k: &str, min: u64, max: u64| uint(m, k, min, max).map_err(|e| (field(k), e));
        Ok(Self {
            max_bytes: num("maxBytes", 1, u64::MAX)?,
            max_length: num("maxLength", 1, MAX_LENGTH_CEILING)?,
            policy,
            ttl_seconds: num("ttlSeconds", 0, MAX_TTL_SECONDS)?,
            lease_seconds: num("leaseSeconds", 1, MAX_LEASE_SECONDS)?,
            retry_limit: num("retryLimit", 0, u64::from(MAX_RETRY_LIMIT))?
                .map(|n| u32::try_from(n).unwrap_or(MAX_RETRY_LIMIT)),
            window_buffer,
        })
    }

    /// The bounds a queue configured so works under on a node with `limits`: each value given
    /// is clamped to the node's ceilings, each value left out is the node's default.
    #[must_use]
    pub fn effective(&self, limits: &Limits) -> Options {
        Options {
            max_bytes: self
                .max_bytes
                .unwrap_or(limits.queue_max_bytes)
                .clamp(1, limits.node_max_bytes.max(1)),
            max_length: self
                .max_length
                .unwrap_or(limits.queue_max_length)
                .clamp(1, MAX_LENGTH_CEILING),
            policy: self.policy.unwrap_or(Policy::Reject),
            ttl_ms: self.ttl_seconds.unwrap_or(0).min(MAX_TTL_SECONDS) * 1000,
            lease_ms: self
                .lease_seconds
                .map_or(limits.lease_ms, |s| s.clamp(1, MAX_LEASE_SECONDS) * 1000),
            retry_limit: self
                .retry_limit
                .unwrap_or(limits.retry_limit)
                .min(MAX_RETRY_LIMIT),
            window: self.window_buffer,
        }
    }
}

/// The node's ceilings and defaults (`QUEEN_EPHEMERAL_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes every ephemeral queue of the node may hold together, their messages and their
    /// structures (503 above).
    pub node_max_bytes: u64,
    /// A queue's `maxBytes` when it declares none.
    pub queue_max_bytes: u64,
    /// A queue's `maxLength` when it declares none.
    pub queue_max_length: u64,
    /// A queue's lease when it declares none, in milliseconds.
    pub lease_ms: u64,
    /// A queue's `retryLimit` when it declares none.
    pub retry_limit: u32,
    /// An implicit queue with nothing held, or a group that has not popped, is forgotten after
    /// this many milliseconds (0: never).
    pub idle_ms: u64,
    /// Queues the node holds at most (a push that would create one more is refused).
    pub max_queues: u64,
    /// Queues one tenant holds at most on the node.
    pub max_queues_per_tenant: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            node_max_bytes: 256 << 20,
            queue_max_bytes: 16 << 20,
            queue_max_length: 10_000,
            lease_ms: 30_000,
            retry_limit: 5,
            idle_ms: 300_000,
            max_queues: 10_000,
            max_queues_per_tenant: 2_500,
        }
    }
}

/// The bounds one queue works under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    /// Bytes held on this node.
    pub max_bytes: u64,
    /// Messages held on this node.
    pub max_length: u64,
    /// What a breached bound does.
    pub policy: Policy,
    /// Age at which a message is dropped, in milliseconds (0: never).
    pub ttl_ms: u64,
    /// Lease of a delivered message, in milliseconds.
    pub lease_ms: u64,
    /// Redeliveries after the first delivery.
    pub retry_limit: u32,
    /// The waiting pop's window.
    pub window: Option<Window>,
}

impl Options {
    /// As answers show them.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "maxBytes": self.max_bytes,
            "maxLength": self.max_length,
            "policy": self.policy.as_str(),
            "ttlSeconds": self.ttl_ms / 1000,
            "leaseSeconds": self.lease_ms / 1000,
            "retryLimit": self.retry_limit,
            "windowBuffer": self.window.map(|w| json!({"ms": w.ms, "count": w.count})),
        })
    }
}
