//! The load driver shared by every phase: `inflight` loops each repeat one request until the
//! phase's time is up, and the latencies, counts and first error are gathered. Also the process
//! helpers every phase reads: CPU time and peak RSS from `/proc`, and a guard that stops the
//! processes the bench started, by PID, whatever way the bench ends.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one phase moved.
pub struct Stats {
    /// Messages moved.
    pub messages: u64,
    /// Requests answered.
    pub requests: u64,
    /// Requests that failed.
    pub errors: u64,
    /// How long the phase ran.
    pub seconds: f64,
    /// Each request's latency.
    pub lat: Vec<Duration>,
    /// The first failure, for the report.
    pub first_error: Option<String>,
}

impl Stats {
    /// Messages per second.
    pub fn msg_per_s(&self) -> f64 {
        self.messages as f64 / self.seconds.max(1e-9)
    }

    /// Requests per second.
    pub fn req_per_s(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }

    /// Latency percentile in milliseconds (`lat` is sorted by `drive`).
    pub fn pct_ms(&self, p: f64) -> f64 {
        pct_ms(&self.lat, p)
    }
}

/// Percentile `p` (0 to 1) of sorted latencies, in milliseconds; 0 when there are none.
pub fn pct_ms(lat: &[Duration], p: f64) -> f64 {
    let i = ((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1));
    lat.get(i).copied().unwrap_or_default().as_secs_f64() * 1000.0
}

/// Run `inflight` loops of `one` for `seconds`; `one(n)` gets a request sequence number and
/// returns the messages it moved. A loop gives up after 1000 errors.
pub async fn drive<F, Fut>(inflight: usize, seconds: u64, one: F) -> Stats
where
    F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Result<u64, String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let seq = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..inflight {
        let (stop, seq, one) = (stop.clone(), seq.clone(), one.clone());
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let s = Instant::now();
                match one(n).await {
                    Ok(m) => t.moved(m, s.elapsed()),
                    Err(e) => {
                        if t.failed(e) {
                            break;
                        }
                    }
                }
            }
            t.done()
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut st = gather(tasks).await;
    st.seconds = started.elapsed().as_secs_f64();
    st.lat.sort_unstable();
    st
}

/// CPU seconds (user + system) a process has used so far; 0 when it is gone.
pub fn cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are in clock ticks; USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// Peak resident memory of a process in KiB (`VmHWM`).
pub fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// One started process and where its output goes.
pub struct Proc {
    /// Its name in the report.
    pub name: String,
    /// The process.
    pub child: Child,
    /// Where its output goes, if anywhere.
    pub log: Option<PathBuf>,
}

/// The processes this bench started. Dropping it stops each one by PID: SIGTERM, up to 15 s to
/// exit, then SIGKILL; so they are stopped on success, on error, on panic and on Ctrl-C alike.
#[derive(Default)]
pub struct Procs(pub Vec<Proc>);

impl Procs {
    /// The PIDs of the processes.
    pub fn pids(&self) -> Vec<u32> {
        self.0.iter().map(|p| p.child.id()).collect()
    }

    /// CPU seconds used so far by all of them.
    pub fn cpu_seconds(&self) -> f64 {
        self.pids()
            .iter()
            .map(|p| cpu_seconds(&p.to_string()))
            .sum()
    }

    /// The largest peak RSS among them, in MiB.
    pub fn max_peak_rss_mib(&self) -> u64 {
        self.pids().into_iter().map(peak_rss_kib).max().unwrap_or(0) / 1024
    }

    /// An error naming a process that has already exited, with the end of its log.
    pub fn exited(&mut self) -> Option<String> {
        self.0.iter_mut().find_map(|p| match p.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} exited early with {status}{}",
                p.name,
                log_tail(p.log.as_deref())
            )),
            _ => None,
        })
    }

    /// Stop every process: SIGTERM, then SIGKILL after the grace period.
    pub fn stop_all(&mut self) {
        for p in &self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &p.child.id().to_string()])
                .status();
        }
        for mut p in self.0.drain(..) {
            let until = Instant::now() + Duration::from_secs(15);
            while Instant::now() < until {
                if let Ok(Some(_)) = p.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The last lines of a log file, for error messages.
pub fn log_tail(log: Option<&Path>) -> String {
    let Some(text) = log.and_then(|l| std::fs::read_to_string(l).ok()) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    format!(":\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
}

/// Like `drive`, for a phase that drains what is there: `one(n)` answers `Ok(Some(moved))`, or
/// `Ok(None)` when it found nothing to move. A loop ends after `empties` answers of nothing in
/// a row (pausing 10 ms after each), or when the time is up; the phase's `seconds` run from its
/// start to the end of the last request that moved something, so the idle tail of a drained
/// backlog is not counted.
pub async fn drain<F, Fut>(inflight: usize, seconds: u64, empties: u32, one: F) -> Stats
where
    F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Result<Option<u64>, String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let seq = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    // Microseconds from `started` to the end of the last request that moved a message.
    let last = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..inflight {
        let (stop, seq, one, last) = (stop.clone(), seq.clone(), one.clone(), last.clone());
        tasks.push(tokio::spawn(async move {
            let (mut t, mut idle) = (Tally::default(), 0u32);
            while !stop.load(Ordering::Relaxed) && idle < empties {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let s = Instant::now();
                match one(n).await {
                    Ok(Some(m)) if m > 0 => {
                        idle = 0;
                        t.moved(m, s.elapsed());
                        last.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => {
                        if t.failed(e) {
                            break;
                        }
                    }
                }
            }
            t.done()
        }));
    }
    let watch = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut st = gather(tasks).await;
    watch.abort();
    let moved_until = Duration::from_micros(last.load(Ordering::Relaxed)).as_secs_f64();
    st.seconds = if st.messages > 0 {
        moved_until
    } else {
        started.elapsed().as_secs_f64()
    };
    st.lat.sort_unstable();
    st
}

/// What one loop of a phase moved: messages, requests, errors, latencies, its first error.
type Loop = (u64, u64, u64, Vec<Duration>, Option<String>);

/// What one loop has moved so far.
#[derive(Default)]
struct Tally {
    msgs: u64,
    reqs: u64,
    errs: u64,
    lat: Vec<Duration>,
    first: Option<String>,
}

impl Tally {
    fn moved(&mut self, messages: u64, took: Duration) {
        self.msgs += messages;
        self.reqs += 1;
        self.lat.push(took);
    }

    /// Counts an error; true when the loop should give up (after 1000).
    fn failed(&mut self, e: String) -> bool {
        self.errs += 1;
        self.first.get_or_insert(e);
        self.errs > 1000
    }

    fn done(self) -> Loop {
        (self.msgs, self.reqs, self.errs, self.lat, self.first)
    }
}

/// The loops' figures added up (`seconds` is the caller's to set).
async fn gather(tasks: Vec<tokio::task::JoinHandle<Loop>>) -> Stats {
    let mut st = Stats {
        messages: 0,
        requests: 0,
        errors: 0,
        seconds: 0.0,
        lat: Vec::new(),
        first_error: None,
    };
    for task in tasks {
        if let Ok((m, r, e, l, f)) = task.await {
            st.messages += m;
            st.requests += r;
            st.errors += e;
            st.lat.extend(l);
            if st.first_error.is_none() {
                st.first_error = f;
            }
        }
    }
    st
}

/// Bytes a process has caused to be written to storage so far (`/proc/<pid>/io` write_bytes
/// less cancelled_write_bytes: pages it dirtied and that were not truncated before writeback;
/// every thread of the process counted, background compaction included); 0 when it is gone.
pub fn disk_write_bytes(pid: u32) -> u64 {
    let Ok(io) = std::fs::read_to_string(format!("/proc/{pid}/io")) else {
        return 0;
    };
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    field("write_bytes:").saturating_sub(field("cancelled_write_bytes:"))
}

/// A small fast random generator (wyrand) for payloads, message ids and run prefixes: the bench
/// needs bytes that do not compress and ids that never repeat, cheaply, on the client's share
/// of two cores. Not for anything secret.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from the clock, the process id and `salt`.
    #[allow(
        clippy::disallowed_methods,
        reason = "a random seed, not a time any rule reads"
    )]
    pub fn seeded(salt: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut r = Rng(t
            ^ (u64::from(std::process::id()) << 32)
            ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        r.next_u64();
        r
    }

    /// A generator derived from a seed and a stream number (e.g. a request's sequence number).
    pub fn derived(seed: u64, stream: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        r.next_u64();
        r
    }

    /// The next pseudo-random word.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xA076_1D64_78BD_642F);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xE703_7ED1_A0B4_28DB);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Fill `out` with pseudo-random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Appends `len` random base64 characters (6 random bits each: JSON-safe, no escapes).
    pub fn push_b64(&mut self, out: &mut String, len: usize) {
        const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut left = len;
        while left > 0 {
            let mut v = self.next_u64();
            for _ in 0..left.min(10) {
                out.push(B64[(v & 63) as usize] as char);
                v >>= 6;
            }
            left = left.saturating_sub(10);
        }
    }
}

/// A message's JSON payload of exactly `size` bytes (at least 10): `{"d":"<random base64>"}`,
/// fresh random characters for every call, so that neither compression nor a cache of repeated
/// bytes makes a message cheaper than a real one.
pub fn random_payload(rng: &mut Rng, size: usize, out: &mut String) {
    out.push_str("{\"d\":\"");
    rng.push_b64(out, size.saturating_sub(8));
    out.push_str("\"}");
}

/// A random run prefix for transaction ids (8 hex characters), so that ids are
/// unique across runs against the same store as well as across the loops of one run.
pub fn run_prefix(rng: &mut Rng) -> String {
    format!("{:08x}", rng.next_u64() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_exact_fresh_and_valid_json() {
        let mut rng = Rng::seeded(1);
        let (mut a, mut b) = (String::new(), String::new());
        random_payload(&mut rng, 256, &mut a);
        random_payload(&mut rng, 256, &mut b);
        assert_eq!(a.len(), 256);
        assert_ne!(a, b);
        let v: serde_json::Value = serde_json::from_str(&a).expect("valid JSON");
        assert_eq!(v["d"].as_str().map(str::len), Some(248));
    }

    #[test]
    fn disk_bytes_of_self_read() {
        // Reading our own counters works (the figure itself may be 0).
        let _ = disk_write_bytes(std::process::id());
        assert!(std::fs::read_to_string("/proc/self/io").is_ok());
    }
}
