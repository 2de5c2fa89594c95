//! A full disk under a three-node cluster: one node's data directory is a small tmpfs that
//! something else fills to the last byte while a producer pushes through the cluster. The other
//! two keep a majority and take the writes; the node on the full disk must neither lose nor
//! corrupt anything, and once space comes back it must catch up and serve the same log. The
//! checker then reads the partition from every node: every acknowledged write once, in order.
//!
//! Needs root (it mounts the tmpfs); elsewhere it prints a SKIPPED line and passes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use queen_tests::{Node, Tmpfs, eventually, or_skip, partition_txns, post_url_within, three_nodes};
use serde_json::{Value, json};

const QUEUE: &str = "disk";
const PARTITION: &str = "p";
/// The small disk's size.
const DISK_MIB: u64 = 96;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Pushes `d0000000`, `d0000001`, ... (1 KiB payloads) one at a time, each retried with the
/// same transactionId on the other URL until one acknowledges it, until `stop`.
fn produce(urls: &[String], stop: &AtomicBool, acked: &Mutex<Vec<String>>) {
    let payload = "x".repeat(1024);
    let mut at = 0;
    for k in 0..1_000_000_u64 {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let txn = format!("d{k:07}");
        let body = json!({"items": [{"queue": QUEUE, "partition": PARTITION, "transactionId": txn, "payload": {"k": k, "pad": payload}}]}).to_string();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let url = &urls[at % urls.len()];
            let ok = post_url_within(&format!("{url}/api/v1/push"), &body, Duration::from_secs(2))
                .ok()
                .filter(|(s, _)| *s == 200)
                .and_then(|(_, t)| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| matches!(v[0]["status"].as_str(), Some("queued" | "duplicate")));
            if ok {
                acked.lock().unwrap().push(txn);
                break;
            }
            assert!(Instant::now() < until, "{txn} not acknowledged within 30 s");
            at += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Fills the file system holding `dir` with a file of zeros until it is full; the file.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0_u8; 1 << 20];
    for _ in 0..(DISK_MIB * 2) {
        if f.write_all(&chunk).and_then(|()| f.sync_data()).is_err() {
            break;
        }
    }
    // The last bytes, in smaller pieces.
    for _ in 0..4096 {
        if f.write_all(&chunk[..4096])
            .and_then(|()| f.sync_data())
            .is_err()
        {
            break;
        }
    }
    path
}

/// The last 40 lines of a node's log.
fn tail(n: &Node) -> String {
    let log = n.log_text();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Makes node 3 the leader (`on` true) or a follower, by SIGTERM to the leader (which hands
/// leadership to the most caught-up follower, the higher id on a tie) and a start again; the
/// leader's id.
fn lead_with(nodes: &mut [Node], on: bool) -> u64 {
    for _ in 0..6 {
        let mut leader = 0;
        assert!(
            eventually(Duration::from_secs(30), || {
                leader = nodes[0]
                    .leader_id()
                    .or_else(|| nodes[1].leader_id())
                    .unwrap_or(0);
                (1..=3).contains(&leader)
            }),
            "no leader"
        );
        if (leader == 3) == on {
            return leader;
        }
        let i = usize::try_from(leader - 1).unwrap_or(0);
        nodes[i].sigterm(Duration::from_secs(30));
        nodes[i].launch();
        nodes[i].wait_healthy(Duration::from_secs(60));
    }
    panic!(
        "node 3 could not be made {}",
        if on { "the leader" } else { "a follower" }
    );
}

#[test]
fn a_node_whose_disk_fills_loses_nothing_and_catches_up_when_space_returns() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(mount) = or_skip(
        Tmpfs::mount(&dir.path().join("n3"), DISK_MIB),
        "full-disk fault test",
        "needs root to mount a tmpfs",
    ) else {
        return;
    };
    let mut nodes = three_nodes(bin(), dir.path(), "disk-faults", |_| Vec::new());
    let urls: Vec<String> = nodes.iter().map(|n| n.url("")).collect();
    let stop = AtomicBool::new(false);
    let acked = Mutex::new(Vec::new());
    let started = Instant::now();
    let step = |what: String| println!("{:>6.1} s  {what}", started.elapsed().as_secs_f64());
    step(format!("node 3's data directory is a {DISK_MIB} MiB tmpfs"));
    std::thread::scope(|s| {
        let producer = s.spawn(|| produce(&urls, &stop, &acked));
        let count = || acked.lock().unwrap().len();
        assert!(
            eventually(Duration::from_secs(30), || count() >= 50),
            "no warm-up writes"
        );
        for round in ["a follower", "the leader"] {
            let leader = lead_with(&mut nodes, round == "the leader");
            step(format!("node 3 is {round} (leader {leader})"));
            let filler = fill(&mount.dir);
            let before = count();
            step(format!(
                "node 3's disk full ({} MiB of filler), {before} writes so far",
                std::fs::metadata(&filler).map_or(0, |m| m.len() >> 20)
            ));
            let went_on = eventually(Duration::from_secs(60), || count() >= before + 200);
            // A node that can no longer write stops (fail-stop), rather than answer 503 for
            // ever with a raft core that stopped.
            let exited = nodes[2].wait_exit(Duration::from_secs(30));
            step(format!(
                "under the full disk: {} more writes; node 3 {}",
                count() - before,
                exited.map_or_else(|| "still running".to_owned(), |e| format!("stopped ({e})"))
            ));
            std::fs::remove_file(&filler).expect("remove the filler");
            assert!(went_on, "writes stopped while {round}'s disk was full");
            let exited = exited.unwrap_or_else(|| {
                panic!(
                    "node 3 neither stopped nor served 30 s after its disk filled:\n{}",
                    tail(&nodes[2])
                )
            });
            assert!(
                !exited.success(),
                "a node that stops on a full disk says so by its exit status"
            );
            // What a supervisor (systemd's Restart=on-failure, Kubernetes) does.
            nodes[2].launch();
            step("space back; node 3 started again on its data".into());
            let healthy = eventually(Duration::from_secs(60), || {
                queen_tests::try_get_url(&nodes[2].url("/health"), Duration::from_secs(2))
                    .is_ok_and(|(s, _)| s == 200)
            });
            assert!(
                healthy,
                "node 3 unhealthy 60 s after it started again:\n{}",
                tail(&nodes[2])
            );
            let more = count();
            assert!(
                eventually(Duration::from_secs(30), || count() >= more + 50),
                "no writes after {round}'s disk came back"
            );
            step(format!("node 3 healthy, {} writes so far", count()));
        }
        stop.store(true, Ordering::SeqCst);
        producer.join().expect("producer");
    });
    let want = acked.into_inner().unwrap();
    let mut reads = Vec::new();
    let same = eventually(Duration::from_secs(30), || {
        reads = nodes
            .iter()
            .map(|n| partition_txns(n, QUEUE, PARTITION).unwrap_or_default())
            .collect();
        reads.iter().all(|r| *r == want)
    });
    let lens: Vec<usize> = reads.iter().map(Vec::len).collect();
    for n in &mut nodes {
        n.kill9();
    }
    assert!(
        same,
        "every node must hold exactly the {} acknowledged writes in order: {lens:?}",
        want.len()
    );
    println!("{} acknowledged writes on every node, in order", want.len());
}
