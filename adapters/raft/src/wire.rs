//! What travels over the raft port: routes, the token header, the postcard encoding of request
//! and reply bodies, the framing of a streamed snapshot, and the replies of the app-level routes
//! (`/forward`, `/read_index`).
//!
//! Every body is postcard (the same encoding the log store uses for entries). Raft RPC bodies are
//! openraft's own request/response types; the app-level replies are defined here.

use bytes::BufMut;
use bytes::Bytes;
use bytes::BytesMut;
use queen_ports::ProposeError;
use serde::Deserialize;
use serde::Serialize;

/// The header carrying the shared raft token.
pub(crate) const TOKEN_HEADER: &str = "x-queen-raft-token";

/// Route of AppendEntries.
pub(crate) const APPEND: &str = "/raft/append_entries";
/// Route of a pipelined append stream (an upgraded connection).
pub(crate) const STREAM: &str = "/raft/stream_append";
/// The protocol name of an append stream's upgrade.
pub(crate) const STREAM_PROTOCOL: &str = "queen-raft-stream";
/// Largest answer frame of an append stream (answers are a log id or a refusal).
pub(crate) const MAX_REPLY_BYTES: usize = 64 << 10;
/// Route of RequestVote.
pub(crate) const VOTE: &str = "/raft/vote";
/// Route of Pre-Vote.
pub(crate) const PRE_VOTE: &str = "/raft/pre_vote";
/// Route of a streamed full snapshot.
pub(crate) const SNAPSHOT: &str = "/raft/full_snapshot";
/// Route of TransferLeader.
pub(crate) const TRANSFER_LEADER: &str = "/raft/transfer_leader";
/// Route where a follower hands a client command to the leader.
pub(crate) const FORWARD: &str = "/forward";
/// Route where a follower asks the leader for a linearizable read index.
pub(crate) const READ_INDEX: &str = "/read_index";
/// Route where the leader asks a member which log format it reads.
pub(crate) const INFO: &str = "/info";
/// Route where a follower hands a membership change (or listing) to the leader.
pub(crate) const MEMBERSHIP: &str = "/membership";
/// The prefix of the application's own calls between nodes (`queen_ports::PeerCalls`).
pub(crate) const APP_PREFIX: &str = "/app/";

/// Encode a body.
pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Bytes, String> {
    encode_sized(v, 256)
}

/// Encode a body into a buffer of about `capacity` bytes (a large body, such as an append of
/// many entries, is then not grown and copied step by step).
pub(crate) fn encode_sized<T: Serialize>(v: &T, capacity: usize) -> Result<Bytes, String> {
    postcard::to_extend(v, Vec::with_capacity(capacity))
        .map(Bytes::from)
        .map_err(|e| format!("encode: {e}"))
}

/// Decode a body.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, String> {
    postcard::from_bytes(b).map_err(|e| format!("decode: {e}"))
}

/// Compare two secrets in time that depends only on their lengths, not on where they differ.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    // subtle answers at once on a length mismatch (the length is not the secret) and compares
    // equal lengths without an early exit.
    bool::from(subtle::ConstantTimeEq::ct_eq(a, b))
}

/// A reply of the leader to a forwarded command or read-index request, or why it failed.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WireError {
    /// The receiving node does not lead (any more).
    NotLeader {
        /// Whom it believes to lead.
        leader: Option<u64>,
    },
    /// The entry may or may not commit.
    OutcomeUnknown,
    /// Retryable.
    Unavailable(String),
    /// A person must look.
    Fatal(String),
}

impl From<ProposeError> for WireError {
    fn from(e: ProposeError) -> Self {
        match e {
            ProposeError::NotLeader { leader } => WireError::NotLeader { leader },
            ProposeError::OutcomeUnknown => WireError::OutcomeUnknown,
            ProposeError::Unavailable(s) => WireError::Unavailable(s),
            ProposeError::Fatal(s) => WireError::Fatal(s),
        }
    }
}

impl From<WireError> for ProposeError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::NotLeader { leader } => ProposeError::NotLeader { leader },
            WireError::OutcomeUnknown => ProposeError::OutcomeUnknown,
            WireError::Unavailable(s) => ProposeError::Unavailable(s),
            WireError::Fatal(s) => ProposeError::Fatal(s),
        }
    }
}

/// The leader's answer to `/forward`: the response bytes and the entry's log index.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Forwarded {
    /// Index of the entry that carried the command.
    pub(crate) index: u64,
    /// The state machine's response.
    #[serde(with = "serde_bytes")]
    pub(crate) data: Vec<u8>,
}

/// The answer to `/info`. A node from before raft groups answers `kinds` alone (postcard then
/// ends after it; a reader of this form sees it as one group).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct InfoReply {
    /// The highest log format the node reads.
    pub(crate) kinds: u32,
    /// The raft groups the node runs (`QUEEN_RAFT_GROUPS`).
    pub(crate) groups: u16,
}

/// `/info` as a node from before raft groups answers it.
#[derive(Debug, Deserialize)]
pub(crate) struct InfoReplyV1 {
    /// The highest log format the node reads.
    pub(crate) kinds: u32,
}

/// Read an `/info` answer of either form.
pub(crate) fn decode_info(b: &[u8]) -> Result<InfoReply, String> {
    decode::<InfoReply>(b).or_else(|_| {
        decode::<InfoReplyV1>(b).map(|v| InfoReply {
            kinds: v.kinds,
            groups: 1,
        })
    })
}

/// The answer to `/membership`: the members as the leader sees them after the change.
pub(crate) type MembershipReply = Result<Vec<queen_ports::Member>, queen_ports::MembershipError>;

/// The answer to `/forward`.
pub(crate) type ForwardReply = Result<Forwarded, WireError>;
/// The answer to `/read_index`: the index the reader must have applied.
pub(crate) type ReadIndexReply = Result<u64, WireError>;

/// Frame tags of a streamed snapshot: header (vote + meta), one chunk, end of stream.
pub(crate) const FRAME_HEADER: u8 = 1;
/// A chunk of state.
pub(crate) const FRAME_CHUNK: u8 = 2;
/// The end marker; a stream without it is truncated and refused.
pub(crate) const FRAME_END: u8 = 3;

/// One frame: tag, big-endian u32 length, payload.
pub(crate) fn frame(tag: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(tag);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// The payload length the frame at the front of `buf` declares, once its header arrived: lets a
/// receiver refuse a frame too large to hold before it buffers it.
pub(crate) fn frame_len(buf: &BytesMut) -> Option<usize> {
    (buf.len() >= 5).then(|| u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize)
}

/// Take one complete frame off the front of `buf`, if there is one.
pub(crate) fn take_frame(buf: &mut BytesMut) -> Option<(u8, Bytes)> {
    let len = frame_len(buf)?;
    if buf.len() < 5 + len {
        return None;
    }
    let tag = buf[0];
    let mut f = buf.split_to(5 + len);
    let payload = f.split_off(5).freeze();
    Some((tag, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_eq_compares_whole_values() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret2"));
        assert!(!ct_eq(b"", b"x"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn frames_round_trip_across_splits() {
        let mut all = BytesMut::new();
        all.extend_from_slice(&frame(FRAME_HEADER, b"hdr"));
        all.extend_from_slice(&frame(FRAME_CHUNK, &[7u8; 300]));
        all.extend_from_slice(&frame(FRAME_END, b""));
        let bytes = all.freeze();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for piece in bytes.chunks(7) {
            buf.extend_from_slice(piece);
            while let Some(f) = take_frame(&mut buf) {
                got.push(f);
            }
        }
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (FRAME_HEADER, Bytes::from_static(b"hdr")));
        assert_eq!(got[1].1.len(), 300);
        assert_eq!(got[2].0, FRAME_END);
    }
}
