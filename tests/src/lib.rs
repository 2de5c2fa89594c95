//! queen-tests: a harness for black-box tests. It starts the real `queen` binary on a free
//! loopback port with its own data directory, waits for `/health`, talks HTTP/JSON to it, and
//! stops it by SIGTERM or SIGKILL (by PID). Every wait is bounded.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod linearizable;
pub mod netdelay;
pub mod netns;
pub mod proxy;
pub mod s3;
pub mod sink;

/// Every file under `dir`, recursively (absolute paths; unreadable directories are skipped).
#[must_use]
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The files under `dir` (recursively) whose bytes contain `needle` anywhere: how the
/// encryption tests show that no data file holds a payload in clear.
#[must_use]
pub fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)))
        .collect()
}

/// A free loopback port (bound, then released), taken below the kernel's ephemeral range
/// (32768-60999 on Linux). A port the kernel hands out for `:0` can be given again to any
/// outgoing connection between the moment we release it and the moment a node binds it (a CI
/// run lost a raft port that way); ports below the range are only ever taken by an explicit
/// bind. Each test process walks the range from its own starting point, and checks every port
/// by binding it.
#[must_use]
pub fn free_port() -> u16 {
    free_ports(1)
}

/// `span` free loopback ports in a row, taken as [`free_port`] takes one (a node with
/// `QUEEN_RAFT_GROUPS=span` listens on its raft port plus each group's number): the first.
///
/// # Panics
/// When the range holds no such run.
#[must_use]
#[allow(
    clippy::disallowed_methods,
    reason = "a seed for port choice, not a time any rule reads"
)]
pub fn free_ports(span: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 12_000;
    const SPAN: u32 = 20_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let seed = std::process::id().wrapping_mul(7_919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    let _ = NEXT.compare_exchange(u32::MAX, seed % SPAN, Ordering::SeqCst, Ordering::SeqCst);
    let span32 = u32::from(span.max(1));
    for _ in 0..SPAN {
        // The whole run is taken from the counter at once, so concurrent callers never share a
        // port of it.
        let n = NEXT.fetch_add(span32, Ordering::SeqCst) % SPAN;
        if n + span32 > SPAN {
            continue;
        }
        let first = LOW + n;
        if (first..first + span32)
            .all(|p| TcpListener::bind(("127.0.0.1", u16::try_from(p).unwrap_or(0))).is_ok())
        {
            return u16::try_from(first).expect("the range fits a port");
        }
    }
    assert!(span <= 1, "no {span} free ports in a row");
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// An HTTP answer: status, parsed JSON (Null when the body was empty or not JSON), headers we
/// look at, and the raw text.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Parsed body.
    pub json: Value,
    /// Raw body.
    pub text: String,
    /// `retry-after`, when present.
    pub retry_after: Option<String>,
    /// `content-type`, when present.
    pub content_type: Option<String>,
}

/// A running node.
pub struct Node {
    bin: PathBuf,
    /// Data directory (kept across restarts).
    pub dir: PathBuf,
    /// Client port.
    pub port: u16,
    env: Vec<(String, String)>,
    child: Option<Child>,
    agent: ureq::Agent,
    log: PathBuf,
    /// The address it listens on and is reached at (127.0.0.1 unless in a namespace).
    host: String,
    /// The network namespace it runs in (`netns::Net`), when not the test's own.
    netns: Option<PathBuf>,
}

impl Node {
    /// Start a node with `env` on a fresh port in `dir`, and wait until it is healthy.
    ///
    /// # Panics
    /// When it does not become healthy within 30 s.
    pub fn start(bin: &Path, dir: &Path, env: &[(&str, &str)]) -> Node {
        let mut node = Node::prepare(bin, dir, free_port(), env);
        node.spawn();
        node
    }

    /// A node that is configured but not started (`launch` starts it without waiting), for
    /// clusters whose members only become healthy together.
    #[must_use]
    pub fn prepare(bin: &Path, dir: &Path, port: u16, env: &[(&str, &str)]) -> Node {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(90)))
            .build()
            .into();
        Node {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            port,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            child: None,
            agent,
            log: dir.with_extension("log"),
            host: "127.0.0.1".to_owned(),
            netns: None,
        }
    }

    /// Run in the network namespace named by `ns` (a `netns::Net` node's), listening on `host`,
    /// from the next start on; the test reaches it from `Net::as_client`.
    pub fn in_netns(&mut self, ns: PathBuf, host: &str) {
        self.netns = Some(ns);
        host.clone_into(&mut self.host);
    }

    /// Set (or replace) an environment variable for the next start.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// An environment variable this node is started with.
    #[must_use]
    pub fn env_value(&self, key: &str) -> Option<String> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    /// Start the process without waiting for health.
    pub fn launch(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.spawn_process();
    }

    fn spawn(&mut self) {
        self.spawn_process();
        self.wait_healthy(Duration::from_secs(30));
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "test harness: the PATH and log filter handed to the node under test"
    )]
    fn spawn_process(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PORT", self.port.to_string())
            .env("HOST", &self.host)
            .env("QUEEN_RAFT_DIR", &self.dir)
            // QUEEN_NODE_LOG sets the nodes' log filter for a post-mortem (for example
            // `info,openraft=debug`).
            .env(
                "RUST_LOG",
                std::env::var("QUEEN_NODE_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            // The test machine's disk is shared with other builds: the gate (85% by default)
            // would answer 507 for reasons that have nothing to do with the test. The disk-gate
            // test sets its own threshold, which replaces this one.
            .env("QUEEN_RAFT_DISK_HIGH_PCT", "100")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        // Opened here, entered in the child between fork and exec (the file closes at exec).
        let ns = self
            .netns
            .as_ref()
            .map(|p| std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())));
        if let Some(f) = &ns {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = f.as_raw_fd();
            // SAFETY: only the setns system call runs between fork and exec.
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(move || netns::setns_fd(fd));
            }
        }
        self.child = Some(cmd.spawn().expect("spawn queen"));
    }

    /// Wait until `/health` answers 200.
    ///
    /// # Panics
    /// On timeout, with the node's log.
    pub fn wait_healthy(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("queen exited early with {status}:\n{}", self.log_text());
            }
            if let Ok(a) = self.try_request("GET", "/health", None)
                && a.status == 200
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "queen did not become healthy within {limit:?}:\n{}",
            self.log_text()
        );
    }

    /// The node's log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Send the signal `sig` (as `kill` takes it: `-STOP`, `-CONT`, ...) to the running process.
    ///
    /// # Panics
    /// When the node is not running or `kill` fails.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("a running node").to_string();
        assert!(
            Command::new("kill")
                .args([sig, &pid])
                .status()
                .expect("kill")
                .success(),
            "kill {sig} {pid}"
        );
    }

    /// PID of the running process.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process was started and has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The leader this node names on a 200 `/health` (within 2 s), if any.
    #[must_use]
    pub fn leader_id(&self) -> Option<u64> {
        let (status, text) = try_get_url(&self.url("/health"), Duration::from_secs(2)).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        (status == 200).then(|| v["raft"]["leaderId"].as_u64())?
    }

    /// The URL of `path` on this node.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.host, self.port)
    }

    /// One request; transport errors are returned.
    ///
    /// # Errors
    /// Connection failures.
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Answer, String> {
        self.try_request_with(method, path, body, &[])
    }

    /// One request with extra headers; transport errors are returned.
    ///
    /// # Errors
    /// Connection failures.
    pub fn try_request_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let url = self.url(path);
        let with = |mut r: ureq::RequestBuilder<ureq::typestate::WithoutBody>| {
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r
        };
        let with_body = |mut r: ureq::RequestBuilder<ureq::typestate::WithBody>| {
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r
        };
        let resp = match (method, body) {
            ("GET", _) => with(self.agent.get(&url)).call(),
            ("DELETE", _) => with(self.agent.delete(&url)).call(),
            ("POST", Some(b)) => with_body(self.agent.post(&url))
                .header("content-type", "application/json")
                .send(b),
            ("POST", None) => with_body(self.agent.post(&url)).send_empty(),
            ("PUT", Some(b)) => with_body(self.agent.put(&url))
                .header("content-type", "application/json")
                .send(b),
            _ => return Err(format!("unsupported {method}")),
        };
        let mut resp = resp.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (retry_after, content_type) = (header("retry-after"), header("content-type"));
        let mut text = String::new();
        resp.body_mut()
            .as_reader()
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Answer {
            status,
            json,
            text,
            retry_after,
            content_type,
        })
    }

    /// An admin request (membership changes): carries this node's raft token in
    /// `x-queen-raft-token`, as an operator's curl does.
    ///
    /// # Panics
    /// On a transport error.
    pub fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        let token = self.env_value("QUEEN_RAFT_TOKEN").unwrap_or_default();
        let text = body.map(Value::to_string);
        self.try_request_with(
            method,
            path,
            text.as_deref(),
            &[("x-queen-raft-token", &token)],
        )
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// A request that must reach the node.
    ///
    /// # Panics
    /// On a transport error.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Answer {
        self.try_request(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// GET.
    pub fn get(&self, path: &str) -> Answer {
        self.request("GET", path, None)
    }

    /// POST JSON.
    pub fn post(&self, path: &str, body: &Value) -> Answer {
        self.request("POST", path, Some(&body.to_string()))
    }

    /// POST raw text.
    pub fn post_raw(&self, path: &str, body: &str) -> Answer {
        self.request("POST", path, Some(body))
    }

    /// POST bytes with a content type (the binary bodies).
    ///
    /// # Panics
    /// On a transport error.
    pub fn post_bytes(&self, path: &str, content_type: &str, body: &[u8]) -> Answer {
        self.post_bytes_with(path, content_type, body, &[])
    }

    /// POST bytes with a content type and more headers.
    ///
    /// # Panics
    /// On a transport error.
    pub fn post_bytes_with(
        &self,
        path: &str,
        content_type: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut req = self
            .agent
            .post(&self.url(path))
            .header("content-type", content_type);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send(body);
        let mut resp = resp.unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (retry_after, answered_type) = (header("retry-after"), header("content-type"));
        let mut text = String::new();
        resp.body_mut()
            .as_reader()
            .read_to_string(&mut text)
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            status,
            json,
            text,
            retry_after,
            content_type: answered_type,
        }
    }

    /// Every transactionId stored in a partition, in offset order, read through this node with
    /// `/api/v1/fetch` (bounded at 10,000 pages).
    #[must_use]
    pub fn stored_ids(&self, queue: &str, partition: &str) -> Vec<String> {
        self.stored_ids_with(queue, partition, &[])
    }

    /// [`Node::stored_ids`] with more headers on each fetch (`x-queen-tenant`, say).
    ///
    /// # Panics
    /// When a fetch does not answer 200.
    #[must_use]
    pub fn stored_ids_with(
        &self,
        queue: &str,
        partition: &str,
        headers: &[(&str, &str)],
    ) -> Vec<String> {
        let mut out = Vec::new();
        let mut offset = 0u64;
        for _ in 0..10_000 {
            let body = serde_json::json!({"entries": [{"queue": queue, "partition": partition, "offset": offset}]}).to_string();
            let f = self
                .try_request_with("POST", "/api/v1/fetch", Some(&body), headers)
                .unwrap_or_else(|e| panic!("POST /api/v1/fetch: {e}"));
            assert_eq!(f.status, 200, "{}", f.text);
            let e = &f.json["entries"][0];
            let records = e["records"].as_array().cloned().unwrap_or_default();
            if records.is_empty() {
                break;
            }
            for r in &records {
                out.push(r["transactionId"].as_str().unwrap_or_default().to_owned());
                offset = r["offset"].as_u64().unwrap_or(offset) + 1;
            }
            if offset >= e["highWatermark"].as_u64().unwrap_or(0) {
                break;
            }
        }
        out
    }

    /// Send SIGKILL and wait for the process to go.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send SIGTERM and wait (bounded) for the exit status.
    ///
    /// # Panics
    /// When the process does not exit within `limit`.
    pub fn sigterm(&mut self, limit: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("a running node");
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                return s;
            }
            if Instant::now() > until {
                let _ = c.kill();
                panic!(
                    "queen did not exit within {limit:?} of SIGTERM:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait (bounded) for a launched process to exit by itself: its status, or `None` when it
    /// still runs after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        None
    }

    /// Start again on the same directory and port, and wait until healthy.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the node first");
        self.spawn();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A memory figure of a process from `/proc/<pid>/status`, in KiB: `VmRSS` (resident now) or
/// `VmHWM` (its peak so far). 0 when the process is gone.
#[must_use]
pub fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The settings of an embedded S3 sink that mirrors every queue into the folder `lake_url`
/// (`file://...`) from the start, uncompressed, in windows of about a second.
#[must_use]
pub fn folder_sink_env(lake_url: &str) -> Vec<(&'static str, &str)> {
    vec![
        ("QUEEN_S3_EMBEDDED", "true"),
        ("QUEEN_S3_QUEUES", "*"),
        ("QUEEN_S3_ENDPOINT", lake_url),
        ("QUEEN_S3_START", "earliest"),
        ("QUEEN_S3_COMPRESSION", "none"),
        ("QUEEN_S3_MAX_WINDOW_MS", "1000"),
        ("QUEEN_S3_SAFE_GUARD_MS", "500"),
    ]
}

/// Three nodes of one cluster on loopback (ids 1-3, `token`), node `i` (0-based) started with
/// `extra(i)` on top of the cluster settings in `dir/n<id>`, healthy together.
///
/// # Panics
/// When a node does not become healthy within a minute.
pub fn three_nodes(
    bin: &Path,
    dir: &Path,
    token: &str,
    extra: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<Node> {
    three_nodes_spaced(bin, dir, token, 1, extra)
}

/// [`three_nodes`] whose raft ports are each followed by `span - 1` free ports (a node with
/// `QUEEN_RAFT_GROUPS=span` listens on its raft port plus each group's number).
///
/// # Panics
/// When a node does not become healthy within a minute.
pub fn three_nodes_spaced(
    bin: &Path,
    dir: &Path,
    token: &str,
    span: u16,
    extra: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<Node> {
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let raft: Vec<u16> = (0..3).map(|_| free_ports(span)).collect();
    let peers = (0..3)
        .map(|i| format!("{}=127.0.0.1:{}/127.0.0.1:{}", i + 1, raft[i], http[i]))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let more = extra(i);
            let mut env: Vec<(&str, &str)> = vec![
                ("QUEEN_RAFT_NODE_ID", &id),
                ("QUEEN_RAFT_PEERS", &peers),
                ("QUEEN_RAFT_TOKEN", token),
            ];
            env.extend(more.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            Node::prepare(bin, &dir.join(format!("n{}", i + 1)), http[i], &env)
        })
        .collect();
    for n in &mut nodes {
        n.launch();
    }
    for n in &mut nodes {
        n.wait_healthy(Duration::from_secs(60));
    }
    nodes
}

/// A tmpfs mounted for the test; unmounted when dropped (also when the test fails).
pub struct Tmpfs {
    /// Where it is mounted.
    pub dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB at `dir` (made if missing).
    ///
    /// # Errors
    /// Why it cannot (not root, no `mount`): the caller prints it and skips.
    pub fn mount(dir: &Path, mib: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

/// A partition's transactionIds as node `n` reads them (`POST /api/v1/fetch` from offset 0 to
/// its end); `None` when a read fails.
#[must_use]
pub fn partition_txns(n: &Node, queue: &str, partition: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut offset = 0_u64;
    for _ in 0..1000 {
        let body = serde_json::json!({"entries": [{"queue": queue, "partition": partition, "offset": offset, "maxBytes": 4_000_000}]}).to_string();
        let (status, text) =
            post_url_within(&n.url("/api/v1/fetch"), &body, Duration::from_secs(10)).ok()?;
        if status != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&text).ok()?;
        let e = &v["entries"][0];
        if e["error"] == "OFFSET_OUT_OF_RANGE" {
            return Some(out);
        }
        let records = e["records"].as_array()?;
        if records.is_empty() {
            return Some(out);
        }
        for r in records {
            out.push(r["transactionId"].as_str()?.to_owned());
            offset = r["offset"].as_u64()? + 1;
        }
        if offset >= e["highWatermark"].as_u64().unwrap_or(0) {
            return Some(out);
        }
    }
    None
}

/// The value, or `None` after one `SKIPPED <what>: <error> (<needs>)` line for a test that
/// cannot run on this machine (no root, no `ip netns`, no libfaketime, no browser). The line
/// goes straight to the process's stderr, past the harness's capture, so every run shows it.
pub fn or_skip<T, E: std::fmt::Display>(found: Result<T, E>, what: &str, needs: &str) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED {what}: {e} ({needs})");
            None
        }
    }
}

/// Wait until `check` is true, polling; false after `limit`.
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    check()
}

/// Whether `check` stays true for all of `period`, polled every 100 ms (for what must not
/// happen: a check made once after a sleep would miss a change that came and went).
pub fn holds_for(period: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + period;
    loop {
        if !check() {
            return false;
        }
        if Instant::now() >= until {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pops parked on `node` now (long polls that found nothing and wait), from `/status`.
#[must_use]
pub fn waiting_pops(node: &Node) -> u64 {
    node.get("/status").json["pops"]["waiting"]
        .as_u64()
        .unwrap_or(0)
}

/// Wait until at least one pop is parked on `node`, so that what the test does next reaches
/// a waiting pop; false after `limit`.
#[must_use]
pub fn a_pop_waits(node: &Node, limit: Duration) -> bool {
    eventually(limit, || waiting_pops(node) >= 1)
}

/// A one-off GET on its own connection (for requests made from other threads).
///
/// # Panics
/// On a transport error.
#[must_use]
pub fn get_url(url: &str) -> (u16, String) {
    try_get_url(url, Duration::from_secs(90)).expect("request")
}

/// A one-off GET on its own connection, within `limit`.
///
/// # Errors
/// Transport errors, as text.
pub fn try_get_url(url: &str, limit: Duration) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(limit))
        .build()
        .into();
    let mut r = agent.get(url).call().map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    Ok((status, r.body_mut().read_to_string().unwrap_or_default()))
}

/// A one-off POST of JSON text on its own connection.
///
/// # Errors
/// Transport errors, as text.
pub fn post_url(url: &str, body: &str) -> Result<(u16, String), String> {
    post_url_within(url, body, Duration::from_secs(60))
}

/// A one-off POST of JSON text on its own connection, within `limit`.
///
/// # Errors
/// Transport errors (a timeout among them), as text.
pub fn post_url_within(url: &str, body: &str, limit: Duration) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(limit))
        .build()
        .into();
    let mut r = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    Ok((status, r.body_mut().read_to_string().unwrap_or_default()))
}

/// One group of a QPB1 body in the TXN layout: queue, partition, (transactionId, payload)s.
pub type TxnGroup<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

/// A QPB1 body (`Content-Type: application/x-queen-push`, `shared/spec/API.md` 4.6) in the
/// TXN layout.
///
/// # Panics
/// When a name, a payload or a count does not fit its length field.
#[must_use]
pub fn qpb1_txn(groups: &[TxnGroup<'_>]) -> Vec<u8> {
    let str16 = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&u16::try_from(s.len()).expect("a str16").to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    let mut b = b"QPB1\x04".to_vec();
    b.extend_from_slice(&u32::try_from(groups.len()).expect("a u32").to_le_bytes());
    for (queue, partition, items) in groups {
        str16(&mut b, queue);
        str16(&mut b, partition);
        b.extend_from_slice(&u32::try_from(items.len()).expect("a u32").to_le_bytes());
        for (txn, payload) in *items {
            str16(&mut b, txn);
            b.extend_from_slice(&u32::try_from(payload.len()).expect("a u32").to_le_bytes());
            b.extend_from_slice(payload.as_bytes());
        }
    }
    b
}

/// The lowercase hex SHA-256 of `text` (what the embedded proxy stores of an API key), from
/// the system's `sha256sum`.
///
/// # Panics
/// When `sha256sum` cannot run.
#[must_use]
pub fn sha256_hex(text: &str) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(text.as_bytes())?;
            c.wait_with_output()
        })
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a hash")
        .to_owned()
}
