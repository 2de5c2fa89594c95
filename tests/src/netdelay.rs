//! Packet delay and reordering on a real network without the kernel's `netem`: a TUN device in
//! the router namespace that the router's policy routing sends every forwarded packet into, and
//! a thread that reads each packet from it, holds it for a random time and writes it back, from
//! where the kernel forwards it on to its destination. A uniform random delay wider than the gap
//! between two packets reorders them, as `netem delay D J` does.
//!
//! ```text
//!   node 1 ─veth─> router: iif r1 → table 77 → dev qdelay ─read─> [held D..D+J] ─write─>
//!                  router: iif qdelay → main table → r2 ─veth─> node 2
//! ```
//!
//! The held packets are bounded (`LIMIT`, as netem's `limit`): past it a packet is dropped and
//! counted. Stopping releases every held packet at once and closes the device, which takes its
//! routes with it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most packets held at once (netem's default limit is 1,000; a busy three-node cluster
/// under a 100 ms delay keeps a few thousand in flight).
const LIMIT: usize = 20_000;

/// `TUNSETIFF` from `<linux/if_tun.h>`: `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// `struct ifreq` as `TUNSETIFF` reads it: the name, then the flags in the union.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// What the delayer did, counted from its start to its stop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DelayStats {
    /// Packets read from the device (every packet the router forwarded).
    pub packets: u64,
    /// Packets written back behind one that arrived after them.
    pub reordered: u64,
    /// Packets dropped because `LIMIT` were held.
    pub dropped: u64,
    /// The most packets held at once.
    pub most_held: usize,
}

impl std::fmt::Display for DelayStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} packets delayed, {} reordered, {} dropped over the limit, at most {} held",
            self.packets, self.reordered, self.dropped, self.most_held
        )
    }
}

/// A running delayer; `stop` ends it.
pub struct Delayer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<DelayStats>>,
}

impl Delayer {
    /// Opens TUN device `dev` inside the namespace named by `ns` and starts holding every packet
    /// written into it for `delay` plus a uniform random share of `jitter`. The device exists
    /// once this returns; the caller brings it up and routes packets into it.
    ///
    /// # Errors
    /// When the namespace cannot be entered or the device cannot be made (no `/dev/net/tun`).
    pub fn start(
        ns: PathBuf,
        dev: &str,
        delay: Duration,
        jitter: Duration,
        seed: u64,
    ) -> Result<Delayer, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let name = dev.to_owned();
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("netdelay".into())
            .spawn(move || {
                let fd = match crate::netns::enter(&ns).and_then(|()| open_tun(&name)) {
                    Ok(fd) => {
                        let _ = ready_tx.send(Ok(()));
                        fd
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return DelayStats::default();
                    }
                };
                run(&fd, &flag, delay, jitter, seed)
            })
            .map_err(|e| format!("spawn the delayer: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Delayer {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err("the delayer stopped before it started".into()),
        }
    }

    /// Releases every held packet, closes the device and says what was done.
    pub fn stop(mut self) -> DelayStats {
        self.halt()
    }

    fn halt(&mut self) -> DelayStats {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Delayer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.halt();
        }
    }
}

/// Makes (or attaches to) TUN device `name` in the calling thread's namespace, without the
/// packet-information header, non-blocking.
fn open_tun(name: &str) -> Result<OwnedFd, String> {
    if name.len() >= 16 {
        return Err(format!("device name {name:?} is too long"));
    }
    // SAFETY: open(2) with a constant NUL-terminated path; the result is checked.
    #[allow(unsafe_code)]
    let raw = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(format!(
            "open /dev/net/tun: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `raw` is a file descriptor we just opened and own.
    #[allow(unsafe_code)]
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = IfReq {
        name: [0; 16],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads a `struct ifreq`, which `IfReq` lays out, from a live pointer.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &raw mut req) };
    if rc < 0 {
        return Err(format!(
            "TUNSETIFF {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(fd)
}

/// One held packet: when it is due, its arrival number, its bytes.
type Held = Reverse<(Instant, u64, Vec<u8>)>;

/// The delayer's loop, until `stop`: read what arrived, write back what is due.
fn run(
    fd: &OwnedFd,
    stop: &AtomicBool,
    delay: Duration,
    jitter: Duration,
    seed: u64,
) -> DelayStats {
    let mut stats = DelayStats::default();
    let mut held: BinaryHeap<Held> = BinaryHeap::new();
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let jitter_us = u64::try_from(jitter.as_micros()).unwrap_or(u64::MAX);
    let mut last_out = None::<u64>;
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let wait = held
            .peek()
            .map_or(Duration::from_millis(20), |Reverse((due, _, _))| {
                due.saturating_duration_since(now)
                    .min(Duration::from_millis(20))
            });
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up, so a packet due in 300 µs is not polled for with a timeout of 0 in a loop.
        let ms = libc::c_int::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(20);
        // SAFETY: one valid pollfd for the length of the call.
        #[allow(unsafe_code)]
        let _ = unsafe { libc::poll(&raw mut pfd, 1, ms) };
        // Read everything that arrived (bounded per turn, so due packets are not starved).
        for _ in 0..512 {
            // SAFETY: reads into a live buffer of its stated length.
            #[allow(unsafe_code)]
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else { break };
            if n == 0 {
                break;
            }
            stats.packets += 1;
            if held.len() >= LIMIT {
                stats.dropped += 1;
                continue;
            }
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            let extra = rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % jitter_us.saturating_add(1);
            let due = Instant::now() + delay + Duration::from_micros(extra);
            held.push(Reverse((due, stats.packets, buf[..n].to_vec())));
            stats.most_held = stats.most_held.max(held.len());
        }
        let now = Instant::now();
        while held.peek().is_some_and(|Reverse((due, _, _))| *due <= now) {
            if let Some(Reverse((_, seq, packet))) = held.pop() {
                send(fd, &packet, seq, &mut last_out, &mut stats);
            }
        }
    }
    // Release what is held, in its order: stopping the fault loses nothing.
    while let Some(Reverse((_, seq, packet))) = held.pop() {
        send(fd, &packet, seq, &mut last_out, &mut stats);
    }
    stats
}

/// Writes one packet back into the device (the kernel forwards it on); counts it as reordered
/// when a packet that arrived after it went out first.
fn send(fd: &OwnedFd, packet: &[u8], seq: u64, last_out: &mut Option<u64>, stats: &mut DelayStats) {
    if last_out.is_some_and(|l| l > seq) {
        stats.reordered += 1;
    }
    *last_out = Some(last_out.map_or(seq, |l| l.max(seq)));
    // SAFETY: writes from a live buffer of its stated length. A packet the kernel refuses (its
    // queue full) is lost, as on a real link.
    #[allow(unsafe_code)]
    let _ = unsafe { libc::write(fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
}
