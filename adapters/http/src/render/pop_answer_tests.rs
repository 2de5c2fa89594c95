use queen_domain::command::{Claim, ConflationEcho, Delivered};
use queen_domain::time::Stamp;

use super::*;

fn delivered(
    i: u64,
    txn: &str,
    payload: &[u8],
    trace: Option<&str>,
    producer: Option<&str>,
) -> Delivered {
    Delivered {
        offset: i,
        transaction_id: txn.to_owned(),
        id: [(i % 251) as u8; 16],
        trace_id: trace.map(str::to_owned),
        payload: payload.to_vec(),
        created: Stamp(1_700_000_000_123_456 + i),
        attempt: u32::try_from(i % 4).unwrap(),
        producer: producer.map(str::to_owned),
    }
}

/// The pop answer written by hand is byte for byte what `serde_json` writes from the answer's
/// structs: payloads of every odd shape, text that needs escapes in every field that is text,
/// several claims, no lease, queue mode, with and without the autopilot and conflation echoes.
#[test]
fn pop_answers_written_by_hand_keep_their_bytes() {
    let mut payloads: Vec<&[u8]> = crate::raw::ODD_PAYLOADS
        .iter()
        .map(|p| p.as_bytes())
        .collect();
    payloads.extend([
        &b"not json"[..],
        b"",
        b"null",
        b" {\"a\":1} ",
        b"\"\\u0000\"",
        &[0xff, 0xfe, b'x'][..],
    ]);
    let texts = ["t-1", "t\"2", "t\\3", "t\u{1}4", "t\u{7f}5", "tée6", "t\n7"];
    let messages = |from: u64| -> Vec<Delivered> {
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let t = texts[i % texts.len()];
                delivered(
                    from + i as u64,
                    t,
                    p,
                    (i % 2 == 0).then_some(t),
                    (i % 3 == 0).then_some(t),
                )
            })
            .collect()
    };
    let claims = vec![
        Claim {
            pid: 3,
            partition: "Default".into(),
            messages: messages(0),
        },
        Claim {
            pid: u64::MAX,
            partition: "p\"ä".into(),
            messages: messages(100),
        },
    ];
    let outcomes = [
        PopOutcome {
            lease_id: "l\"1".into(),
            lease_expires: Stamp(9_000_000),
            claims: claims.clone(),
            conflation: Default::default(),
        },
        PopOutcome {
            lease_id: String::new(),
            lease_expires: Stamp(9),
            claims,
            conflation: ConflationEcho {
                conflating: true,
                conflict: true,
            },
        },
        PopOutcome {
            lease_id: "l".into(),
            lease_expires: Stamp(9),
            claims: vec![],
            conflation: ConflationEcho {
                conflating: true,
                conflict: false,
            },
        },
    ];
    for out in &outcomes {
        for group in ["g", "g\\2", queen_domain::names::QUEUE_MODE_GROUP] {
            for queue in ["q", "q\u{2028}"] {
                for echo in [
                    None,
                    Some(queen_ports::AutopilotEcho {
                        partitions: 1,
                        batch: 200,
                        wait_ms: 0,
                    }),
                ] {
                    let by_hand = pop_json(queue, group, out, echo);
                    let by_serde = serde_json::to_vec(&pop(queue, group, out, echo)).unwrap();
                    assert_eq!(
                        String::from_utf8_lossy(&by_hand),
                        String::from_utf8_lossy(&by_serde),
                        "group {group:?}, queue {queue:?}, echo {echo:?}"
                    );
                }
            }
        }
    }
}
