//! The client side of QPB1 with FRAMES (`shared/spec/API.md` 4.6), as the official Python
//! client 2.6.0 emits it with `binary_push=True, push_compression=True`:
//!
//! ```text
//! "QPB1" | u8 flags = 8 | u32 groups
//! per group: str16 queue | str16 partition | u32 n | u32 z_len | z
//! z = one zstd frame (level 1, content size recorded) of n stored message frames:
//!     u32 body_len | u8 flags = 0 | u8[16] message id (UUIDv7) | str16 transactionId | payload
//! ```
//! All integers little-endian; `body_len = 1 + 16 + 2 + len(txn) + len(payload)`.

use queen_bench::load::Rng;

/// The Content-Type of a binary push.
pub const CONTENT_TYPE: &str = "application/x-queen-push";

/// FRAMES: groups carry pre-built, compressed frames.
const FLAG_FRAMES: u8 = 8;

/// One group: consecutive messages of one (queue, partition), as (transactionId, payload JSON).
pub struct Group<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
    pub messages: &'a [(String, String)],
}

fn str16(out: &mut Vec<u8>, s: &str) -> Result<(), String> {
    let len = u16::try_from(s.len())
        .map_err(|_| format!("a name of {} bytes does not fit a str16", s.len()))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn u32_of(n: usize, what: &str) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("{what} of {n} does not fit a u32"))
}

/// A UUIDv7: `ms` milliseconds since the epoch in the first 48 bits, version 7, variant 10,
/// random elsewhere.
pub fn uuid_v7(ms: u64, rng: &mut Rng) -> [u8; 16] {
    let mut id = [0u8; 16];
    rng.fill(&mut id);
    id[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    id[6] = 0x70 | (id[6] & 0x0f);
    id[8] = 0x80 | (id[8] & 0x3f);
    id
}

/// The stored frames of one group, back to back (before compression).
pub fn frames(messages: &[(String, String)], ms: u64, rng: &mut Rng) -> Result<Vec<u8>, String> {
    let mut raw = Vec::with_capacity(
        messages
            .iter()
            .map(|(t, p)| 4 + 19 + t.len() + p.len())
            .sum(),
    );
    for (txn, payload) in messages {
        let body_len = u32_of(
            1 + 16 + 2 + txn.len() + payload.len(),
            "a frame's body length",
        )?;
        raw.extend_from_slice(&body_len.to_le_bytes());
        raw.push(0);
        raw.extend_from_slice(&uuid_v7(ms, rng));
        str16(&mut raw, txn)?;
        raw.extend_from_slice(payload.as_bytes());
    }
    Ok(raw)
}

/// A whole QPB1 body with FRAMES, one zstd frame (level 1) per group.
#[allow(
    clippy::disallowed_methods,
    reason = "the frame header's time, as a client would write it"
)]
pub fn encode(groups: &[Group<'_>], rng: &mut Rng) -> Result<Vec<u8>, String> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut out = Vec::new();
    out.extend_from_slice(b"QPB1");
    out.push(FLAG_FRAMES);
    out.extend_from_slice(&u32_of(groups.len(), "the group count")?.to_le_bytes());
    for g in groups {
        str16(&mut out, g.queue)?;
        str16(&mut out, g.partition)?;
        out.extend_from_slice(&u32_of(g.messages.len(), "a group's message count")?.to_le_bytes());
        let raw = frames(g.messages, ms, rng)?;
        // zstd's one-shot compression records the content size in the frame header.
        let z = zstd::bulk::compress(&raw, 1).map_err(|e| format!("zstd: {e}"))?;
        out.extend_from_slice(&u32_of(z.len(), "a compressed group")?.to_le_bytes());
        out.extend_from_slice(&z);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> usize {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
    }

    #[test]
    fn a_body_decodes_back_to_its_frames() {
        let mut rng = Rng::seeded(7);
        let msgs: Vec<(String, String)> = (0..3)
            .map(|i| (format!("t{i}"), format!("{{\"d\":\"{i}\"}}")))
            .collect();
        let body = encode(
            &[Group {
                queue: "bench",
                partition: "p1",
                messages: &msgs,
            }],
            &mut rng,
        )
        .unwrap();
        assert_eq!(&body[..5], b"QPB1\x08");
        assert_eq!(u32_at(&body, 5), 1);
        let mut at = 9;
        assert_eq!(&body[at..at + 2], &5u16.to_le_bytes());
        assert_eq!(&body[at + 2..at + 7], b"bench");
        at += 7;
        assert_eq!(&body[at..at + 4], b"\x02\x00p1");
        at += 4;
        assert_eq!(u32_at(&body, at), 3);
        let z_len = u32_at(&body, at + 4);
        let z = &body[at + 8..];
        assert_eq!(z.len(), z_len);
        let size = zstd::zstd_safe::get_frame_content_size(z).unwrap();
        let raw = zstd::bulk::decompress(z, 1 << 20).unwrap();
        assert_eq!(
            size,
            Some(raw.len() as u64),
            "the frame records its content size"
        );
        let mut p = 0;
        for (txn, payload) in &msgs {
            let body_len = u32_at(&raw, p);
            assert_eq!(body_len, 1 + 16 + 2 + txn.len() + payload.len());
            assert_eq!(raw[p + 4], 0, "flags");
            let id = &raw[p + 5..p + 21];
            assert_eq!(id[6] >> 4, 7, "UUIDv7");
            assert_eq!(id[8] >> 6, 0b10, "variant");
            assert_eq!(&raw[p + 21..p + 23], &(txn.len() as u16).to_le_bytes());
            assert_eq!(&raw[p + 23..p + 23 + txn.len()], txn.as_bytes());
            assert_eq!(
                &raw[p + 23 + txn.len()..p + 4 + body_len],
                payload.as_bytes()
            );
            p += 4 + body_len;
        }
        assert_eq!(p, raw.len());
    }
}
