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
    pub messages: u64,
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub lat: Vec<Duration>,
    pub first_error: Option<String>,
}

impl Stats {
    pub fn msg_per_s(&self) -> f64 {
        self.messages as f64 / self.seconds.max(1e-9)
    }

    pub fn req_per_s(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }

    /// Latency percentile in milliseconds (`lat` is sorted by `drive`).
    pub fn pct_ms(&self, p: f64) -> f64 {
        let i = ((self.lat.len() as f64 * p) as usize).min(self.lat.len().saturating_sub(1));
        self.lat.get(i).copied().unwrap_or_default().as_secs_f64() * 1000.0
    }
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
            let (mut msgs, mut reqs, mut errs, mut lat, mut first) = (0u64, 0u64, 0u64, Vec::new(), None);
            while !stop.load(Ordering::Relaxed) {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let s = Instant::now();
                match one(n).await {
                    Ok(m) => {
                        msgs += m;
                        reqs += 1;
                        lat.push(s.elapsed());
                    }
                    Err(e) => {
                        errs += 1;
                        first.get_or_insert(e);
                        if errs > 1000 {
                            break;
                        }
                    }
                }
            }
            (msgs, reqs, errs, lat, first)
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut st = Stats { messages: 0, requests: 0, errors: 0, seconds: 0.0, lat: Vec::new(), first_error: None };
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
    st.seconds = started.elapsed().as_secs_f64();
    st.lat.sort_unstable();
    st
}

/// CPU seconds (user + system) a process has used so far; 0 when it is gone.
pub fn cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
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
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// One started process and where its output goes.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: Option<PathBuf>,
}

/// The processes this bench started. Dropping it stops each one by PID: SIGTERM, up to 15 s to
/// exit, then SIGKILL; so they are stopped on success, on error, on panic and on Ctrl-C alike.
#[derive(Default)]
pub struct Procs(pub Vec<Proc>);

impl Procs {
    pub fn pids(&self) -> Vec<u32> {
        self.0.iter().map(|p| p.child.id()).collect()
    }

    /// CPU seconds used so far by all of them.
    pub fn cpu_seconds(&self) -> f64 {
        self.pids().iter().map(|p| cpu_seconds(&p.to_string())).sum()
    }

    /// The largest peak RSS among them, in MiB.
    pub fn max_peak_rss_mib(&self) -> u64 {
        self.pids().into_iter().map(peak_rss_kib).max().unwrap_or(0) / 1024
    }

    /// An error naming a process that has already exited, with the end of its log.
    pub fn exited(&mut self) -> Option<String> {
        self.0.iter_mut().find_map(|p| match p.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited early with {status}{}", p.name, log_tail(p.log.as_deref()))),
            _ => None,
        })
    }

    pub fn stop_all(&mut self) {
        for p in &self.0 {
            let _ = std::process::Command::new("kill").args(["-TERM", &p.child.id().to_string()]).status();
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
    let Some(text) = log.and_then(|l| std::fs::read_to_string(l).ok()) else { return String::new() };
    let lines: Vec<&str> = text.lines().collect();
    format!(":\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
}
