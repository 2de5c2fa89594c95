//! S3 fixtures for the sink's black-box tests: the lake venv (tests/lake/ensure-venv.sh), a moto
//! S3 server process, a fault proxy that can make the bucket fail without losing its data, and
//! `read_lake` (tests/lake/read_lake.py: DuckDB and pyarrow read the lake independently).
//! Every wait is bounded; processes are stopped by PID on drop.
//!
//! moto accepts any access key and secret (it checks no signature and no checksum) and keeps its
//! state in memory: [`S3Server::restart`] comes back with no bucket. Use [`FaultProxy`] to make
//! the bucket fail and recover with its objects intact.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::free_port;

mod proxy;
pub use proxy::{FaultProxy, Mode};

/// Access key the fixtures use (moto accepts any).
pub const ACCESS_KEY: &str = "testkey";
/// Secret key the fixtures use (moto accepts any).
pub const SECRET_KEY: &str = "testsecret";
/// Region the fixtures use (moto does not check it).
pub const REGION: &str = "us-east-1";

/// tests/lake in this repository.
#[must_use]
pub fn lake_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("lake")
}

/// The venv python of the lake tools (moto, DuckDB 1.5.5 + httpfs, pyarrow, boto3, zstandard).
/// Runs tests/lake/ensure-venv.sh once per process; the first run on a machine installs the
/// pinned requirements (~20-40 s), later runs take well under a second.
///
/// # Panics
/// When the script fails or overruns 25 minutes.
pub fn lake_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let script = lake_dir().join("ensure-venv.sh");
            let mut cmd = Command::new("bash");
            cmd.arg(&script);
            let out = run_bounded(cmd, Duration::from_secs(1500));
            assert!(
                out.ok,
                "{} failed ({}):\n{}\n{}",
                script.display(),
                out.status,
                out.stdout,
                out.stderr
            );
            let path = out
                .stdout
                .lines()
                .last()
                .unwrap_or_default()
                .trim()
                .to_owned();
            let path = PathBuf::from(path);
            assert!(
                path.exists(),
                "ensure-venv.sh printed no usable python path:\n{}\n{}",
                out.stdout,
                out.stderr
            );
            path
        })
        .clone()
}

/// Output of a bounded child process.
#[derive(Debug)]
pub struct Output {
    /// Exit status as text (or "timed out after ...").
    pub status: String,
    /// Exited with 0.
    pub ok: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Run `cmd` with stdout and stderr captured in temp files, killing it (by PID) after `limit`.
///
/// # Panics
/// When it cannot be spawned.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let out_f = std::fs::File::create(&out_path).expect("stdout file");
    let err_f = std::fs::File::create(&err_path).expect("stderr file");
    cmd.stdin(Stdio::null()).stdout(out_f).stderr(err_f);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let until = Instant::now() + limit;
    let (status, ok) = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break (s.to_string(), s.success());
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break (format!("timed out after {limit:?}"), false);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        ok,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// Run tests/lake/`script` with the venv python and `args` (bounded to 3 minutes).
///
/// # Errors
/// A non-zero exit, as "status + stderr".
pub fn try_run_lake_script(script: &str, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(lake_python());
    cmd.arg(lake_dir().join(script)).args(args);
    let out = run_bounded(cmd, Duration::from_secs(180));
    if out.ok {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{script} {args:?}: {}\n{}{}",
            out.status, out.stdout, out.stderr
        ))
    }
}

/// Run tests/lake/`script` with the venv python; its stdout.
///
/// # Panics
/// When it fails, with its stderr.
#[must_use]
pub fn run_lake_script(script: &str, args: &[&str]) -> String {
    try_run_lake_script(script, args).unwrap_or_else(|e| panic!("{e}"))
}

/// tests/lake/read_lake.py with `args` (`--root DIR` or `--s3 URL --bucket B`, `--prefix P`,
/// `--tenant T`, `--queue Q`, `--format jsonl|parquet|both`): its JSON answer.
///
/// # Errors
/// The script failed (unreadable lake, server down, ...), or printed no JSON.
pub fn try_read_lake(args: &[&str]) -> Result<Value, String> {
    let out = try_run_lake_script("read_lake.py", args)?;
    serde_json::from_str(&out).map_err(|e| format!("read_lake.py printed no JSON ({e}):\n{out}"))
}

/// Like [`try_read_lake`].
///
/// # Panics
/// When the script fails, with its stderr.
#[must_use]
pub fn read_lake(args: &[&str]) -> Value {
    try_read_lake(args).unwrap_or_else(|e| panic!("{e}"))
}

/// A moto S3 server (`moto_server`) on a free loopback port, with its own log file.
pub struct S3Server {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// Port it listens on (kept across [`S3Server::restart`]).
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// Start moto and wait (at most 20 s) until `GET /moto-api/` answers 200.
    ///
    /// # Panics
    /// When it does not come up (after three tries on fresh ports), with its log.
    #[must_use]
    pub fn start() -> S3Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = S3Server {
            endpoint: String::new(),
            port: 0,
            child: None,
            log: dir.path().join("moto.log"),
            _dir: dir,
        };
        let mut last = String::new();
        for _ in 0..3 {
            s.port = free_port();
            s.endpoint = format!("http://127.0.0.1:{}", s.port);
            match s.spawn() {
                Ok(()) => return s,
                // Most likely the port was taken between free_port and moto's bind.
                Err(e) => last = e,
            }
        }
        panic!("moto_server did not start:\n{last}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let moto = lake_python().with_file_name("moto_server");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("moto log");
        let child = Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("moto log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", moto.display()));
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "moto_server exited with {status}:\n{}",
                    self.log_text()
                ));
            }
            if http(&self.endpoint, "GET", "/moto-api/").is_ok_and(|s| s == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        Err(format!(
            "moto_server not ready within 20 s:\n{}",
            self.log_text()
        ))
    }

    /// Create a bucket (moto accepts an unsigned `PUT /<bucket>`).
    ///
    /// # Panics
    /// When moto does not answer 200.
    pub fn create_bucket(&self, name: &str) {
        let status = http(&self.endpoint, "PUT", &format!("/{name}"))
            .unwrap_or_else(|e| panic!("PUT /{name}: {e}"));
        assert_eq!(status, 200, "create bucket {name}:\n{}", self.log_text());
    }

    /// Stop the server (SIGKILL by PID, then wait). Its buckets are gone for good.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port and wait until ready. moto keeps state in memory: the new
    /// server has no bucket (create them again).
    ///
    /// # Panics
    /// When it does not come up.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn() {
            panic!("moto_server did not restart on port {}:\n{e}", self.port);
        }
    }

    /// Whether the process is running.
    #[must_use]
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// PID of the running process.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// moto's log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A fault proxy in front of this server (see [`FaultProxy`]).
    #[must_use]
    pub fn proxy(&self) -> FaultProxy {
        FaultProxy::start(self.port)
    }

    /// Arguments for read_lake.py reading `bucket` on this server directly.
    #[must_use]
    pub fn lake_args<'a>(&'a self, bucket: &'a str) -> Vec<&'a str> {
        vec![
            "--s3",
            &self.endpoint,
            "--bucket",
            bucket,
            "--key",
            ACCESS_KEY,
            "--secret",
            SECRET_KEY,
            "--region",
            REGION,
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One unsigned request to an S3 endpoint; the status code.
///
/// # Errors
/// Transport errors, as text.
pub fn http(endpoint: &str, method: &str, path: &str) -> Result<u16, String> {
    http_within(endpoint, method, path, Duration::from_secs(10))
}

/// Like [`http`], giving up after `limit`.
///
/// # Errors
/// Transport errors and timeouts, as text.
pub fn http_within(
    endpoint: &str,
    method: &str,
    path: &str,
    limit: Duration,
) -> Result<u16, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(limit))
        .build()
        .into();
    let url = format!("{endpoint}{path}");
    let resp = match method {
        "GET" => agent.get(&url).call(),
        "HEAD" => agent.head(&url).call(),
        "DELETE" => agent.delete(&url).call(),
        "PUT" => agent.put(&url).send_empty(),
        _ => return Err(format!("unsupported {method}")),
    };
    let mut resp = resp.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let _ = resp.body_mut().read_to_string();
    Ok(status)
}

/// The sink's settings for bucket `lake` on `endpoint` (path style, the test keys), mirroring
/// `queues` from the start of each queue, with short windows (one second, a half-second guard)
/// so tests run in seconds. `extra` replaces or adds settings.
#[must_use]
pub fn sink_env(
    endpoint: &str,
    queues: &str,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> = vec![
        ("QUEEN_S3_EMBEDDED", "true".into()),
        ("QUEEN_S3_QUEUES", queues.to_owned()),
        ("QUEEN_S3_ENDPOINT", endpoint.to_owned()),
        ("QUEEN_S3_REGION", REGION.into()),
        ("QUEEN_S3_PATH_STYLE", "true".into()),
        ("QUEEN_S3_BUCKET", "lake".into()),
        ("QUEEN_S3_ACCESS_KEY", ACCESS_KEY.into()),
        ("QUEEN_S3_SECRET_KEY", SECRET_KEY.into()),
        ("QUEEN_S3_START", "earliest".into()),
        ("QUEEN_S3_MAX_WINDOW_MS", "1000".into()),
        ("QUEEN_S3_SAFE_GUARD_MS", "500".into()),
    ];
    for (k, val) in extra {
        v.retain(|(n, _)| n != k);
        v.push((k, val.clone()));
    }
    v
}
