//! The append stream's framing, splitting and deadlines, against a scripted follower.

use std::time::Duration;

use futures::StreamExt;
use openraft::entry::RaftEntry;
use openraft::network::RPCOption;
use openraft::testing::log_id;
use tokio::io::AsyncWriteExt;

use super::*;
use crate::type_config::Command;
use crate::type_config::Entry;
use crate::type_config::Vote;

fn entry(index: u64, bytes: usize) -> Entry {
    Entry::new_normal(
        log_id::<TypeConfig>(1, 1, index),
        Command(vec![b'x'; bytes].into()),
    )
}

fn append(prev: u64, entries: Vec<Entry>) -> Request {
    Request {
        vote: Vote::new_committed(1, 1),
        prev_log_id: Some(log_id::<TypeConfig>(1, 1, prev)),
        leader_commit: None,
        entries,
    }
}

fn option() -> RPCOption {
    RPCOption::new(Duration::from_millis(100))
}

/// The follower's side of a scripted stream: the appends it read, in order.
async fn read_appends<R: AsyncRead + Unpin>(rd: &mut R, n: usize) -> Vec<Request> {
    let mut out = Vec::new();
    for _ in 0..n {
        let len = read_len(rd).await.unwrap().expect("a frame");
        out.push(wire::decode(&read_body(rd, len).await.unwrap()).unwrap());
    }
    out
}

async fn answer<W: AsyncWrite + Unpin>(wr: &mut W, a: &FrameAnswer) {
    write_frame(wr, &wire::encode(a).unwrap()).await.unwrap();
}

#[test]
fn a_large_append_goes_in_frames_that_continue_each_other() {
    // Three entries of 3 MiB: two fit in one frame of MAX_APPEND_BYTES (8 MiB), the third not.
    let big = 3 << 20;
    let req = append(4, (5..=7).map(|i| entry(i, big)).collect());
    let parts = frames(req);
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].0.prev_log_id.map(|l| l.index), Some(4));
    assert_eq!(parts[0].0.entries.len(), 2);
    assert_eq!(parts[0].1, 2 * big);
    assert_eq!(parts[1].0.prev_log_id.map(|l| l.index), Some(6));
    assert_eq!(parts[1].0.entries.len(), 1);
    // One entry larger than a frame still goes, alone; an empty append is one frame.
    let huge = frames(append(1, vec![entry(2, 9 << 20)]));
    assert_eq!(huge.len(), 1);
    let empty = frames(append(3, Vec::new()));
    assert_eq!(empty.len(), 1);
    assert_eq!(empty[0].0.prev_log_id.map(|l| l.index), Some(3));
}

#[tokio::test]
async fn appends_go_without_waiting_and_each_gets_the_answer_of_its_last_frame() {
    let (leader, follower) = tokio::io::duplex(64 << 20);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let input = futures::stream::poll_fn({
        let mut rx = rx;
        move |cx| rx.poll_recv(cx)
    });
    let mut out = Box::pin(client(leader, input, option(), || false));
    // Two appends before any answer: the second is on the wire while the first is unanswered.
    tx.send(append(0, vec![entry(1, 10)])).unwrap();
    tx.send(append(1, (2..=4).map(|i| entry(i, 3 << 20)).collect()))
        .unwrap();
    let (mut rd, mut wr) = tokio::io::split(follower);
    let got = read_appends(&mut rd, 3).await;
    assert_eq!(got[0].entries.len(), 1);
    assert_eq!(got[1].entries.len(), 2, "the second append's first frame");
    assert_eq!(got[2].prev_log_id.map(|l| l.index), Some(3));
    for i in [1, 3, 4] {
        answer(&mut wr, &Ok(Ok(Some(log_id::<TypeConfig>(1, 1, i))))).await;
    }
    let a = out.next().await.unwrap().unwrap().unwrap();
    assert_eq!(a.map(|l| l.index), Some(1));
    let b = out.next().await.unwrap().unwrap().unwrap();
    assert_eq!(b.map(|l| l.index), Some(4), "only the last frame's answer");
    // openraft ends the stream: the follower sees the end, closes, and the stream ends.
    drop(tx);
    assert_eq!(read_len(&mut rd).await.unwrap(), None);
    wr.shutdown().await.unwrap();
    assert!(out.next().await.is_none());
}

#[tokio::test]
async fn a_refusal_ends_the_stream() {
    let (leader, follower) = tokio::io::duplex(1 << 20);
    let input = futures::stream::iter(vec![
        append(0, vec![entry(1, 10)]),
        append(1, vec![entry(2, 10)]),
    ]);
    let mut out = Box::pin(client(leader, input, option(), || false));
    let (mut rd, mut wr) = tokio::io::split(follower);
    read_appends(&mut rd, 2).await;
    let conflict = log_id::<TypeConfig>(1, 1, 0);
    answer(&mut wr, &Ok(Err(StreamAppendError::Conflict(conflict)))).await;
    answer(&mut wr, &Ok(Ok(Some(log_id::<TypeConfig>(1, 1, 2))))).await;
    assert!(matches!(
        out.next().await,
        Some(Ok(Err(StreamAppendError::Conflict(_))))
    ));
    assert!(out.next().await.is_none(), "nothing after a refusal");
}

#[tokio::test]
async fn an_answer_that_does_not_come_in_time_makes_the_follower_unreachable() {
    let (leader, follower) = tokio::io::duplex(1 << 20);
    let input = futures::stream::iter(vec![append(0, vec![entry(1, 10)])]).chain(
        // openraft keeps the stream open while it waits for more entries.
        futures::stream::pending(),
    );
    let mut out = Box::pin(client(leader, input, option(), || false));
    let (mut rd, _wr) = tokio::io::split(follower);
    read_appends(&mut rd, 1).await;
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), out.next())
        .await
        .expect("the deadline ends the wait");
    assert!(matches!(r, Some(Err(RPCError::Unreachable(_)))), "{r:?}");
    // The deadline is the RPC timeout of the frame: at least its one-second floor.
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(out.next().await.is_none());
}

#[tokio::test]
async fn an_idle_stream_waits_without_a_deadline() {
    let (leader, _follower) = tokio::io::duplex(1 << 20);
    let input = futures::stream::pending::<Request>();
    let mut out = Box::pin(client(leader, input, option(), || false));
    // Nothing was sent, so nothing is owed: no deadline fires.
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), out.next())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_follower_that_closes_with_answers_owed_is_unreachable() {
    let (leader, follower) = tokio::io::duplex(1 << 20);
    let input = futures::stream::iter(vec![append(0, vec![entry(1, 10)])])
        .chain(futures::stream::pending());
    let mut out = Box::pin(client(leader, input, option(), || false));
    let (mut rd, mut wr) = tokio::io::split(follower);
    read_appends(&mut rd, 1).await;
    wr.shutdown().await.unwrap();
    drop(rd);
    assert!(matches!(
        out.next().await,
        Some(Err(RPCError::Unreachable(_)))
    ));
}

#[tokio::test]
async fn the_fault_layer_stops_a_stream_before_it_sends() {
    let (leader, follower) = tokio::io::duplex(1 << 20);
    let input = futures::stream::iter(vec![append(0, vec![entry(1, 10)])]);
    let mut out = Box::pin(client(leader, input, option(), || true));
    let (mut rd, mut wr) = tokio::io::split(follower);
    // The follower sees the stream end without a frame, and closes its side.
    assert_eq!(read_len(&mut rd).await.unwrap(), None);
    wr.shutdown().await.unwrap();
    assert!(out.next().await.is_none());
}

#[tokio::test]
async fn a_kept_receive_buffer_reads_frames_in_pieces_and_refuses_a_cut_one() {
    let (mut wr, mut rd) = tokio::io::duplex(64);
    let big: Vec<u8> = (0..KEPT_FRAME_BUFFER + 10)
        .map(|i| (i % 251) as u8)
        .collect();
    let small = b"a small frame".to_vec();
    let (b2, s2) = (big.clone(), small.clone());
    let writer = tokio::spawn(async move {
        // Written in pieces smaller than the pipe, so every frame arrives in many reads.
        for part in [&s2[..], &b2[..], &s2[..], &b2[..100]] {
            for chunk in part.chunks(37) {
                wr.write_all(chunk).await.unwrap();
            }
        }
        // The writer stops 100 bytes into the second large frame.
    });
    let mut buf = Vec::new();
    read_body_into(&mut rd, &mut buf, small.len())
        .await
        .unwrap();
    assert_eq!(buf, small);
    read_body_into(&mut rd, &mut buf, big.len()).await.unwrap();
    assert_eq!(buf, big);
    // A buffer grown past what a stream keeps is let go before the next small frame.
    read_body_into(&mut rd, &mut buf, small.len())
        .await
        .unwrap();
    assert_eq!(buf, small);
    assert!(buf.capacity() <= KEPT_FRAME_BUFFER);
    let cut = tokio::time::timeout(
        Duration::from_secs(10),
        read_body_into(&mut rd, &mut buf, big.len()),
    )
    .await
    .expect("a cut frame ends the read");
    assert_eq!(
        cut.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::UnexpectedEof)
    );
    writer.await.unwrap();
}
