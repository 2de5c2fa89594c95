//! What applying pushes costs one replica, without raft, HTTP or a network: the CPU every node
//! of a cluster spends per message in the state machine (the largest share of a follower's CPU
//! under batch pushes, by `perf`).
//!
//! Entries of 100 pushed messages (256 random bytes each as JSON text, unique transactionIds,
//! one queue, 8 partitions as `queen-bench cluster` sends them) are written to a log held in
//! memory and applied in batches of 8 entries to a store in a temporary directory, as a node
//! attached to its raft log applies them. It prints the process CPU (user + system, the store's
//! background threads included) and the wall time per message.
//!
//!     cargo run --release -p queen-store --example apply_cost -- 2000
//!
//! The argument is the number of entries (default 2000, 200,000 messages).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use queen_domain::command::{Command, Entry, PushItem};
use queen_domain::names::{PartitionName, QueueName};
use queen_ports::{ApplyEntry, BackendError, LogFiles, LogSpan, StateMachineBackend};
use queen_store::{FjallStore, StoreConfig};

/// The log's one file, in memory.
#[derive(Default)]
struct MemLog {
    file: Mutex<Vec<u8>>,
}

impl MemLog {
    fn append(&self, command: &[u8]) -> LogSpan {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let pos = f.len() as u64;
        f.extend_from_slice(command);
        LogSpan {
            file: 1,
            pos,
            len: u32::try_from(command.len()).unwrap_or(u32::MAX),
        }
    }
}

impl LogFiles for MemLog {
    fn read(&self, span: LogSpan) -> Result<Vec<u8>, BackendError> {
        let f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let at = usize::try_from(span.pos).unwrap_or(usize::MAX);
        f.get(at..at + span.len as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| BackendError::Storage(format!("no span {span:?}")))
    }
    fn hold(&self, _file: u64) {}
    fn release(&self, _file: u64) -> Result<(), BackendError> {
        Ok(())
    }
    fn set_holds(&self, _files: &[u64]) -> Result<(), BackendError> {
        Ok(())
    }
}

/// User + system CPU of the whole process, in microseconds.
#[allow(unsafe_code)]
fn cpu_micros() -> u64 {
    // SAFETY: getrusage fills the struct it is given; zeroed bytes are a valid rusage.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut u) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

fn main() {
    let entries: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = FjallStore::open(&StoreConfig::new(dir.path().to_path_buf())).expect("open");
    let log = Arc::new(MemLog::default());
    store.attach_log(log.clone()).expect("attach");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let queue = QueueName::new("bench").expect("queue name");
    let parts: Vec<PartitionName> = (0..8)
        .map(|p| PartitionName::new(format!("p{p}")).expect("partition name"))
        .collect();
    // Build every command first, so the measurement is the apply alone.
    let commands: Vec<bytes::Bytes> = (0..entries)
        .map(|e| {
            let items = (0..100)
                .map(|i| {
                    let hex: String = (0..32).map(|_| format!("{:016x}", rnd())).collect();
                    PushItem {
                        queue: queue.clone(),
                        partition: parts[(e % 8) as usize].clone(),
                        transaction_id: queen_domain::ids::TransactionId::new(format!(
                            "run-{e}-{i}-{:x}",
                            rnd()
                        ))
                        .expect("id"),
                        message_id: rnd().to_be_bytes().repeat(2).try_into().unwrap_or([0; 16]),
                        payload: format!("\"{}\"", &hex[..254]).into_bytes(),
                        trace_id: None,
                    }
                })
                .collect();
            Entry {
                proposed_at: 1_000_000 + e,
                command: Command::Push(items),
            }
            .encode()
            .into()
        })
        .collect();
    let spans: Vec<LogSpan> = commands.iter().map(|c| log.append(c)).collect();
    let (cpu0, wall0) = (cpu_micros(), Instant::now());
    // A line per tenth of the run, to show how the cost grows with what is already stored.
    let tenth = (commands.len() / 8 / 10).max(1);
    let mut mark = (cpu0, wall0);
    for (b, chunk) in commands.chunks(8).enumerate() {
        if b > 0 && b % tenth == 0 {
            let (cpu, now) = (cpu_micros(), Instant::now());
            let n = (tenth * 8 * 100) as f64;
            println!(
                "  {:>9} stored: {:.2} µs CPU and {:.2} µs wall per message",
                b * 8 * 100,
                (cpu - mark.0) as f64 / n,
                now.duration_since(mark.1).as_micros() as f64 / n
            );
            mark = (cpu, now);
        }
        let batch = chunk
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let n = b * 8 + i;
                ApplyEntry {
                    index: n as u64 + 1,
                    command: Some(c.clone()),
                    answered: false,
                    span: Some(spans[n]),
                }
            })
            .collect();
        store.apply(batch, b"meta".to_vec()).expect("apply");
    }
    let (cpu, wall) = (cpu_micros() - cpu0, wall0.elapsed());
    let messages = entries * 100;
    println!(
        "applied {messages} messages in {entries} entries: {:.2} µs CPU and {:.2} µs wall per message",
        cpu as f64 / messages as f64,
        wall.as_micros() as f64 / messages as f64
    );
}
