use super::*;

/// The log holds an ack's status as its word, as when it was a text: entries written
/// before the type read the same (`success` as `completed`, an unknown word kept and
/// refused at apply), and new entries are the bytes the old text gave.
#[test]
fn ack_status_keeps_the_log_encoding_of_its_word() {
    #[derive(Serialize)]
    struct Before {
        transaction_id: String,
        partition_id: String,
        status: String,
        error: Option<String>,
        lease_id: Option<String>,
    }
    let before = |status: &str| Before {
        transaction_id: "t".into(),
        partition_id: "1".into(),
        status: status.into(),
        error: None,
        lease_id: None,
    };
    for (word, read) in [
        ("completed", AckStatus::Completed),
        ("success", AckStatus::Completed),
        ("failed", AckStatus::Failed),
        ("dlq", AckStatus::Dlq),
        ("retry", AckStatus::Retry),
        ("weird", AckStatus::Unknown("weird".into())),
    ] {
        let bytes = postcard::to_allocvec(&before(word)).unwrap();
        let item: AckItem = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(item.status, read, "{word}");
        if word != "success" {
            assert_eq!(postcard::to_allocvec(&item).unwrap(), bytes, "{word}");
        }
    }
}

/// A push entry read in place gives the items the owned decode gives; any other entry,
/// and a push naming a queue or partition the owned decode refuses, gives nothing.
#[test]
fn a_push_read_in_place_is_the_push_decoded() {
    let item = |q: &str, p: &str, i: u8| PushItem {
        queue: QueueName::new(q).expect("name"),
        partition: PartitionName::new(p).expect("name"),
        transaction_id: TransactionId::new(format!("t{i}")).expect("id"),
        message_id: [i; 16],
        payload: vec![i; usize::from(i) * 7],
        trace_id: i.is_multiple_of(2).then(|| format!("trace{i}")),
    };
    let items: Vec<PushItem> = (0..9u8)
        .map(|i| {
            item(
                ["a", "b"][usize::from(i % 2)],
                ["x", "y", "z"][usize::from(i % 3)],
                i,
            )
        })
        .collect();
    let bytes = Entry {
        proposed_at: 42,
        command: Command::Push(items.clone()),
    }
    .encode();
    let (at, read) = decode_push(&bytes).expect("a push");
    assert_eq!(at, 42);
    let want: Vec<PushItemRef<'_>> = items.iter().map(PushItem::as_item_ref).collect();
    assert_eq!(read, want);
    assert!(
        decode_push(
            &Entry {
                proposed_at: 1,
                command: Command::Tick
            }
            .encode()
        )
        .is_none()
    );
    // A name the owned decode refuses (bytes a valid build never proposes).
    let mut bad = bytes.clone();
    let at = bad
        .iter()
        .position(|&b| b == b'x')
        .expect("a partition name");
    bad[at] = b'/';
    assert!(Entry::decode(&bad).is_err());
    assert!(decode_push(&bad).is_none());
}

/// A push entry is encoded into the buffer its hint reserves, without growing it, whatever
/// the sizes of its fields.
#[test]
fn a_push_fits_the_buffer_its_hint_reserves() {
    for (n, payload, txn) in [
        (1, 0, 1),
        (1, 256, 36),
        (100, 256, 40),
        (7, 70_000, 512),
        (3, 5, 300),
    ] {
        let items: Vec<PushItem> = (0..n)
            .map(|i| PushItem {
                queue: QueueName::new(format!("queue-{i}")).expect("name"),
                partition: PartitionName::new("p".repeat(i % 200 + 1)).expect("name"),
                transaction_id: TransactionId::new("t".repeat(txn)).expect("id"),
                message_id: [7; 16],
                payload: vec![b'x'; payload],
                trace_id: (i % 2 == 0).then(|| "trace".repeat(20)),
            })
            .collect();
        let e = Entry {
            proposed_at: u64::MAX,
            command: Command::Push(items),
        };
        let bytes = e.encode();
        assert!(
            bytes.len() <= e.command.encoded_len_hint(),
            "{n} items: {} > {}",
            bytes.len(),
            e.command.encoded_len_hint()
        );
        assert_eq!(
            bytes.capacity(),
            e.command.encoded_len_hint(),
            "never grown"
        );
        assert_eq!(Entry::decode(&bytes).expect("decode"), e);
    }
}
