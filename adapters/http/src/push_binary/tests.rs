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
        write_frame(&mut out, id, None, txn, None, payload.as_bytes()).unwrap();
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
    write_frame(&mut traced, &a, Some(&[0xab; 16]), "t", None, b"1").unwrap();
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
    write_frame(&mut f, &[1; 16], None, "t", None, &bomb).unwrap();
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
    write_frame(&mut f, &[1; 16], None, "t", None, &small).unwrap();
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
