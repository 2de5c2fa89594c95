//! The framed pop answer QPF1 (`shared/spec/API.md` 4.6), sent for a pop with `frames=true`.
//!
//! It carries what the JSON answer carries, as the client rebuilds it: per claim its partition,
//! offset range and delivery attempt, then records of stored message frames (a record is a
//! run of consecutive offsets pushed at the same stamp; codec 0, since the store does not keep
//! the producer's compressed frames yet). The JSON object in front holds the answer's own keys
//! (`leaseExpiresAt`, `autopilot`).
//!
//! A pop whose messages a frame cannot carry faithfully is answered as JSON instead, as a
//! broker that does not know `frames` would: a traceId that is not a UUID in its canonical
//! text, a payload that is not one JSON document (or is empty), messages of one claim with
//! different delivery attempts (a claim carries one), a name or text over 65 535 bytes.

use queen_domain::command::{Claim, PopOutcome};
use serde_json::{Map, Value};

use crate::frame::{write_frame, write_str16};
use crate::render;

/// The content type of the answer (the client goes by its magic).
pub(crate) const CONTENT_TYPE: &str = "application/x-queen-pop";

/// The answer, or `None` when JSON must answer instead (see the module doc).
pub(crate) fn encode(
    queue: &str,
    group: &str,
    p: &PopOutcome,
    autopilot: Option<queen_ports::AutopilotEcho>,
) -> Option<Vec<u8>> {
    let mut own = Map::new();
    own.insert(
        "leaseExpiresAt".to_owned(),
        (!p.lease_id.is_empty())
            .then(|| p.lease_expires.iso_millis())
            .into(),
    );
    if let Some(a) = autopilot {
        own.insert("autopilot".to_owned(), render::autopilot_echo(a));
    }
    let own = serde_json::to_vec(&Value::Object(own)).ok()?;
    let mut out = Vec::with_capacity(
        64 + p
            .claims
            .iter()
            .flat_map(|c| &c.messages)
            .map(|m| 64 + m.transaction_id.len() + m.payload.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(b"QPF1");
    out.push(1);
    out.extend_from_slice(&u32::try_from(own.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&own);
    write_str16(&mut out, queue)?;
    write_str16(&mut out, &p.lease_id)?;
    write_str16(&mut out, render::group_on_wire(group))?;
    out.extend_from_slice(&u32::try_from(p.claims.len()).ok()?.to_le_bytes());
    for c in &p.claims {
        claim(&mut out, c)?;
    }
    Some(out)
}

fn claim(out: &mut Vec<u8>, c: &Claim) -> Option<()> {
    let attempt = c.messages.first().map_or(1, |m| m.attempt);
    if c.messages.iter().any(|m| m.attempt != attempt) {
        return None;
    }
    out.extend_from_slice(&c.pid.to_le_bytes());
    write_str16(out, &c.partition)?;
    let (start, end) = match (c.messages.first(), c.messages.last()) {
        (Some(f), Some(l)) => (f.offset, l.offset),
        // Nothing delivered: an empty range.
        _ => (1, 0),
    };
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&end.to_le_bytes());
    out.extend_from_slice(&attempt.to_le_bytes());
    let records_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut records = 0u32;
    let mut i = 0;
    while i < c.messages.len() {
        // A record: the longest run of consecutive offsets with one stamp.
        let first = &c.messages[i];
        let mut j = i + 1;
        while j < c.messages.len()
            && c.messages[j].offset == first.offset + (j - i) as u64
            && c.messages[j].created == first.created
        {
            j += 1;
        }
        out.extend_from_slice(&first.offset.to_le_bytes());
        out.extend_from_slice(&i64::try_from(first.created.0).ok()?.to_le_bytes());
        out.extend_from_slice(&u32::try_from(j - i).ok()?.to_le_bytes());
        out.push(0);
        let len_at = out.len();
        out.extend_from_slice(&0u32.to_le_bytes());
        for m in &c.messages[i..j] {
            let trace = match &m.trace_id {
                None => None,
                Some(t) => Some(canonical_uuid(t)?),
            };
            if m.payload.is_empty()
                || serde_json::from_slice::<serde::de::IgnoredAny>(&m.payload).is_err()
            {
                return None;
            }
            write_frame(
                out,
                &m.id,
                trace.as_ref(),
                &m.transaction_id,
                m.producer.as_deref(),
                &m.payload,
            )?;
        }
        let len = u32::try_from(out.len() - len_at - 4).ok()?;
        out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
        records += 1;
        i = j;
    }
    out[records_at..records_at + 4].copy_from_slice(&records.to_le_bytes());
    Some(())
}

/// The UUID's bytes when `text` is a UUID written as the client writes one back (lowercase,
/// hyphenated), so the trace id the consumer reads is the text the producer sent.
fn canonical_uuid(text: &str) -> Option<[u8; 16]> {
    let u = uuid::Uuid::try_parse(text).ok()?;
    (u.hyphenated().to_string() == text).then(|| *u.as_bytes())
}

#[cfg(test)]
mod tests {
    use queen_domain::command::Delivered;
    use queen_domain::time::Stamp;

    use super::*;
    use crate::frame::{Reader, read_frame};

    fn msg(offset: u64, created: u64, payload: &str) -> Delivered {
        Delivered {
            offset,
            transaction_id: format!("t{offset}"),
            id: [u8::try_from(offset).unwrap(); 16],
            trace_id: None,
            producer: None,
            payload: payload.as_bytes().to_vec(),
            created: Stamp(created),
            attempt: 1,
        }
    }

    /// One delivered message as the client rebuilds it: partitionId, offset, transactionId,
    /// payload, createdAt in µs.
    type Rebuilt = (u64, u64, String, Vec<u8>, i64);

    /// What the client rebuilds (queen/http/pop_frames.py): the own keys and the messages.
    fn decode(b: &[u8]) -> (Value, Vec<Rebuilt>) {
        let mut r = Reader::new(b);
        assert_eq!(r.take(4, "magic").unwrap(), b"QPF1");
        assert_eq!(r.u8("v").unwrap(), 1);
        let n = r.len32("own").unwrap();
        let own: Value = serde_json::from_slice(r.take(n, "own").unwrap()).unwrap();
        for _ in 0..3 {
            r.str16("header").unwrap();
        }
        let mut out = Vec::new();
        for _ in 0..r.u32("claims").unwrap() {
            let pid = u64::from_le_bytes(r.take(8, "pid").unwrap().try_into().unwrap());
            r.str16("partition").unwrap();
            let start = u64::from_le_bytes(r.take(8, "s").unwrap().try_into().unwrap());
            let end = u64::from_le_bytes(r.take(8, "e").unwrap().try_into().unwrap());
            r.u32("attempt").unwrap();
            for _ in 0..r.u32("records").unwrap() {
                let base = u64::from_le_bytes(r.take(8, "b").unwrap().try_into().unwrap());
                let created = i64::from_le_bytes(r.take(8, "c").unwrap().try_into().unwrap());
                let count = r.u32("count").unwrap();
                assert_eq!(r.u8("codec").unwrap(), 0);
                let len = r.len32("len").unwrap();
                let mut f = Reader::new(r.take(len, "bytes").unwrap());
                for i in 0..u64::from(count) {
                    let fr = read_frame(&mut f).unwrap();
                    if (start..=end).contains(&(base + i)) {
                        out.push((
                            pid,
                            base + i,
                            fr.transaction_id.to_owned(),
                            fr.payload.to_vec(),
                            created,
                        ));
                    }
                }
                assert_eq!(f.remaining(), 0);
            }
        }
        assert_eq!(r.remaining(), 0);
        (own, out)
    }

    #[test]
    fn a_pop_round_trips_as_records_of_frames() {
        let claims = vec![
            Claim {
                pid: 3,
                partition: "Default".into(),
                messages: vec![
                    msg(4, 10, "1"),
                    msg(5, 10, r#"{"a":"b"}"#),
                    msg(6, 11, "42.00"),
                    msg(9, 11, "null"),
                ],
            },
            Claim {
                pid: 8,
                partition: "p 2".into(),
                messages: vec![msg(0, 12, "[]")],
            },
        ];
        let p = PopOutcome {
            lease_id: "lease".into(),
            lease_expires: Stamp(9_000),
            claims,
            conflation: Default::default(),
        };
        let b = encode(
            "q",
            "g",
            &p,
            Some(queen_ports::AutopilotEcho {
                partitions: 1,
                batch: 200,
                wait_ms: 0,
            }),
        )
        .unwrap();
        let (own, got) = decode(&b);
        assert_eq!(own["leaseExpiresAt"], Stamp(9_000).iso_millis());
        assert_eq!(own["autopilot"]["batch"], 200);
        let want: Vec<_> = p
            .claims
            .iter()
            .flat_map(|c| {
                c.messages.iter().map(move |m| {
                    (
                        c.pid,
                        m.offset,
                        m.transaction_id.clone(),
                        m.payload.clone(),
                        i64::try_from(m.created.0).unwrap(),
                    )
                })
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn what_a_frame_cannot_carry_is_answered_as_json() {
        let one = |m: Delivered| PopOutcome {
            lease_id: "l".into(),
            lease_expires: Stamp(1),
            claims: vec![Claim {
                pid: 1,
                partition: "Default".into(),
                messages: vec![m],
            }],
            conflation: Default::default(),
        };
        let mut traced = msg(1, 1, "1");
        traced.trace_id = Some("0190b0a8-4d2e-7c3f-8a1b-2c3d4e5f6a7b".into());
        assert!(encode("q", "g", &one(traced.clone()), None).is_some());
        for t in [
            "trace-1",
            "0190B0A8-4D2E-7C3F-8A1B-2C3D4E5F6A7B",
            "0190b0a84d2e7c3f8a1b2c3d4e5f6a7b",
        ] {
            traced.trace_id = Some(t.into());
            assert!(
                encode("q", "g", &one(traced.clone()), None).is_none(),
                "{t}"
            );
        }
        assert!(encode("q", "g", &one(msg(1, 1, "not json")), None).is_none());
        assert!(encode("q", "g", &one(msg(1, 1, "")), None).is_none());
        let mut retried = msg(2, 1, "1");
        retried.attempt = 2;
        let mixed = PopOutcome {
            lease_id: "l".into(),
            lease_expires: Stamp(1),
            claims: vec![Claim {
                pid: 1,
                partition: "Default".into(),
                messages: vec![msg(1, 1, "1"), retried],
            }],
            conflation: Default::default(),
        };
        assert!(encode("q", "g", &mixed, None).is_none());
    }
}
