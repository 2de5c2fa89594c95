//! The message segment log against real process deaths and many partitions: a node killed
//! with -9 again and again in the middle of appending batches keeps every acknowledged message
//! exactly once and at the same offset; a torn tail written past the committed end is cut at
//! start; 10,000 partitions on one node keep memory bounded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_tests::{Node, post_url};
use serde_json::{Value, json};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Every message of a queue: transactionId -> (partition, offset from the message id order),
/// read with autoAck pops.
fn drain(n: &Node, queue: &str) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        let a = n.get(&format!(
            "/api/v1/pop/queue/{queue}?batch=1000&partitions=16&wait=false&autoAck=true"
        ));
        if a.status == 204 {
            return seen;
        }
        assert_eq!(a.status, 200, "{}", a.text);
        for m in a.json["messages"].as_array().unwrap() {
            seen.push((
                m["transactionId"].as_str().unwrap().to_owned(),
                m["partitionId"].to_string(),
            ));
        }
    }
    panic!("draining {queue} did not finish in time");
}

fn peak_rss_kib(pid: u32) -> u64 {
    queen_tests::memory_kib(pid, "VmHWM")
}

#[test]
fn repeated_kill_9_during_batch_appends_keeps_every_acknowledged_message_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = Node::start(bin(), &dir.path().join("n1"), &[]);
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let payload = "x".repeat(2000);
    for round in 0..3 {
        let port = n.port;
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let acked = acked.clone();
                let payload = payload.clone();
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(20);
                    for b in 0..10_000 {
                        if Instant::now() > until {
                            break;
                        }
                        let txns: Vec<String> = (0..50).map(|i| format!("r{round}-w{w}-b{b}-{i}")).collect();
                        let items: Vec<Value> = txns
                            .iter()
                            .enumerate()
                            .map(|(i, t)| json!({"queue": "seg", "partition": format!("p{}", (w + i) % 6), "transactionId": t, "payload": {"t": t, "pad": payload}}))
                            .collect();
                        match post_url(&format!("http://127.0.0.1:{port}/api/v1/push"), &json!({ "items": items }).to_string()) {
                            Ok((200, text)) => {
                                let v: Value = serde_json::from_str(&text).unwrap();
                                let mut a = acked.lock().unwrap();
                                for (i, t) in txns.into_iter().enumerate() {
                                    assert_eq!(v[i]["status"], "queued", "{}", v[i]);
                                    a.insert(t);
                                }
                            }
                            _ => break,
                        }
                    }
                })
            })
            .collect();
        let before = acked.lock().unwrap().len();
        assert!(
            queen_tests::eventually(Duration::from_secs(30), || acked.lock().unwrap().len()
                >= before + 1000),
            "writers made no progress in round {round}:\n{}",
            n.log_text()
        );
        n.kill9();
        for w in writers {
            w.join().unwrap();
        }
        n.restart();
    }
    let acked = acked.lock().unwrap().clone();
    // Offsets are the same after one more restart: read partition by partition in order.
    let fetch = json!({"entries": (0..6).map(|p| json!({"queue": "seg", "partition": format!("p{p}"), "offset": 0, "maxBytes": 200_000})).collect::<Vec<_>>()});
    let first = n.post("/api/v1/fetch", &fetch);
    assert_eq!(first.status, 200, "{}", first.text);
    n.kill9();
    n.restart();
    assert_eq!(
        n.post("/api/v1/fetch", &fetch).json,
        first.json,
        "a restart changed what is stored at which offset"
    );
    let seen = drain(&n, "seg");
    let unique: BTreeSet<String> = seen.iter().map(|(t, _)| t.clone()).collect();
    eprintln!("acknowledged: {}, stored: {}", acked.len(), seen.len());
    assert_eq!(unique.len(), seen.len(), "a message was stored twice");
    let missing: Vec<_> = acked.difference(&unique).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged pushes lost, e.g. {missing:?}",
        acked.difference(&unique).count()
    );
}

#[test]
fn bytes_past_the_committed_end_are_cut_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("n1");
    let mut n = Node::start(bin(), &data, &[]);
    for i in 0..20 {
        let a = n.post("/api/v1/push", &json!({"items": [{"queue": "torn", "partition": "p", "transactionId": format!("t{i}"), "payload": i}]}));
        assert_eq!(a.status, 200);
    }
    n.sigterm(Duration::from_secs(40));
    // A torn append: garbage after the last record, as a crash in the middle of a write leaves.
    let seg_dir = data.join("state").join("segments");
    let last = std::fs::read_dir(&seg_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .expect("a segment file");
    let size = std::fs::metadata(&last).unwrap().len();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&last)
            .unwrap();
        f.write_all(&[0xAB; 777]).unwrap();
    }
    n.restart();
    assert_eq!(
        std::fs::metadata(&last).unwrap().len(),
        size,
        "the torn tail was cut back"
    );
    let seen = drain(&n, "torn");
    assert_eq!(seen.len(), 20);
    // And the node appends after the cut as before.
    let a = n.post("/api/v1/push", &json!({"items": [{"queue": "torn", "partition": "p", "transactionId": "after", "payload": 1}]}));
    assert_eq!(a.json[0]["status"], "queued");
    assert_eq!(drain(&n, "torn").len(), 1);
}

#[test]
fn ten_thousand_partitions_keep_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let n = Node::start(bin(), &dir.path().join("n1"), &[]);
    let parts = 10_000;
    for chunk in 0..parts / 500 {
        let items: Vec<Value> = (0..500)
            .map(|i| {
                let p = chunk * 500 + i;
                json!({"queue": "wide", "partition": format!("p{p}"), "transactionId": format!("t{p}"), "payload": {"p": p}})
            })
            .collect();
        let a = n.post("/api/v1/push", &json!({ "items": items }));
        assert_eq!(a.status, 200, "{}", a.text);
    }
    // Every partition answers with its one message.
    let mut per_partition: BTreeMap<String, usize> = BTreeMap::new();
    for (t, _) in drain(&n, "wide") {
        *per_partition.entry(t).or_default() += 1;
    }
    assert_eq!(per_partition.len(), parts);
    assert!(per_partition.values().all(|c| *c == 1));
    let rss = peak_rss_kib(n.pid().unwrap());
    eprintln!("peak RSS with {parts} partitions: {} MiB", rss / 1024);
    assert!(
        rss < 400 * 1024,
        "peak RSS {rss} KiB with {parts} partitions"
    );
}
