//! Starting the queen cluster and the `--floor` server: processes, ports, and waiting until a
//! leader answers.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_bench::load::{Proc, Procs};

use super::{Floor, Queen, TOKEN};
use crate::{Target, free_port, http_client};

/// Three queen nodes with their own ports and directories, the same peer list and token;
/// waits until every node's /health answers 200 and finds the leader.
pub(crate) async fn start_queen(bin: &Path, dir: &Path) -> Result<Queen, String> {
    Ok(start_cluster(bin, dir, &[]).await?.0)
}

/// How to start each node of a cluster again (after a kill): its binary, ports, peers, data
/// directory and settings.
pub(super) struct Spawner {
    bin: std::path::PathBuf,
    dir: std::path::PathBuf,
    http: Vec<u16>,
    peers: String,
    extra: Vec<(String, String)>,
}

impl Spawner {
    /// Start node `i` (0-based), its log appended to `queen-<i+1>.log` in the run's directory.
    pub(super) fn spawn(&self, i: usize) -> Result<Proc, String> {
        let data = self.dir.join(format!("queen-{}", i + 1));
        let log = self.dir.join(format!("queen-{}.log", i + 1));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        cmd.env("PORT", self.http[i].to_string())
            .env("HOST", "127.0.0.1")
            .env("QUEEN_RAFT_DIR", &data)
            .env("QUEEN_RAFT_NODE_ID", (i + 1).to_string())
            .env("QUEEN_RAFT_PEERS", &self.peers)
            .env("QUEEN_RAFT_TOKEN", TOKEN)
            // The disk gate counts the whole file system, which other work on a shared machine
            // fills too; the bench's stores need a few GB (`backlog` checks the free space).
            .env("QUEEN_RAFT_DISK_HIGH_PCT", "97")
            .env("RUST_LOG", "warn");
        for (k, v) in &self.extra {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {e} (build it with cargo build --release -p queen)",
                    self.bin.display()
                )
            })?;
        Ok(Proc {
            name: format!("queen node {}", i + 1),
            child,
            log: Some(log),
        })
    }
}

/// Start the three nodes and wait for them (see [`start_queen`]).
pub(super) async fn start_cluster(
    bin: &Path,
    dir: &Path,
    extra: &[(String, String)],
) -> Result<(Queen, Spawner), String> {
    start_cluster_spaced(bin, dir, extra, 1).await
}

/// [`start_cluster`] with each raft port followed by `span - 1` free ports (a node with
/// `QUEEN_RAFT_GROUPS=span` listens on its raft port plus each group's number).
pub(super) async fn start_cluster_spaced(
    bin: &Path,
    dir: &Path,
    extra: &[(String, String)],
    span: u16,
) -> Result<(Queen, Spawner), String> {
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
    let raft: Vec<u16> = (0..3).map(|_| free_ports(span)).collect::<Result<_, _>>()?;
    let peers = (0..3)
        .map(|i| format!("{}=127.0.0.1:{}/127.0.0.1:{}", i + 1, raft[i], http[i]))
        .collect::<Vec<_>>()
        .join(",");
    let spawner = Spawner {
        bin: bin.to_path_buf(),
        dir: dir.to_path_buf(),
        http: http.clone(),
        peers,
        extra: extra.to_vec(),
    };
    let mut procs = Procs::default();
    for i in 0..3 {
        procs.0.push(spawner.spawn(i)?);
    }
    let leader = wait_healthy(&mut procs, &http).await?;
    Ok((
        Queen {
            procs,
            ports: http,
            leader,
        },
        spawner,
    ))
}

/// `span` free loopback ports in a row: the first (bounded search).
fn free_ports(span: u16) -> Result<u16, String> {
    for _ in 0..200 {
        let first = free_port()?;
        if (1..span).all(|i| {
            first
                .checked_add(i)
                .is_some_and(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        }) {
            return Ok(first);
        }
    }
    Err(format!("no {span} free ports in a row"))
}

/// Wait (60 s at most) until all three nodes answer /health with 200 and one is the leader;
/// answers the leader's index.
pub(super) async fn wait_healthy(procs: &mut Procs, http: &[u16]) -> Result<usize, String> {
    let t = Target::new(http_client(), http);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = procs.exited() {
            return Err(e);
        }
        let mut healthy = 0;
        let mut leader = None;
        for i in 0..3 {
            if let Ok((200, body)) = t.call_at(i, "GET", "/health", None).await {
                healthy += 1;
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if v["raft"]["role"] == "leader" {
                    leader = Some(i as usize);
                }
            }
        }
        if let (3, Some(leader)) = (healthy, leader) {
            return Ok(leader);
        }
        if Instant::now() > until {
            return Err(format!(
                "the queen cluster was not healthy within 60 s ({healthy} of 3 nodes healthy)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The no-op push server (this binary's hidden `noop-server` command) on a free port; waits
/// until it answers an empty push.
pub(super) async fn start_floor(dir: &Path) -> Result<Floor, String> {
    let port = free_port()?;
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let log = dir.join("floor.log");
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let child = Command::new(&exe)
        .args(["noop-server", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {} noop-server: {e}", exe.display()))?;
    let mut procs = Procs(vec![Proc {
        name: "floor (noop-server)".into(),
        child,
        log: Some(log),
    }]);
    let target = Arc::new(Target::new(http_client(), &[port]));
    let until = Instant::now() + Duration::from_secs(10);
    while !matches!(
        target
            .call("POST", "/api/v1/push", Some(r#"{"items":[]}"#.into()))
            .await,
        Ok((200, _))
    ) {
        if let Some(e) = procs.exited() {
            return Err(e);
        }
        if Instant::now() > until {
            return Err("the floor server did not answer within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Floor { procs, target })
}
