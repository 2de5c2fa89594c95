//! A single raft node end to end through the public API: concurrent proposals with group
//! commit, linearizable read barrier, restart with re-apply from the log, snapshots, config
//! validation, and errors after shutdown.

#[path = "common/mem_backend.rs"]
mod mem_backend;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mem_backend::MemBackend;
use mem_backend::MemState;
use mem_backend::response_for;
use queen_ports::ProposeError;
use queen_ports::RaftRole;
use queen_ports::ReplicatedLog;
use queen_raft::Peer;
use queen_raft::RaftNode;
use queen_raft::RaftNodeConfig;
use queen_raft::RaftStartError;

const IN_FLIGHT: usize = 64;

async fn propose_all(node: &RaftNode, commands: Vec<Vec<u8>>) {
    let results: Vec<_> = futures::stream::iter(commands)
        .map(|c| async move {
            let r = node.propose(c.clone()).await;
            (c, r)
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for (c, r) in results {
        let got = r.unwrap_or_else(|e| panic!("propose failed: {e}"));
        assert_eq!(got.into_bytes(), response_for(&c), "wrong response");
    }
}

fn commands(from: usize, to: usize) -> Vec<Vec<u8>> {
    (from..to)
        .map(|i| format!("command-{i}").into_bytes())
        .collect()
}

fn command_set(state: &MemState) -> BTreeSet<Vec<u8>> {
    state.applied.iter().map(|(_, c)| c.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_group_commit_and_restart_reapplies_from_log() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = RaftNodeConfig::single(1, tmp.path().to_path_buf());

    let backend = Arc::new(MemBackend::new());
    let node = RaftNode::start(cfg.clone(), backend.clone())
        .await
        .expect("start");
    let p = node.progress();
    assert_eq!(p.role, RaftRole::Leader);
    assert_eq!(p.leader, Some(1));
    assert!(p.storage_ready);

    let fsyncs_before = node.fsync_count();
    propose_all(&node, commands(0, 1000)).await;
    let fsyncs = node.fsync_count() - fsyncs_before;
    eprintln!("1000 proposals, {IN_FLIGHT} in flight: {fsyncs} fsyncs");
    assert!(fsyncs >= 1, "appends must be fsynced");
    assert!(
        fsyncs < 300,
        "group commit expected, got {fsyncs} fsyncs for 1000 proposals"
    );

    node.read_barrier().await.expect("read barrier");
    let p = node.progress();
    assert!(p.applied >= 1000, "applied {}", p.applied);
    assert_eq!(p.applied, p.commit);
    assert_eq!(p.applied, p.last_log);

    let full = backend.state();
    assert_eq!(full.applied.len(), 1000);
    assert_eq!(command_set(&full), commands(0, 1000).into_iter().collect());
    let last_index = full.last_index.expect("applied something");
    node.shutdown().await.expect("shutdown");

    // The process dies before its last apply batches reached the state store: restart with the
    // state as it was a few batches earlier. The log must bring the rest back.
    let history = backend.history();
    assert!(
        history.len() >= 3,
        "expected several apply batches, got {}",
        history.len()
    );
    let stale = history[history.len() - 3].clone();
    let missing = full.applied.len() - stale.applied.len();
    assert!(missing > 0, "the stale state must lack some commands");

    let backend2 = Arc::new(MemBackend::from_state(stale));
    let node2 = RaftNode::start(cfg.clone(), backend2.clone())
        .await
        .expect("restart");
    assert!(
        node2
            .wait_applied(last_index, Duration::from_secs(10))
            .await,
        "restarted node did not re-apply up to {last_index}"
    );
    let recovered = backend2.state();
    assert_eq!(
        recovered.applied, full.applied,
        "re-applied state differs ({missing} were missing)"
    );
    assert!(backend2.apply_calls() > 0);

    // The restarted node keeps serving writes and reads.
    propose_all(&node2, commands(1000, 1010)).await;
    node2
        .read_barrier()
        .await
        .expect("read barrier after restart");
    assert_eq!(backend2.state().applied.len(), 1010);
    node2.shutdown().await.expect("shutdown");

    // After shutdown the node refuses work with a retryable error.
    match node2.propose(b"late".to_vec()).await {
        Err(ProposeError::Unavailable(_)) => {}
        other => panic!("expected unavailable after shutdown, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_persist_the_backend_and_restart_works() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = RaftNodeConfig::single(7, tmp.path().to_path_buf());
    cfg.snapshot_every_entries = 100;

    let backend = Arc::new(MemBackend::new());
    let node = RaftNode::start(cfg.clone(), backend.clone())
        .await
        .expect("start");
    propose_all(&node, commands(0, 450)).await;
    // Snapshot building runs in the background; wait on the condition, not a fixed time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while backend.persists() < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no snapshots were built"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("snapshots built (backend persists): {}", backend.persists());
    node.shutdown().await.expect("shutdown");

    let state = backend.state();
    let backend2 = Arc::new(MemBackend::from_state(state.clone()));
    let node2 = RaftNode::start(cfg, backend2.clone())
        .await
        .expect("restart");
    propose_all(&node2, commands(450, 460)).await;
    let after = backend2.state();
    assert_eq!(after.applied.len(), 460);
    assert_eq!(&after.applied[..450], &state.applied[..]);
    node2.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn bad_configs_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = RaftNodeConfig::single(1, tmp.path().to_path_buf());

    let mut c = base.clone();
    c.election_max_ms = c.election_min_ms;
    assert!(matches!(
        RaftNode::start(c, Arc::new(MemBackend::new())).await,
        Err(RaftStartError::Config(_))
    ));

    let mut c = base.clone();
    c.heartbeat_ms = 600;
    assert!(
        c.validate().is_err(),
        "heartbeat must stay below half the election timeout"
    );

    let mut c = base.clone();
    c.peers = vec![Peer {
        id: 2,
        raft_addr: "127.0.0.1:1".into(),
        http_addr: "127.0.0.1:2".into(),
    }];
    assert!(c.validate().is_err(), "this node must be among its peers");

    let mut c = base.clone();
    c.peers = (1..=3)
        .map(|id| Peer {
            id,
            raft_addr: format!("127.0.0.1:{id}"),
            http_addr: format!("127.0.0.1:{}", id + 100),
        })
        .collect();
    assert!(
        c.validate().is_err(),
        "several voters without a raft token must be refused"
    );
    c.token = Some("t0ken".into());
    assert!(c.validate().is_ok());
    c.peers[1].raft_addr.clear();
    assert!(c.validate().is_err(), "every peer needs a raft address");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_in_use_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = RaftNodeConfig::single(1, tmp.path().to_path_buf());
    let node = RaftNode::start(cfg.clone(), Arc::new(MemBackend::new()))
        .await
        .expect("start");
    let second = RaftNode::start(cfg, Arc::new(MemBackend::new())).await;
    assert!(matches!(second, Err(RaftStartError::LogStore { .. })));
    node.shutdown().await.expect("shutdown");
}
