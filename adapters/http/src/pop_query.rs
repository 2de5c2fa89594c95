//! Query strings of pops.

use std::time::Duration;

use queen_domain::autopilot::SetKnobs;
use queen_domain::command::{PopCommand, Subscription};
use queen_domain::ids::LeaseId;
use queen_domain::model::MAX_DURATION_MS;
use queen_domain::names::{GroupName, PartitionName, QueueName};
use queen_domain::time::Stamp;

use crate::api::ApiError;
use queen_ports::{AutopilotAsk, PopRequest};

/// Longest long poll we hold.
const MAX_WAIT_MS: u64 = 60_000;
/// Largest batch one pop may ask for.
const MAX_BATCH: u32 = 10_000;

/// Decode `a=b&c=d` with `+` as space.
pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let s = s.replace('+', " ");
    percent_encoding::percent_decode_str(&s)
        .decode_utf8_lossy()
        .into_owned()
}

/// The value of `key` in a decoded query.
pub(crate) fn get<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// A `true`/`false` (or `1`/`0`) query value; `None` when absent.
pub(crate) fn flag(q: &[(String, String)], key: &str) -> Result<Option<bool>, ApiError> {
    match get(q, key) {
        None => Ok(None),
        Some("true" | "1") => Ok(Some(true)),
        Some("false" | "0" | "") => Ok(Some(false)),
        Some(_) => Err(ApiError::bad_request(key, "must be true or false")),
    }
}

fn number(q: &[(String, String)], key: &str) -> Result<Option<u64>, ApiError> {
    get(q, key)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(key, "must be a non-negative integer"))
        })
        .transpose()
}

/// Whether a pop asks for the framed answer (QPF1): `frames=true`, and not a conflating pop,
/// which is always answered as JSON.
pub(crate) fn wants_frames(query: &str) -> Result<bool, ApiError> {
    let q = parse_query(query);
    Ok(flag(&q, "frames")?.unwrap_or(false) && flag(&q, "conflation")? != Some(true))
}

/// A pop request from its path parts and query. With `autopilot=true` it carries the knobs the
/// client set (the broker chooses the others, and `consumer` is left for the caller to name);
/// the knobs it left out hold their defaults until then.
pub(crate) fn pop_request(
    queue: &str,
    partition: Option<&str>,
    query: &str,
) -> Result<PopRequest, ApiError> {
    let q = parse_query(query);
    let queue =
        QueueName::new(queue).map_err(|e| ApiError::bad_request("queue", &e.to_string()))?;
    let partition = partition
        .map(|p| {
            PartitionName::new(p).map_err(|e| ApiError::bad_request("partition", &e.to_string()))
        })
        .transpose()?;
    let group = GroupName::or_queue_mode(get(&q, "consumerGroup"))
        .map_err(|e| ApiError::bad_request("consumerGroup", &e.to_string()))?;
    let autopilot = flag(&q, "autopilot")?.unwrap_or(false);
    let set_batch = match number(&q, "batch")? {
        Some(0) => return Err(ApiError::bad_request("batch", "must be at least 1")),
        Some(b) => Some(u32::try_from(b).unwrap_or(MAX_BATCH).min(MAX_BATCH)),
        None => None,
    };
    let set_partitions = match number(&q, "partitions")? {
        Some(0) => return Err(ApiError::bad_request("partitions", "must be at least 1")),
        Some(p) => Some(u32::try_from(p).unwrap_or(1024).min(1024)),
        None => None,
    };
    let set_wait = flag(&q, "wait")?;
    // A long poll is held at most MAX_WAIT_MS; beyond ten years the value is a mistake.
    let timeout = match number(&q, "timeout")? {
        Some(t) if t > MAX_DURATION_MS => {
            return Err(ApiError::bad_request(
                "timeout",
                &format!(
                    "must be 0 to {MAX_DURATION_MS} ms (ten years; a long poll is held at most {MAX_WAIT_MS} ms)"
                ),
            ));
        }
        t => Duration::from_millis(t.unwrap_or(30_000).min(MAX_WAIT_MS)),
    };
    let auto_ack = flag(&q, "autoAck")?.unwrap_or(false);
    let conflation = flag(&q, "conflation")?.unwrap_or(false);
    if auto_ack && conflation {
        return Err(ApiError::bad_request(
            "autoAck",
            "cannot be combined with conflation",
        ));
    }
    if conflation && group.is_queue_mode() {
        return Err(ApiError::bad_request(
            "consumerGroup",
            "is required with conflation (a policy of the queue's consumer group)",
        ));
    }
    let subscription = match (get(&q, "subscriptionFrom"), get(&q, "subscriptionMode")) {
        (Some("now"), _) => Subscription::New,
        (Some(t), _) if !t.is_empty() => Subscription::From(
            Stamp::parse_iso(t)
                .map_err(|e| ApiError::bad_request("subscriptionFrom", &e.to_string()))?,
        ),
        (_, Some("new")) => Subscription::New,
        (_, Some("all" | "")) | (_, None) => Subscription::Default,
        (_, Some(other)) => {
            return Err(ApiError::bad_request(
                "subscriptionMode",
                &format!("must be all or new, not '{other}'"),
            ));
        }
    };
    let command = PopCommand {
        queue,
        partition,
        group,
        batch: set_batch.unwrap_or(1),
        max_partitions: set_partitions.unwrap_or(1),
        // Minted again by the broker for every attempt.
        lease_id: LeaseId::minted(crate::fields::uuid_v7().to_string()),
        auto_ack,
        subscription,
    };
    Ok(PopRequest {
        command,
        wait: set_wait.unwrap_or(false),
        timeout,
        conflation,
        autopilot: autopilot.then(|| AutopilotAsk {
            set: SetKnobs {
                batch: set_batch,
                partitions: set_partitions,
                wait: set_wait,
            },
            consumer: String::new(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_default_client_query() {
        let r = pop_request(
            "orders",
            None,
            "autopilot=true&wait=true&timeout=30000&consumerGroup=g+w",
        )
        .unwrap();
        let set = r.autopilot.as_ref().map(|a| a.set);
        assert_eq!(
            set,
            Some(SetKnobs {
                batch: None,
                partitions: None,
                wait: Some(true)
            }),
            "the broker chooses batch and partitions"
        );
        assert!(r.wait);
        assert_eq!(r.command.group.as_str(), "g w");
        assert_eq!(r.timeout, Duration::from_secs(30));
        let r = pop_request("orders", Some("p 1"), "batch=5&wait=false").unwrap();
        assert_eq!((r.command.batch, r.wait), (5, false));
        assert!(r.autopilot.is_none());
        let r = pop_request("orders", None, "autopilot=true&partitions=3").unwrap();
        let set = r.autopilot.map(|a| a.set);
        assert_eq!(
            set,
            Some(SetKnobs {
                batch: None,
                partitions: Some(3),
                wait: None
            }),
            "a knob the client set travels as set"
        );
        assert!(
            pop_request("orders", None, "batch=x")
                .unwrap_err()
                .message
                .starts_with("batch")
        );
        assert!(pop_request("orders", None, "subscriptionFrom=2026-01-01T00%3A00%3A00Z").is_ok());
        let r = pop_request("orders", None, "timeout=315360000000").unwrap();
        assert_eq!(
            r.timeout,
            Duration::from_millis(MAX_WAIT_MS),
            "held at most a minute"
        );
        assert!(
            pop_request("orders", None, "timeout=315360000001")
                .unwrap_err()
                .message
                .starts_with("timeout must be 0 to 315360000000 ms")
        );
        assert!(pop_request("orders", None, "timeout=9223372036854775807").is_err());
    }

    #[test]
    fn conflation_needs_a_group_and_no_auto_ack() {
        let r = pop_request("q", None, "consumerGroup=g&conflation=true").unwrap();
        assert!(r.conflation);
        let r = pop_request("q", None, "consumerGroup=g&conflation=false").unwrap();
        assert!(!r.conflation);
        let refused = |query| pop_request("q", None, query).unwrap_err().message;
        assert!(refused("conflation=true").starts_with("consumerGroup is required"));
        assert!(refused("consumerGroup=g&conflation=true&autoAck=true").starts_with("autoAck"));
        assert!(refused("consumerGroup=g&conflation=yes").starts_with("conflation must be"));
    }

    #[test]
    fn frames_are_asked_for_by_the_query_but_never_for_a_conflating_pop() {
        assert!(wants_frames("batch=5&frames=true").unwrap());
        assert!(!wants_frames("batch=5").unwrap());
        assert!(!wants_frames("frames=true&conflation=true").unwrap());
        assert_eq!(
            wants_frames("frames=maybe").unwrap_err().message,
            "frames must be true or false"
        );
    }
}
