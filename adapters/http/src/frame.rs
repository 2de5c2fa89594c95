//! The pieces every binary body shares (`shared/spec/API.md` 4.6): a little-endian reader that
//! says what it ran out in, the stored message frame, and zstd frames decompressed into a
//! buffer no larger than the caller allows. No I/O; every failure is a sentence that the body
//! parsers prefix with where it happened (which group, which frame).

/// The frame carries a 16-byte trace id after its message id.
pub(crate) const FLAG_TRACE: u8 = 1;
/// The frame carries a producer (the JWT subject, stamped by a broker).
pub(crate) const FLAG_PRODUCER: u8 = 2;
/// The payload is encrypted with the broker's key.
pub(crate) const FLAG_ENCRYPTED: u8 = 4;

/// Bytes of a frame after `body_len` when its transactionId and payload are empty and it has
/// no trace id: flags, message id, the transactionId's length.
pub(crate) const FRAME_FIXED: usize = 1 + 16 + 2;

/// Reads little-endian fields off a byte slice; a read past the end names the field.
pub(crate) struct Reader<'a> {
    /// The whole input.
    data: &'a [u8],
    /// Bytes read so far.
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data, at: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.at
    }

    /// The next `n` bytes, which hold `what`.
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        self.take_named(n, || what.to_owned())
    }

    /// The next `n` bytes; `what` names them, built only for a refusal (this runs once or more
    /// per message, so the common case formats nothing).
    pub(crate) fn take_named(
        &mut self,
        n: usize,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "ends inside {} (needs {n} bytes, {} left)",
                what(),
                self.remaining()
            ));
        }
        let piece = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(piece)
    }

    /// Everything not read yet.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let piece = &self.data[self.at..];
        self.at = self.data.len();
        piece
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    /// A `u16`; `what` names it, built only for a refusal.
    pub(crate) fn u16_named(&mut self, what: impl FnOnce() -> String) -> Result<u16, String> {
        let b = self.take_named(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A `u32` length, as a `usize`.
    pub(crate) fn len32(&mut self, what: &str) -> Result<usize, String> {
        // u32 always fits a usize on the 64-bit targets we build for; saturate elsewhere so a
        // bound check, not a wrap, refuses it.
        Ok(usize::try_from(self.u32(what)?).unwrap_or(usize::MAX))
    }

    /// A `str16`: a `u16` length, then that many bytes of UTF-8.
    pub(crate) fn str16(&mut self, what: &str) -> Result<&'a str, String> {
        let n = usize::from(self.u16_named(|| format!("the length of {what}"))?);
        let b = self.take(n, what)?;
        std::str::from_utf8(b).map_err(|_| format!("{what} is not UTF-8"))
    }
}

/// One stored message frame, borrowed from the bytes it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    /// The frame's flags (`FLAG_*`).
    pub(crate) flags: u8,
    /// The message id (UUID bytes).
    pub(crate) message_id: [u8; 16],
    /// The trace id, when `FLAG_TRACE` is set.
    pub(crate) trace_id: Option<[u8; 16]>,
    /// The transactionId (may be empty).
    pub(crate) transaction_id: &'a str,
    /// The producer, when `FLAG_PRODUCER` is set.
    pub(crate) producer: Option<&'a str>,
    /// The payload: one JSON document, or empty for `null`.
    pub(crate) payload: &'a [u8],
}

/// Read one frame (`u32 body_len`, then the body). Unknown flag bits are refused, so a frame
/// of a newer format is never misread.
pub(crate) fn read_frame<'a>(r: &mut Reader<'a>) -> Result<Frame<'a>, String> {
    let body_len = r.len32("body_len")?;
    if body_len < FRAME_FIXED {
        return Err(format!(
            "body_len {body_len} is shorter than a frame's fixed part ({FRAME_FIXED} bytes)"
        ));
    }
    let mut b = Reader::new(r.take_named(body_len, || {
        format!("its body of {body_len} bytes (body_len)")
    })?);
    let flags = b.u8("flags")?;
    if flags & !(FLAG_TRACE | FLAG_PRODUCER | FLAG_ENCRYPTED) != 0 {
        return Err(format!(
            "flags {flags} has unknown bits (known: 1 trace id, 2 producer, 4 encrypted)"
        ));
    }
    let message_id = id16(b.take(16, "the message id")?);
    let trace_id = if flags & FLAG_TRACE != 0 {
        Some(id16(b.take(16, "the trace id")?))
    } else {
        None
    };
    let transaction_id = b.str16("the transactionId")?;
    let producer = if flags & FLAG_PRODUCER != 0 {
        Some(b.str16("the producer")?)
    } else {
        None
    };
    Ok(Frame {
        flags,
        message_id,
        trace_id,
        transaction_id,
        producer,
        payload: b.rest(),
    })
}

fn id16(b: &[u8]) -> [u8; 16] {
    let mut id = [0u8; 16];
    id.copy_from_slice(b);
    id
}

/// Append one frame. `None` when a text does not fit its `u16` length or the frame its `u32`.
pub(crate) fn write_frame(
    out: &mut Vec<u8>,
    message_id: &[u8; 16],
    trace_id: Option<&[u8; 16]>,
    transaction_id: &str,
    producer: Option<&str>,
    payload: &[u8],
) -> Option<()> {
    let body_len = FRAME_FIXED
        + if trace_id.is_some() { 16 } else { 0 }
        + transaction_id.len()
        + producer.map_or(0, |p| 2 + p.len())
        + payload.len();
    out.extend_from_slice(&u32::try_from(body_len).ok()?.to_le_bytes());
    let mut flags = 0;
    if trace_id.is_some() {
        flags |= FLAG_TRACE;
    }
    if producer.is_some() {
        flags |= FLAG_PRODUCER;
    }
    out.push(flags);
    out.extend_from_slice(message_id);
    if let Some(t) = trace_id {
        out.extend_from_slice(t);
    }
    write_str16(out, transaction_id)?;
    if let Some(p) = producer {
        write_str16(out, p)?;
    }
    out.extend_from_slice(payload);
    Some(())
}

/// Append a `str16`; `None` when the text is longer than 65 535 bytes.
pub(crate) fn write_str16(out: &mut Vec<u8>, text: &str) -> Option<()> {
    out.extend_from_slice(&u16::try_from(text.len()).ok()?.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Some(())
}

/// Why a zstd frame was not decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Inflate {
    /// The frame would decompress to more than the caller allows (a 413).
    TooLarge(String),
    /// The bytes are not one whole zstd frame of the expected size (a 400).
    Bad(String),
}

/// Run `f` with this thread's zstd decompression context. Creating one per frame (what
/// `zstd::bulk::decompress` does) allocated and set up about 100 KiB of tables for every group
/// of a QPB1 body: 1.3% of a leader's CPU under QPB1 pushes.
fn with_decompressor<T>(
    f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<T>,
) -> std::io::Result<T> {
    thread_local! {
        static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = match slot.as_mut() {
            Some(d) => d,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        f(d)
    })
}

/// Decompress `z`, which must be exactly one zstd frame. `declared` is the size the body says
/// it holds (QPB1's `raw_len`); without it the frame must record its content size. Either way
/// the output buffer is that size, refused above `allowed`, and a frame that would write more
/// fails instead of growing it: memory is bounded before the first byte is decompressed.
pub(crate) fn inflate(
    z: &[u8],
    declared: Option<usize>,
    allowed: usize,
) -> Result<Vec<u8>, Inflate> {
    let whole = zstd::zstd_safe::find_frame_compressed_size(z)
        .map_err(|_| Inflate::Bad("is not a zstd frame".to_owned()))?;
    if whole != z.len() {
        return Err(Inflate::Bad(format!(
            "holds {} bytes after its zstd frame (one frame expected)",
            z.len() - whole.min(z.len())
        )));
    }
    let recorded = match zstd::zstd_safe::get_frame_content_size(z) {
        Ok(size) => size.map(|s| usize::try_from(s).unwrap_or(usize::MAX)),
        Err(_) => return Err(Inflate::Bad("is not a zstd frame".to_owned())),
    };
    let size = match (declared, recorded) {
        (Some(d), Some(r)) if d != r => {
            return Err(Inflate::Bad(format!(
                "records a content size of {r} bytes, not the declared {d}"
            )));
        }
        (Some(d), _) => d,
        (None, Some(r)) => r,
        (None, None) => {
            return Err(Inflate::Bad(
                "does not record its content size (compress with the content size written)"
                    .to_owned(),
            ));
        }
    };
    if size > allowed {
        return Err(Inflate::TooLarge(format!(
            "would decompress to {size} bytes, more than the {allowed} this body may still hold (QUEEN_MAX_BODY_BYTES)"
        )));
    }
    let out = with_decompressor(|d| d.decompress(z, size))
        .map_err(|e| Inflate::Bad(format!("does not decompress to {size} bytes: {e}")))?;
    if out.len() != size {
        return Err(Inflate::Bad(format!(
            "decompresses to {} bytes, not the declared {size}",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_carries_the_broker_stamped_producer() {
        let mut out = Vec::new();
        write_frame(&mut out, &[7; 16], None, "t-1", Some("svc-a"), b"1").unwrap();
        let mut r = Reader::new(&out);
        let f = read_frame(&mut r).unwrap();
        assert_eq!(r.remaining(), 0);
        assert_eq!(
            (f.flags, f.producer, f.transaction_id, f.payload),
            (FLAG_PRODUCER, Some("svc-a"), "t-1", &b"1"[..])
        );
    }

    #[test]
    fn a_frame_round_trips_with_and_without_a_trace_id() {
        for trace in [None, Some([9u8; 16])] {
            let mut out = Vec::new();
            write_frame(
                &mut out,
                &[7; 16],
                trace.as_ref(),
                "t-1",
                None,
                br#"{"a":1}"#,
            )
            .unwrap();
            let mut r = Reader::new(&out);
            let f = read_frame(&mut r).unwrap();
            assert_eq!(r.remaining(), 0);
            assert_eq!(
                (f.message_id, f.trace_id, f.transaction_id, f.payload),
                ([7; 16], trace, "t-1", &br#"{"a":1}"#[..])
            );
            assert_eq!(f.flags, u8::from(trace.is_some()));
        }
    }

    #[test]
    fn a_malformed_frame_says_what_is_wrong() {
        let mut good = Vec::new();
        write_frame(&mut good, &[7; 16], None, "t", None, b"1").unwrap();
        let err = |b: &[u8]| read_frame(&mut Reader::new(b)).unwrap_err();
        assert_eq!(
            err(&good[..2]),
            "ends inside body_len (needs 4 bytes, 2 left)"
        );
        assert!(err(&good[..good.len() - 1]).starts_with("ends inside its body of"));
        assert!(err(&[3, 0, 0, 0, 0, 0, 0]).starts_with("body_len 3 is shorter"));
        let mut flags = good.clone();
        flags[4] = 8;
        assert!(err(&flags).starts_with("flags 8 has unknown bits"));
        let mut txn = good.clone();
        txn[4 + 17] = 200;
        assert!(err(&txn).starts_with("ends inside the transactionId"));
        let mut utf8 = good.clone();
        utf8[4 + 19] = 0xff;
        assert_eq!(err(&utf8), "the transactionId is not UTF-8");
    }

    #[test]
    fn inflate_is_bounded_before_it_decompresses() {
        let raw = vec![b'x'; 100_000];
        let z = zstd::bulk::compress(&raw, 1).unwrap();
        assert_eq!(inflate(&z, None, 100_000).unwrap(), raw);
        assert!(matches!(
            inflate(&z, None, 99_999),
            Err(Inflate::TooLarge(_))
        ));
        assert!(
            matches!(inflate(&z, Some(10), 100_000), Err(Inflate::Bad(m)) if m.contains("not the declared 10"))
        );
        let mut two = z.clone();
        two.extend_from_slice(&z);
        assert!(
            matches!(inflate(&two, None, 1 << 30), Err(Inflate::Bad(m)) if m.contains("after its zstd frame"))
        );
        assert!(matches!(inflate(b"nope", None, 100), Err(Inflate::Bad(_))));
        // A frame without its content size: only a declared size will do.
        let mut enc = zstd::bulk::Compressor::new(1).unwrap();
        enc.include_contentsize(false).unwrap();
        let bare = enc.compress(&raw).unwrap();
        assert!(
            matches!(inflate(&bare, None, 1 << 30), Err(Inflate::Bad(m)) if m.contains("content size"))
        );
        assert_eq!(inflate(&bare, Some(100_000), 100_000).unwrap(), raw);
        // A declared size smaller than the frame's output fails without growing the buffer.
        assert!(matches!(
            inflate(&bare, Some(50_000), 100_000),
            Err(Inflate::Bad(_))
        ));
    }
}
