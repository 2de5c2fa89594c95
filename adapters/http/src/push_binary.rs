//! The binary request bodies of `POST /api/v1/push` (QPB1) and `POST /api/v1/transaction`
//! (QTB1), `Content-Type: application/x-queen-push` (`shared/spec/API.md` 4.6), read into the
//! same push items and transaction requests as the JSON bodies.
//!
//! The whole body is checked before anything is proposed, so a body that is not valid stores
//! nothing; the refusal is a 400 `bad_binary_body` naming the group and frame at fault. zstd is
//! decompressed into buffers sized from what the body declares (`raw_len`, each frame's
//! recorded content size), and all decompressed bytes of one body together may not exceed the
//! body limit (413 `payload_too_large`), so a small body cannot grow into a large allocation.
//!
//! A frame's message id (the client's UUIDv7) becomes the stored message's id. Frames with the
//! producer flag (2) or the encrypted flag (4) are refused: the producer is stamped by a broker
//! from a JWT, which this broker does not check yet, and it holds no encryption key.

use queen_domain::command::{PushItem, TxnOp};
use queen_domain::ids::TransactionId;
use queen_domain::names::{PartitionName, QueueName};

use crate::api::ApiError;
use crate::frame::{self, FLAG_ENCRYPTED, FLAG_PRODUCER, Inflate, Reader};
use crate::json::{self, MAX_PUSH_ITEMS, MAX_TXN_BYTES, MAX_TXN_OPS, TxnRequest};

/// The content type that selects these bodies.
pub(crate) const CONTENT_TYPE: &str = "application/x-queen-push";

/// QPB1: the rest is one zstd frame of `raw_len` bytes.
const FLAG_ZSTD: u8 = 1;
/// QPB1 and QTB1: answer counts instead of one result per pushed message.
const FLAG_COUNTS: u8 = 2;
/// QPB1: every item carries a transactionId.
const FLAG_TXN: u8 = 4;
/// QPB1: groups carry compressed stored frames.
const FLAG_FRAMES: u8 = 8;

/// A QPB1 body, read.
#[derive(Debug)]
pub(crate) struct BinaryPush {
    /// The items, in wire order.
    pub(crate) items: Vec<PushItem>,
    /// Answer `{"count", "queued", "duplicate", "error"}` instead of one object per item.
    pub(crate) counts: bool,
}

/// A QTB1 body, read.
#[derive(Debug)]
pub(crate) struct BinaryTransaction {
    /// The head's operations, then one push per message of the groups, and the riders.
    pub(crate) request: TxnRequest,
    /// Count the pushes and acks in the answer instead of listing them.
    pub(crate) counts: bool,
}

fn bad(message: String) -> ApiError {
    ApiError::new(400, "bad_binary_body", message)
}

fn inflate_error(at: &str, e: Inflate) -> ApiError {
    match e {
        Inflate::TooLarge(m) => ApiError::new(413, "payload_too_large", format!("{at}: {m}")),
        Inflate::Bad(m) => bad(format!("{at}: {m}")),
    }
}

/// Whether a `content-type` header value names the binary bodies (parameters and case aside).
pub(crate) fn is_binary(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(CONTENT_TYPE))
}

fn magic(r: &mut Reader<'_>, want: &[u8; 4], route: &str) -> Result<(), ApiError> {
    match r.take(4, "the magic") {
        Ok(m) if m == want => Ok(()),
        _ => Err(bad(format!(
            "the body does not start with {} ({CONTENT_TYPE} on {route} takes a {} body)",
            String::from_utf8_lossy(want),
            String::from_utf8_lossy(want)
        ))),
    }
}

/// Read a QPB1 body; `max_decoded` bounds every byte decompressed out of it.
pub(crate) fn push(body: &[u8], max_decoded: usize) -> Result<BinaryPush, ApiError> {
    let mut r = Reader::new(body);
    magic(&mut r, b"QPB1", "/api/v1/push")?;
    let flags = r.u8("flags").map_err(|m| bad(format!("QPB1 {m}")))?;
    if flags & !(FLAG_ZSTD | FLAG_COUNTS | FLAG_TXN | FLAG_FRAMES) != 0 {
        return Err(bad(format!(
            "QPB1 flags {flags} has unknown bits (known: 1 zstd, 2 counts, 4 txn, 8 frames)"
        )));
    }
    if flags & FLAG_TXN != 0 && flags & FLAG_FRAMES != 0 {
        return Err(bad("QPB1 flags 4 (txn) and 8 (frames) cannot be combined: a frame carries its own transactionId".to_owned()));
    }
    let mut allowed = max_decoded;
    let inflated;
    let groups_bytes = if flags & FLAG_ZSTD != 0 {
        let raw_len = r.len32("raw_len").map_err(|m| bad(format!("QPB1 {m}")))?;
        inflated = frame::inflate(r.rest(), Some(raw_len), allowed)
            .map_err(|e| inflate_error("QPB1 body (flag 1, zstd)", e))?;
        allowed -= inflated.len();
        &inflated[..]
    } else {
        r.rest()
    };
    let layout = if flags & FLAG_FRAMES != 0 {
        Layout::Frames
    } else {
        Layout::Items {
            with_txn: flags & FLAG_TXN != 0,
        }
    };
    let items = groups(
        &mut Reader::new(groups_bytes),
        layout,
        &mut allowed,
        MAX_PUSH_ITEMS,
        "QPB1",
    )?;
    Ok(BinaryPush {
        items,
        counts: flags & FLAG_COUNTS != 0,
    })
}

/// Read a QTB1 body; `max_decoded` bounds every byte decompressed out of it.
pub(crate) fn transaction(body: &[u8], max_decoded: usize) -> Result<BinaryTransaction, ApiError> {
    let mut r = Reader::new(body);
    magic(&mut r, b"QTB1", "/api/v1/transaction")?;
    let flags = r.u8("flags").map_err(|m| bad(format!("QTB1 {m}")))?;
    if flags & !FLAG_COUNTS != 0 {
        return Err(bad(format!(
            "QTB1 flags {flags} has unknown bits (known: 2 counts)"
        )));
    }
    let head_len = r.len32("head_len").map_err(|m| bad(format!("QTB1 {m}")))?;
    let head = r
        .take(head_len, "the head (head_len)")
        .map_err(|m| bad(format!("QTB1 {m}")))?;
    let (mut ops, leases, kv, timers) = json::transaction_head(head).map_err(|mut e| {
        e.message = format!("QTB1 head: {}", e.message);
        e
    })?;
    let mut allowed = max_decoded;
    let pushed = groups(
        &mut r,
        Layout::Frames,
        &mut allowed,
        MAX_TXN_OPS.saturating_sub(ops.len()),
        "QTB1",
    )?;
    ops.extend(pushed.into_iter().map(TxnOp::Push));
    if ops.is_empty() {
        return Err(bad(
            "QTB1 body holds no operation (no head operation and no pushed message)".to_owned(),
        ));
    }
    Ok(BinaryTransaction {
        request: (ops, leases, kv, timers),
        counts: flags & FLAG_COUNTS != 0,
    })
}

/// How a group carries its messages.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// `n × ([str16 transactionId] | u32 len | payload)`.
    Items {
        /// Whether each item starts with its transactionId.
        with_txn: bool,
    },
    /// `u32 z_len | z`: one zstd frame of `n` stored frames.
    Frames,
}

/// `u32 groups | groups`, up to the end of `r`. At most `max_items` messages in all; `allowed`
/// is what may still be decompressed and shrinks as groups are.
fn groups(
    r: &mut Reader<'_>,
    layout: Layout,
    allowed: &mut usize,
    max_items: usize,
    kind: &str,
) -> Result<Vec<PushItem>, ApiError> {
    let count = r
        .u32("the group count")
        .map_err(|m| bad(format!("{kind} {m}")))?;
    let mut items = Vec::new();
    for g in 0..count {
        let short = |m: String| bad(format!("{kind} group {g}: {m}"));
        let queue = r.str16("the queue name").map_err(short)?;
        let partition = r.str16("the partition name").map_err(short)?;
        let queue =
            QueueName::new(queue).map_err(|e| bad(format!("{kind} group {g}: queue {e}")))?;
        let partition = PartitionName::new(partition)
            .map_err(|e| bad(format!("{kind} group {g}: partition {e}")))?;
        let at = format!(
            "{kind} group {g} ({}/{})",
            queue.as_str(),
            partition.as_str()
        );
        let n = r
            .len32("the message count")
            .map_err(|m| bad(format!("{at}: {m}")))?;
        if n > max_items - items.len() {
            return Err(bad(format!(
                "{at}: its {n} messages take the body past {max_items} messages"
            )));
        }
        match layout {
            Layout::Items { with_txn } => {
                for i in 0..n {
                    let short = |m: String| bad(format!("{at} message {i}: {m}"));
                    let txn = if with_txn {
                        r.str16("its transactionId").map_err(short)?
                    } else {
                        ""
                    };
                    let len = r.len32("its payload length").map_err(short)?;
                    let payload = r.take(len, "its payload").map_err(short)?;
                    items.push(item(&queue, &partition, txn, None, None, payload, &|| {
                        format!("{at} message {i}")
                    })?);
                }
            }
            Layout::Frames => {
                let z_len = r.len32("z_len").map_err(|m| bad(format!("{at}: {m}")))?;
                let z = r
                    .take(z_len, "its zstd frame (z_len)")
                    .map_err(|m| bad(format!("{at}: {m}")))?;
                let raw = frame::inflate(z, None, *allowed).map_err(|e| inflate_error(&at, e))?;
                *allowed -= raw.len();
                let mut f = Reader::new(&raw);
                for i in 0..n {
                    let fr = frame::read_frame(&mut f)
                        .map_err(|m| bad(format!("{at} frame {i}: {m}")))?;
                    // Built only for a refusal: this runs once per message.
                    let at_frame = || format!("{at} frame {i}");
                    if fr.flags & FLAG_PRODUCER != 0 {
                        return Err(bad(format!(
                            "{}: flag 2 (producer) is set; a producer is stamped by the broker, never sent by a client",
                            at_frame()
                        )));
                    }
                    if fr.flags & FLAG_ENCRYPTED != 0 {
                        return Err(bad(format!(
                            "{}: flag 4 (encrypted) is set; this broker holds no encryption key",
                            at_frame()
                        )));
                    }
                    if fr.message_id == [0; 16] {
                        return Err(bad(format!(
                            "{}: the message id is the nil UUID",
                            at_frame()
                        )));
                    }
                    items.push(item(
                        &queue,
                        &partition,
                        fr.transaction_id,
                        Some(fr.message_id),
                        fr.trace_id,
                        fr.payload,
                        &at_frame,
                    )?);
                }
                if f.remaining() > 0 {
                    return Err(bad(format!(
                        "{at}: its zstd frame holds {} bytes after its {n} frames",
                        f.remaining()
                    )));
                }
            }
        }
    }
    if r.remaining() > 0 {
        return Err(bad(format!(
            "{kind} body holds {} bytes after its {count} groups",
            r.remaining()
        )));
    }
    Ok(items)
}

/// One message as a push item. No id: one is minted; an empty transactionId is the id's text
/// (as the JSON body does for a missing one); an empty payload is `null`.
fn item(
    queue: &QueueName,
    partition: &PartitionName,
    transaction_id: &str,
    message_id: Option<[u8; 16]>,
    trace_id: Option<[u8; 16]>,
    payload: &[u8],
    at: &dyn Fn() -> String,
) -> Result<PushItem, ApiError> {
    if transaction_id.len() > MAX_TXN_BYTES {
        return Err(bad(format!(
            "{}: the transactionId must be at most {MAX_TXN_BYTES} bytes",
            at()
        )));
    }
    let id = message_id.unwrap_or_else(|| *json::uuid_v7().as_bytes());
    let payload = if payload.is_empty() {
        b"null".to_vec()
    } else {
        serde_json::from_slice::<serde::de::IgnoredAny>(payload).map_err(|e| {
            bad(format!(
                "{}: the payload is not one JSON document ({e})",
                at()
            ))
        })?;
        payload.to_vec()
    };
    Ok(PushItem {
        queue: queue.clone(),
        partition: partition.clone(),
        transaction_id: if transaction_id.is_empty() {
            TransactionId::minted(uuid::Uuid::from_bytes(id).to_string())
        } else {
            TransactionId::new(transaction_id)
                .map_err(|e| bad(format!("{}: the transactionId {e}", at())))?
        },
        message_id: id,
        payload,
        trace_id: trace_id.map(|t| uuid::Uuid::from_bytes(t).to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::write_frame;

    const LIMIT: usize = 1 << 20;

    fn str16(out: &mut Vec<u8>, s: &str) {
        frame::write_str16(out, s).unwrap();
    }

    /// A group of the FRAMES layout holding `frames` (already framed), compressed.
    fn frames_group(out: &mut Vec<u8>, queue: &str, partition: &str, n: u32, frames: &[u8]) {
        str16(out, queue);
        str16(out, partition);
        out.extend_from_slice(&n.to_le_bytes());
        let z = zstd::bulk::compress(frames, 1).unwrap();
        out.extend_from_slice(&u32::try_from(z.len()).unwrap().to_le_bytes());
        out.extend_from_slice(&z);
    }

    fn frames(list: &[(&[u8; 16], &str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (id, txn, payload) in list {
            write_frame(&mut out, id, None, txn, payload.as_bytes()).unwrap();
        }
        out
    }

    /// A group of the txn layout: queue, partition, (transactionId, payload) per item.
    type TxnGroup<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    /// The body the 2.6.0 client sends with `binary_push` alone (flags 4).
    fn txn_body(groups: &[TxnGroup<'_>]) -> Vec<u8> {
        let mut b = b"QPB1".to_vec();
        b.push(FLAG_TXN);
        b.extend_from_slice(&u32::try_from(groups.len()).unwrap().to_le_bytes());
        for (q, p, items) in groups {
            str16(&mut b, q);
            str16(&mut b, p);
            b.extend_from_slice(&u32::try_from(items.len()).unwrap().to_le_bytes());
            for (txn, payload) in *items {
                str16(&mut b, txn);
                b.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
                b.extend_from_slice(payload.as_bytes());
            }
        }
        b
    }

    fn frames_body(flags: u8, groups: &[(&str, &str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"QPB1".to_vec();
        b.push(flags);
        b.extend_from_slice(&u32::try_from(groups.len()).unwrap().to_le_bytes());
        for (q, p, n, f) in groups {
            frames_group(&mut b, q, p, *n, f);
        }
        b
    }

    fn err(body: &[u8]) -> ApiError {
        push(body, LIMIT).unwrap_err()
    }

    #[test]
    fn txn_items_read_in_wire_order_and_mint_what_is_missing() {
        let body = txn_body(&[
            ("q", "Default", &[("t1", r#"{"a":1}"#), ("", "42.00")]),
            ("r", "p 1", &[("t3", "")]),
        ]);
        let p = push(&body, LIMIT).unwrap();
        assert!(!p.counts);
        let got: Vec<_> = p
            .items
            .iter()
            .map(|i| {
                (
                    i.queue.as_str(),
                    i.partition.as_str(),
                    std::str::from_utf8(&i.payload).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("q", "Default", r#"{"a":1}"#),
                ("q", "Default", "42.00"),
                ("r", "p 1", "null")
            ]
        );
        assert_eq!(p.items[0].transaction_id, "t1");
        assert_eq!(
            p.items[1].transaction_id,
            uuid::Uuid::from_bytes(p.items[1].message_id)
                .to_string()
                .as_str(),
            "an empty transactionId is the minted id's text"
        );
        assert!(p.items.iter().all(|i| i.trace_id.is_none()));
    }

    #[test]
    fn frames_keep_the_clients_ids_and_zstd_bodies_decompress() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let body = frames_body(
            FLAG_FRAMES | FLAG_COUNTS,
            &[(
                "q",
                "Default",
                2,
                frames(&[(&a, "ta", "1"), (&b, "tb", r#""x""#)]),
            )],
        );
        let p = push(&body, LIMIT).unwrap();
        assert!(p.counts);
        assert_eq!((p.items[0].message_id, p.items[1].message_id), (a, b));
        assert_eq!(
            (
                p.items[0].transaction_id.as_str(),
                p.items[1].payload.as_slice()
            ),
            ("ta", &br#""x""#[..])
        );
        // A trace id in a frame travels as its UUID text.
        let mut traced = Vec::new();
        write_frame(&mut traced, &a, Some(&[0xab; 16]), "t", b"1").unwrap();
        let p = push(&frames_body(FLAG_FRAMES, &[("q", "p", 1, traced)]), LIMIT).unwrap();
        assert_eq!(
            p.items[0].trace_id.as_deref(),
            Some("abababab-abab-abab-abab-abababababab")
        );
        // The whole body compressed (flag 1) around the txn layout.
        let plain = txn_body(&[("q", "Default", &[("t1", "true")])]);
        let rest = &plain[5..];
        let mut z = b"QPB1".to_vec();
        z.push(FLAG_TXN | FLAG_ZSTD);
        z.extend_from_slice(&u32::try_from(rest.len()).unwrap().to_le_bytes());
        z.extend_from_slice(&zstd::bulk::compress(rest, 3).unwrap());
        let p = push(&z, LIMIT).unwrap();
        assert_eq!(
            (
                p.items[0].transaction_id.as_str(),
                p.items[0].payload.as_slice()
            ),
            ("t1", &b"true"[..])
        );
    }

    #[test]
    fn every_malformed_push_body_is_a_named_400() {
        let id = [5u8; 16];
        let good = frames(&[(&id, "t", "1")]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                b"{\"items\":[]}".to_vec(),
                "the body does not start with QPB1",
            ),
            (b"QPB1".to_vec(), "QPB1 ends inside flags"),
            (
                b"QPB1\x40\0\0\0\0".to_vec(),
                "QPB1 flags 64 has unknown bits",
            ),
            (
                b"QPB1\x0c\0\0\0\0".to_vec(),
                "QPB1 flags 4 (txn) and 8 (frames) cannot be combined",
            ),
            (
                b"QPB1\x04\x01\0".to_vec(),
                "QPB1 ends inside the group count",
            ),
            (
                b"QPB1\x04\x01\0\0\0\x05\0ab".to_vec(),
                "QPB1 group 0: ends inside the queue name",
            ),
            (
                b"QPB1\x04\x01\0\0\0\x01\0/\x01\0p\0\0\0\0".to_vec(),
                "QPB1 group 0: queue must not contain",
            ),
            (
                b"QPB1\x04\x01\0\0\0\x01\0q\0\0\0\0\0\0".to_vec(),
                "QPB1 group 0: partition must not be empty",
            ),
            (
                txn_body(&[("q", "p", &[("t", "{")])]),
                "QPB1 group 0 (q/p) message 0: the payload is not one JSON document",
            ),
            (
                txn_body(&[("q", "p", &[(&"x".repeat(513), "1")])]),
                "QPB1 group 0 (q/p) message 0: the transactionId must be at most 512 bytes",
            ),
            (
                {
                    let mut b = txn_body(&[("q", "p", &[("t", "1")])]);
                    b.push(0);
                    b
                },
                "QPB1 body holds 1 bytes after its 1 groups",
            ),
            (
                {
                    let mut b = txn_body(&[("q", "p", &[("t", "12")])]);
                    b.pop();
                    b
                },
                "QPB1 group 0 (q/p) message 0: ends inside its payload",
            ),
            (
                frames_body(FLAG_FRAMES, &[("q", "p", 2, good.clone())]),
                "QPB1 group 0 (q/p) frame 1: ends inside body_len",
            ),
            (
                frames_body(FLAG_FRAMES, &[("q", "p", 0, good.clone())]),
                "QPB1 group 0 (q/p): its zstd frame holds",
            ),
            (
                {
                    let mut f = good.clone();
                    f[4] = FLAG_PRODUCER;
                    f.splice(24..24, [0, 0]);
                    f[0] += 2;
                    frames_body(FLAG_FRAMES, &[("q", "p", 1, f)])
                },
                "QPB1 group 0 (q/p) frame 0: flag 2 (producer)",
            ),
            (
                {
                    let mut f = good.clone();
                    f[4] = FLAG_ENCRYPTED;
                    frames_body(FLAG_FRAMES, &[("q", "p", 1, f)])
                },
                "QPB1 group 0 (q/p) frame 0: flag 4 (encrypted)",
            ),
            (
                frames_body(
                    FLAG_FRAMES,
                    &[("q", "p", 1, frames(&[(&[0; 16], "t", "1")]))],
                ),
                "QPB1 group 0 (q/p) frame 0: the message id is the nil UUID",
            ),
            (
                frames_body(FLAG_FRAMES, &[("q", "p", 1, frames(&[(&id, "t", "nope")]))]),
                "QPB1 group 0 (q/p) frame 0: the payload is not one JSON document",
            ),
            (
                frames_body(FLAG_FRAMES, &[("q", "p", 10_001, good.clone())]),
                "QPB1 group 0 (q/p): its 10001 messages take the body past 10000 messages",
            ),
            (
                b"QPB1\x08\x01\0\0\0\x01\0q\x01\0p\x01\0\0\0\x04\0\0\0abcd".to_vec(),
                "QPB1 group 0 (q/p): is not a zstd frame",
            ),
            (
                b"QPB1\x08\x01\0\0\0\x01\0q\x01\0p\x01\0\0\0\x09\0\0\0abcd".to_vec(),
                "QPB1 group 0 (q/p): ends inside its zstd frame (z_len)",
            ),
            (
                b"QPB1\x05\x10\0\0\0garbage".to_vec(),
                "QPB1 body (flag 1, zstd): is not a zstd frame",
            ),
        ];
        for (body, want) in cases {
            let e = err(&body);
            assert_eq!(
                (e.status, e.code),
                (400, "bad_binary_body"),
                "{want}: {}",
                e.message
            );
            assert!(
                e.message.starts_with(want),
                "want {want:?}, got {:?}",
                e.message
            );
        }
    }

    #[test]
    fn a_zip_bomb_is_a_413_before_it_is_decompressed() {
        // 64 MiB of one byte compresses to a few KiB; the limit here is 1 MiB.
        let bomb = vec![b' '; 64 << 20];
        let mut f = Vec::new();
        write_frame(&mut f, &[1; 16], None, "t", &bomb).unwrap();
        let e = err(&frames_body(FLAG_FRAMES, &[("q", "p", 1, f)]));
        assert_eq!(
            (e.status, e.code),
            (413, "payload_too_large"),
            "{}",
            e.message
        );
        assert!(
            e.message
                .starts_with("QPB1 group 0 (q/p): would decompress to"),
            "{}",
            e.message
        );
        // A raw_len above the limit is refused as declared.
        let mut b = b"QPB1\x05".to_vec();
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        b.extend_from_slice(&zstd::bulk::compress(b"\0\0\0\0", 1).unwrap());
        assert_eq!(
            err(&b).status,
            400,
            "the frame's recorded size contradicts raw_len"
        );
        let mut b = b"QPB1\x05".to_vec();
        b.extend_from_slice(&(64u32 << 20).to_le_bytes());
        b.extend_from_slice(&zstd::bulk::compress(&bomb, 1).unwrap());
        assert_eq!(err(&b).status, 413);
        // Many groups share the one allowance.
        let small = format!("\"{}\"", "x".repeat(600 << 10)).into_bytes();
        let mut f = Vec::new();
        write_frame(&mut f, &[1; 16], None, "t", &small).unwrap();
        let e = err(&frames_body(
            FLAG_FRAMES,
            &[("q", "p", 1, f.clone()), ("q", "p", 1, f)],
        ));
        assert!(
            e.message
                .starts_with("QPB1 group 1 (q/p): would decompress"),
            "{}",
            e.message
        );
    }

    fn qtb1(flags: u8, head: &str, groups: &[(&str, &str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"QTB1".to_vec();
        b.push(flags);
        b.extend_from_slice(&u32::try_from(head.len()).unwrap().to_le_bytes());
        b.extend_from_slice(head.as_bytes());
        b.extend_from_slice(&u32::try_from(groups.len()).unwrap().to_le_bytes());
        for (q, p, n, f) in groups {
            frames_group(&mut b, q, p, *n, f);
        }
        b
    }

    #[test]
    fn a_transaction_body_lists_the_head_then_the_pushes() {
        let head = r#"{"operations":[{"type":"ack","transactionId":"a1","partitionId":"1","status":"completed","consumerGroup":"g"}],"requiredLeases":["l1"]}"#;
        let t = transaction(
            &qtb1(
                0,
                head,
                &[("q", "Default", 1, frames(&[(&[3; 16], "p1", "{}")]))],
            ),
            LIMIT,
        )
        .unwrap();
        let (ops, leases, kv, timers) = t.request;
        assert!(!t.counts && kv.is_empty() && timers.is_empty());
        assert_eq!(leases, [queen_domain::ids::LeaseId::new("l1").unwrap()]);
        assert!(matches!(&ops[0], TxnOp::Ack { item, .. } if item.transaction_id == "a1"));
        assert!(
            matches!(&ops[1], TxnOp::Push(p) if p.transaction_id == "p1" && p.message_id == [3; 16])
        );
        // Pushes only, with an empty head.
        let t = transaction(
            &qtb1(
                FLAG_COUNTS,
                "",
                &[("q", "Default", 1, frames(&[(&[3; 16], "p1", "{}")]))],
            ),
            LIMIT,
        )
        .unwrap();
        assert!(t.counts && t.request.0.len() == 1);
    }

    #[test]
    fn every_malformed_transaction_body_is_a_named_400() {
        let one = frames(&[(&[3; 16], "p1", "{}")]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"QPB1\0".to_vec(), "the body does not start with QTB1"),
            (qtb1(1, "", &[]), "QTB1 flags 1 has unknown bits"),
            (
                b"QTB1\0\x09\0\0\0{}".to_vec(),
                "QTB1 ends inside the head (head_len)",
            ),
            (qtb1(0, "{", &[]), "QTB1 head: body is not valid JSON"),
            (
                qtb1(0, r#"{"operations":[{"type":"nope"}]}"#, &[]),
                "QTB1 head: operations[0].type must be ack or push",
            ),
            (qtb1(0, "{}", &[]), "QTB1 body holds no operation"),
            (
                qtb1(0, "{}", &[("q", "p", 1, frames(&[(&[3; 16], "p1", "{")]))]),
                "QTB1 group 0 (q/p) frame 0: the payload is not one JSON document",
            ),
            (
                {
                    let mut b = qtb1(0, "{}", &[("q", "p", 1, one)]);
                    b.extend_from_slice(b"xx");
                    b
                },
                "QTB1 body holds 2 bytes after its 1 groups",
            ),
        ];
        for (body, want) in cases {
            let e = transaction(&body, LIMIT).unwrap_err();
            assert_eq!(e.status, 400, "{want}: {}", e.message);
            assert!(
                e.message.starts_with(want),
                "want {want:?}, got {:?}",
                e.message
            );
        }
    }

    #[test]
    fn the_content_type_is_matched_without_parameters_or_case() {
        assert!(is_binary("application/x-queen-push"));
        assert!(is_binary("Application/X-Queen-Push; charset=binary"));
        assert!(!is_binary("application/json"));
    }
}
