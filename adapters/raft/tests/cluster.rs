//! Three raft nodes in one process on loopback ports, talking over the raft port: election,
//! forwarding of proposals from followers, follower read barriers, the shared token, leader
//! hand-off on shutdown, and a restarted node catching up.

#[path = "common/mem_backend.rs"]
mod mem_backend;

use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use futures::StreamExt;
use mem_backend::MemBackend;
use mem_backend::response_for;
use queen_ports::ProposeError;
use queen_ports::ReplicatedLog;
use queen_raft::Peer;
use queen_raft::RaftNode;
use queen_raft::RaftNodeConfig;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

const TOKEN: &str = "test-raft-token-0123456789";

/// Free loopback ports: bind port 0, note the port, release it.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

fn peers(ports: &[u16]) -> Vec<Peer> {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| Peer {
            id: i as u64 + 1,
            raft_addr: format!("127.0.0.1:{p}"),
            http_addr: format!("127.0.0.1:{}", 1 + i),
        })
        .collect()
}

fn config(id: u64, dir: &std::path::Path, peers: &[Peer], token: &str) -> RaftNodeConfig {
    let mut c = RaftNodeConfig::single(id, dir.to_path_buf());
    c.peers = peers.to_vec();
    c.token = Some(token.to_string());
    c.heartbeat_ms = 100;
    c.election_min_ms = 1000;
    c.election_max_ms = 2000;
    c
}

/// A cluster under test: nodes (None when stopped), their backends and directories.
struct Cluster {
    nodes: Vec<Option<RaftNode>>,
    backends: Vec<Arc<MemBackend>>,
    cfgs: Vec<RaftNodeConfig>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Cluster {
    async fn start(tokens: [&str; 3]) -> Cluster {
        Self::start_with(tokens, |_| {}).await
    }

    async fn start_with(tokens: [&str; 3], tune: impl Fn(&mut RaftNodeConfig)) -> Cluster {
        let ports = free_ports(3);
        let peers = peers(&ports);
        let dirs: Vec<_> = (0..3)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let cfgs: Vec<_> = (0..3)
            .map(|i| {
                let mut c = config(i as u64 + 1, dirs[i].path(), &peers, tokens[i]);
                tune(&mut c);
                c
            })
            .collect();
        let backends: Vec<_> = (0..3).map(|_| Arc::new(MemBackend::new())).collect();
        let starts = (0..3).map(|i| {
            let cfg = cfgs[i].clone();
            let b = backends[i].clone();
            async move { RaftNode::start(cfg, b).await.expect("start") }
        });
        let nodes = futures::future::join_all(starts).await;
        Cluster {
            nodes: nodes.into_iter().map(Some).collect(),
            backends,
            cfgs,
            _dirs: dirs,
        }
    }

    fn node(&self, id: u64) -> &RaftNode {
        self.nodes[id as usize - 1].as_ref().expect("node running")
    }

    /// Wait until every running node (among `ids`) knows the same leader, itself among `ids`.
    async fn agreed_leader(&self, ids: &[u64], within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let leaders: Vec<_> = ids
                .iter()
                .map(|i| self.node(*i).progress().leader)
                .collect();
            if let Some(Some(l)) = leaders.first()
                && leaders.iter().all(|x| *x == Some(*l))
                && ids.contains(l)
            {
                return *l;
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader among {ids:?} within {within:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop_all(&mut self) {
        for n in self.nodes.iter_mut() {
            if let Some(n) = n.take() {
                n.shutdown().await.expect("shutdown");
            }
        }
    }
}

fn commands(tag: &str, from: usize, to: usize) -> Vec<Vec<u8>> {
    (from..to)
        .map(|i| format!("{tag}-{i}").into_bytes())
        .collect()
}

/// Propose every command through `node`, 16 in flight; retry the retryable errors (bounded).
async fn propose_all(node: &RaftNode, cmds: Vec<Vec<u8>>) {
    let results: Vec<_> = futures::stream::iter(cmds)
        .map(|c| async move {
            let mut last = None;
            for _ in 0..100 {
                match node.propose(c.clone()).await {
                    Ok(r) => return (c, Ok(r)),
                    Err(e @ (ProposeError::NotLeader { .. } | ProposeError::Unavailable(_))) => {
                        last = Some(e);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return (c, Err(e)),
                }
            }
            (c, Err(last.expect("an error")))
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for (c, r) in results {
        let got = r.unwrap_or_else(|e| panic!("propose failed: {e}"));
        assert_eq!(got.into_bytes(), response_for(&c));
    }
}

/// Wait until every backend in `ids` holds the same applied commands, at least `min` of them.
async fn same_state(c: &Cluster, ids: &[u64], min: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let states: Vec<_> = ids
            .iter()
            .map(|i| c.backends[*i as usize - 1].state().applied)
            .collect();
        if states[0].len() >= min && states.iter().all(|s| *s == states[0]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nodes {ids:?} did not converge: applied counts {:?}",
            states.iter().map(Vec::len).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_elect_forward_from_a_follower_and_read_on_followers() {
    let mut c = Cluster::start([TOKEN; 3]).await;
    let leader = c.agreed_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let followers: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    eprintln!("leader {leader}, followers {followers:?}");

    let started = Instant::now();
    propose_all(c.node(followers[0]), commands("via-follower", 0, 200)).await;
    eprintln!("200 forwarded proposals in {:?}", started.elapsed());
    // A forwarded proposal returns once the follower applied it.
    assert!(c.backends[followers[0] as usize - 1].state().applied.len() >= 200);

    // A read barrier on the other follower sees everything written before it.
    let other = followers[1];
    propose_all(c.node(leader), commands("via-leader", 0, 1)).await;
    c.node(other).read_barrier().await.expect("read barrier");
    let seen = c.backends[other as usize - 1].state().applied;
    assert!(
        seen.iter().any(|(_, cmd)| cmd == b"via-leader-0"),
        "the follower read barrier did not see the last write"
    );
    assert!(seen.len() >= 201);

    same_state(&c, &[1, 2, 3], 201, Duration::from_secs(20)).await;
    let p: Vec<_> = (1..=3).map(|i| c.node(i).progress().applied).collect();
    eprintln!("applied per node: {p:?}");

    // An explicit hand-off moves leadership to another voter.
    let (to, ms) = c
        .node(leader)
        .transfer_leadership()
        .await
        .expect("leadership handed off");
    assert_ne!(to, leader);
    eprintln!("handed off to {to} in {ms} ms");
    assert_eq!(
        c.agreed_leader(&[1, 2, 3], Duration::from_secs(10)).await,
        to
    );
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_token_is_refused_and_the_others_still_elect() {
    let mut c = Cluster::start([TOKEN, TOKEN, "not-the-token"]).await;
    let leader = c.agreed_leader(&[1, 2], Duration::from_secs(20)).await;
    assert_ne!(leader, 3);
    propose_all(c.node(leader), commands("w", 0, 20)).await;
    same_state(&c, &[1, 2], 20, Duration::from_secs(10)).await;

    // Node 3 cannot join: it refuses the leader's token and the others refuse its.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p3 = c.node(3).progress();
    assert_eq!(p3.applied, 0, "node 3 with the wrong token applied entries");
    assert!(c.backends[2].state().applied.is_empty());

    // A raw request with a wrong token gets 401.
    let addr = c.cfgs[0].peers[0].raft_addr.clone();
    for (token, expect) in [("wrong", "401"), ("", "401")] {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let header = if token.is_empty() {
            String::new()
        } else {
            format!("x-queen-raft-token: {token}\r\n")
        };
        let req = format!(
            "POST /raft/vote HTTP/1.1\r\nhost: {addr}\r\n{header}content-length: 0\r\nconnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("answer in time")
            .expect("read");
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {expect}")),
            "unexpected answer: {text}"
        );
    }
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_shutdown_hands_off_and_a_restarted_node_catches_up() {
    let mut c = Cluster::start([TOKEN; 3]).await;
    let old = c.agreed_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let rest: Vec<u64> = (1..=3).filter(|i| *i != old).collect();
    propose_all(c.node(rest[0]), commands("before", 0, 50)).await;

    // Stop the leader: it hands leadership to a follower first.
    let stopped = Instant::now();
    let node = c.nodes[old as usize - 1].take().expect("leader node");
    node.shutdown().await.expect("shutdown leader");
    drop(node);
    let new = c.agreed_leader(&rest, Duration::from_secs(8)).await;
    let took = stopped.elapsed();
    eprintln!("leader {old} stopped, {new} leads after {took:?}");
    assert!(took < Duration::from_secs(8), "failover took {took:?}");

    // The remaining two keep committing, through either of them.
    propose_all(c.node(rest[0]), commands("after", 0, 30)).await;
    propose_all(c.node(rest[1]), commands("after2", 0, 30)).await;
    same_state(&c, &rest, 110, Duration::from_secs(10)).await;

    // Restart the stopped node on its directory (its state as it was on disk).
    let i = old as usize - 1;
    let backend = Arc::new(MemBackend::from_state(c.backends[i].state()));
    c.backends[i] = backend.clone();
    let restarted = RaftNode::start(c.cfgs[i].clone(), backend)
        .await
        .expect("restart");
    c.nodes[i] = Some(restarted);
    let target = c.node(new).progress().applied;
    assert!(
        c.node(old)
            .wait_applied(target, Duration::from_secs(20))
            .await,
        "restarted node did not catch up to {target}"
    );
    same_state(&c, &[1, 2, 3], 110, Duration::from_secs(20)).await;
    propose_all(c.node(old), commands("rejoined", 0, 10)).await;
    same_state(&c, &[1, 2, 3], 120, Duration::from_secs(20)).await;
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_node_catches_up_by_snapshot() {
    let mut c = Cluster::start_with([TOKEN; 3], |cfg| cfg.snapshot_every_entries = 100).await;
    let leader = c.agreed_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let lagging = (1..=3).find(|i| *i != leader).expect("a follower");
    let live: Vec<u64> = (1..=3).filter(|i| *i != lagging).collect();

    let i = lagging as usize - 1;
    let node = c.nodes[i].take().expect("follower");
    node.shutdown().await.expect("shutdown follower");
    drop(node);

    // Far more than purge_batch_size (1024) plus the kept span: the leader purges what the
    // stopped node still needs.
    propose_all(c.node(leader), commands("bulk", 0, 3000)).await;
    same_state(&c, &live, 3000, Duration::from_secs(30)).await;
    // Snapshots and purges run in the background: wait until the leader purged past what the
    // stopped node has applied.
    let behind = c.backends[i].state().last_index.unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.node(leader).purged_index() <= behind {
        assert!(
            Instant::now() < deadline,
            "leader did not purge past {behind} (purged {})",
            c.node(leader).purged_index()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let backend = Arc::new(MemBackend::from_state(c.backends[i].state()));
    c.backends[i] = backend.clone();
    c.nodes[i] = Some(
        RaftNode::start(c.cfgs[i].clone(), backend.clone())
            .await
            .expect("restart"),
    );
    same_state(&c, &[1, 2, 3], 3000, Duration::from_secs(30)).await;
    eprintln!(
        "snapshot installs on the lagging node: {}",
        backend.installs()
    );
    assert!(
        backend.installs() >= 1,
        "the lagging node caught up without a snapshot (log not purged?)"
    );
    propose_all(c.node(lagging), commands("after-snapshot", 0, 10)).await;
    same_state(&c, &[1, 2, 3], 3010, Duration::from_secs(20)).await;
    c.stop_all().await;
}
