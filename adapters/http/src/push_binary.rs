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
//! producer flag (2) or the encrypted flag (4) are refused: the producer is the broker's to stamp
//! (from a JWT), and encryption is the broker's to do (queues with `encryptionEnabled`), so a
//! client cannot claim either.

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
                            "{}: flag 4 (encrypted) is set; the broker encrypts queues with encryptionEnabled itself and takes no client-encrypted frames",
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
mod tests;
