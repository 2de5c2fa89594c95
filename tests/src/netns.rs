//! Real network faults for black-box tests: every node in its own Linux network namespace,
//! joined to a router namespace by a veth pair, and the test's client in one more. Nothing is
//! addressed outside these namespaces (the root namespace gets no address and no route), and
//! every namespace, with its links, is deleted when the `Net` is dropped.
//!
//! ```text
//!   node 1 (10.77.1.2) ──veth── router (10.77.1.1, .2.1, .3.1, .9.1) ──veth── client (10.77.9.2)
//!   node 2 (10.77.2.2) ──veth──┘          │
//!   node 3 (10.77.3.2) ──veth─────────────┘
//! ```
//!
//! The router forwards between the links; a fault is a routing-policy rule in the router
//! (`ip rule add from A to B blackhole`), so a packet of a cut direction is dropped silently in
//! flight, as on a real network: one rule is a one-way partition, a pair a full one, and any set
//! of pairs makes majority/minority splits or a bridge node that sees both sides. Packet loss is
//! an nftables rule in the router's forward hook that drops a random share of every packet it
//! forwards (`numgen random mod 100 < pct drop`), when the `nft` command is installed. This
//! kernel's traffic-control modules (netem for delay and reordering, and the classifiers) are
//! not available to the tests, so delay and reordering are made by `crate::netdelay`: the
//! router routes every packet it receives from a link into a TUN device, where a thread of the
//! test holds each for a random time before the router forwards it on.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::netdelay::{DelayStats, Delayer};

/// The client namespace's index (its link is 10.77.9.x).
const CLIENT: usize = 9;

/// A set of namespaces made for one test.
pub struct Net {
    prefix: String,
    nodes: usize,
    /// The cuts in place, as (from, to).
    rules: Mutex<Vec<(usize, usize)>>,
    /// Whether the packet-loss table is in place.
    lossy: Mutex<bool>,
    /// Nodes whose link is slowed (a token bucket on both ends of their veth).
    slowed: Mutex<Vec<usize>>,
    /// The delayer in place, if any.
    delayer: Mutex<Option<Delayer>>,
}

/// The router's TUN device for delayed packets, the routing table that sends packets into it,
/// and the preference of the rules that pick that table (before the main table's 32766; the
/// cuts, added later without a preference, come before it).
const DELAY_DEV: &str = "qdelay";
const DELAY_TABLE: &str = "77";
const DELAY_PREF: &str = "30000";

/// The router's nftables table that drops packets at random.
const LOSS_TABLE: &str = "queen_faults";

/// Runs `ip args`; the error names the command and what it printed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// Namespaces for `nodes` nodes (at most 8), a router and a client, or why they cannot be
    /// made here (not root, no `ip`, namespaces not allowed): the caller prints that and skips.
    ///
    /// # Errors
    /// The first command that failed, with its message.
    pub fn new(nodes: usize) -> Result<Net, String> {
        assert!((1..CLIENT).contains(&nodes), "1 to 8 nodes");
        let tag = std::process::id() % 100_000;
        let seq = {
            use std::sync::atomic::{AtomicU32, Ordering};
            static SEQ: AtomicU32 = AtomicU32::new(0);
            SEQ.fetch_add(1, Ordering::SeqCst)
        };
        let net = Net {
            prefix: format!("qf{tag}x{seq}"),
            nodes,
            rules: Mutex::new(Vec::new()),
            lossy: Mutex::new(false),
            slowed: Mutex::new(Vec::new()),
            delayer: Mutex::new(None),
        };
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> Result<(), String> {
        let router = self.router();
        ip(&["netns", "add", &router])?;
        ip(&["-n", &router, "link", "set", "lo", "up"])?;
        let forward = Command::new("ip")
            .args(["netns", "exec", &router, "sysctl", "-q", "-w"])
            .arg("net.ipv4.ip_forward=1")
            .output()
            .map_err(|e| format!("sysctl: {e}"))?;
        if !forward.status.success() {
            return Err(format!(
                "sysctl net.ipv4.ip_forward=1 in {router}: {}",
                String::from_utf8_lossy(&forward.stderr).trim()
            ));
        }
        for i in (1..=self.nodes).chain([CLIENT]) {
            let ns = self.ns(i);
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let far = format!("r{i}");
            ip(&[
                "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &far, "netns",
                &router,
            ])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", Self::addr_of(i)),
                "dev",
                "eth0",
            ])?;
            ip(&[
                "-n",
                &router,
                "addr",
                "add",
                &format!("10.77.{i}.1/24"),
                "dev",
                &far,
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &router, "link", "set", &far, "up"])?;
            ip(&[
                "-n",
                &ns,
                "route",
                "add",
                "default",
                "via",
                &format!("10.77.{i}.1"),
            ])?;
        }
        Ok(())
    }

    fn router(&self) -> String {
        format!("{}r", self.prefix)
    }

    fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.prefix)
    }

    fn addr_of(i: usize) -> String {
        format!("10.77.{i}.2")
    }

    /// Node `i`'s address (1-based).
    #[must_use]
    pub fn addr(&self, i: usize) -> String {
        Self::addr_of(i)
    }

    /// The file that names node `i`'s namespace, for `setns`.
    #[must_use]
    pub fn ns_path(&self, i: usize) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.ns(i)))
    }

    /// Runs `f` on a thread inside the client's namespace (every connection it opens starts
    /// there) and answers what it answered; a panic in `f` is raised here.
    ///
    /// # Panics
    /// When the namespace cannot be entered, or `f` panicked.
    pub fn as_client<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = PathBuf::from(format!("/var/run/netns/{}", self.ns(CLIENT)));
        std::thread::scope(|s| {
            s.spawn(move || {
                enter(&path).unwrap_or_else(|e| panic!("{e}"));
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Drop every packet from node `from` to node `to` in flight (a one-way cut).
    ///
    /// # Panics
    /// When the rule cannot be added.
    pub fn cut_one_way(&self, from: usize, to: usize) {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        if rules.contains(&(from, to)) {
            return;
        }
        self.rule("add", from, to).unwrap_or_else(|e| panic!("{e}"));
        rules.push((from, to));
    }

    /// Adds or deletes (`verb`) the router's rule that drops packets from `from` to `to`.
    fn rule(&self, verb: &str, from: usize, to: usize) -> Result<(), String> {
        let (a, b) = (Self::addr_of(from), Self::addr_of(to));
        ip(&[
            "-n",
            &self.router(),
            "rule",
            verb,
            "from",
            &a,
            "to",
            &b,
            "blackhole",
        ])
    }

    /// Cut both directions between `a` and `b`.
    pub fn cut(&self, a: usize, b: usize) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Cut node `i` from every other node (the client still reaches it).
    pub fn isolate(&self, i: usize) {
        for j in 1..=self.nodes {
            if j != i {
                self.cut(i, j);
            }
        }
    }

    /// Drop `percent` of the packets the router forwards, in every direction, at random; `Err`
    /// says why it cannot (no `nft` command, or the kernel refuses the rule).
    ///
    /// # Errors
    /// The command that failed, with its message.
    pub fn lose(&self, percent: u8) -> Result<(), String> {
        let mut lossy = self.lossy.lock().unwrap_or_else(PoisonError::into_inner);
        if *lossy {
            self.nft(&["delete", "table", "inet", LOSS_TABLE])?;
            *lossy = false;
        }
        self.nft(&["add", "table", "inet", LOSS_TABLE])?;
        *lossy = true;
        self.nft(&[
            "add",
            "chain",
            "inet",
            LOSS_TABLE,
            "forward",
            "{ type filter hook forward priority 0; }",
        ])?;
        self.nft(&[
            "add",
            "rule",
            "inet",
            LOSS_TABLE,
            "forward",
            "numgen",
            "random",
            "mod",
            "100",
            "<",
            &percent.to_string(),
            "drop",
        ])
    }

    /// Slow node `i`'s link both ways to `rate_kbit`, queueing up to `latency_ms` before
    /// dropping (a token bucket, `tc ... tbf`, on both ends of its veth): a congested link,
    /// whose packets wait longer the more is sent. The kernel of the project's machine has no
    /// `netem`, so this is how the tests delay packets on the real network. `Err` says why it
    /// cannot (no `tc` command, or no `tbf` in the kernel).
    ///
    /// # Errors
    /// The command that failed, with its message.
    pub fn slow(&self, i: usize, rate_kbit: u32, latency_ms: u32) -> Result<(), String> {
        let mut slowed = self.slowed.lock().unwrap_or_else(PoisonError::into_inner);
        let rate = format!("{rate_kbit}kbit");
        let latency = format!("{latency_ms}ms");
        let tbf = |ns: &str, dev: &str| {
            ip(&[
                "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                &rate, "burst", "16kbit", "latency", &latency,
            ])
        };
        tbf(&self.ns(i), "eth0")?;
        if !slowed.contains(&i) {
            slowed.push(i);
        }
        tbf(&self.router(), &format!("r{i}"))
    }

    /// Removes the token buckets of node `i`'s link.
    fn unslow(&self, i: usize) -> Result<(), String> {
        let del = |ns: &str, dev: &str| {
            ip(&[
                "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root",
            ])
        };
        let a = del(&self.ns(i), "eth0");
        // The router's end may not have been set if the first command failed.
        let _ = del(&self.router(), &format!("r{i}"));
        a
    }

    /// Delay every packet the router forwards, in every direction, by `delay` plus a uniform
    /// random share of `jitter` (which reorders packets whenever it is wider than the gap between
    /// two), as `tc qdisc ... netem delay D J` would; a delay already in place is replaced. `Err`
    /// says why it cannot (no `/dev/net/tun`, or the router refuses the rules).
    ///
    /// # Errors
    /// The step that failed, with its message.
    pub fn delay(&self, delay: Duration, jitter: Duration, seed: u64) -> Result<(), String> {
        let _ = self.undelay();
        let router = self.router();
        let ns = PathBuf::from(format!("/var/run/netns/{router}"));
        let delayer = Delayer::start(ns, DELAY_DEV, delay, jitter, seed)?;
        let set_up = || -> Result<(), String> {
            ip(&["-n", &router, "link", "set", DELAY_DEV, "up"])?;
            // A packet comes back out of the device with its original source, which strict
            // reverse-path filtering would drop.
            for conf in ["all", DELAY_DEV] {
                ip(&[
                    "netns",
                    "exec",
                    &router,
                    "sysctl",
                    "-q",
                    "-w",
                    &format!("net.ipv4.conf.{conf}.rp_filter=0"),
                ])?;
            }
            ip(&[
                "-n",
                &router,
                "route",
                "add",
                "default",
                "dev",
                DELAY_DEV,
                "table",
                DELAY_TABLE,
            ])?;
            for i in (1..=self.nodes).chain([CLIENT]) {
                ip(&[
                    "-n",
                    &router,
                    "rule",
                    "add",
                    "iif",
                    &format!("r{i}"),
                    "lookup",
                    DELAY_TABLE,
                    "pref",
                    DELAY_PREF,
                ])?;
            }
            Ok(())
        };
        // In place before the rules, so that `undelay` removes them after a partial failure.
        *self.delayer.lock().unwrap_or_else(PoisonError::into_inner) = Some(delayer);
        set_up().inspect_err(|_| {
            let _ = self.undelay();
        })
    }

    /// Ends the delay: the rules go first (no new packet enters the device), then the delayer
    /// releases what it holds and closes the device, which takes its route with it. What it did,
    /// or `None` when no delay was in place.
    pub fn undelay(&self) -> Option<DelayStats> {
        let delayer = self
            .delayer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        let router = self.router();
        // `ip rule del pref P` removes one rule a call; bounded by the number added.
        for _ in 0..=self.nodes + 1 {
            if ip(&["-n", &router, "rule", "del", "pref", DELAY_PREF]).is_err() {
                break;
            }
        }
        Some(delayer.stop())
    }

    /// Runs `nft args` in the router's namespace.
    fn nft(&self, args: &[&str]) -> Result<(), String> {
        let router = self.router();
        let mut all = vec!["netns", "exec", router.as_str(), "nft"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Remove every cut, the packet loss, the delay and the slowed links.
    ///
    /// # Panics
    /// When a rule cannot be removed.
    pub fn heal(&self) {
        let _ = self.undelay();
        let mut lossy = self.lossy.lock().unwrap_or_else(PoisonError::into_inner);
        if *lossy {
            self.nft(&["delete", "table", "inet", LOSS_TABLE])
                .unwrap_or_else(|e| panic!("{e}"));
            *lossy = false;
        }
        drop(lossy);
        let slowed =
            std::mem::take(&mut *self.slowed.lock().unwrap_or_else(PoisonError::into_inner));
        for i in slowed {
            self.unslow(i).unwrap_or_else(|e| panic!("{e}"));
        }
        let taken = std::mem::take(&mut *self.rules.lock().unwrap_or_else(PoisonError::into_inner));
        for (from, to) in taken {
            self.rule("del", from, to).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = self.undelay();
        // Deleting a namespace deletes its end of each veth, and so the pair.
        for i in (1..=self.nodes).chain([CLIENT]) {
            let _ = ip(&["netns", "del", &self.ns(i)]);
        }
        let _ = ip(&["netns", "del", &self.router()]);
    }
}

/// Moves the calling thread into the network namespace named by `path`.
///
/// # Errors
/// When the file cannot be opened or `setns` refuses.
pub fn enter(path: &std::path::Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    setns_fd(f.as_raw_fd()).map_err(|e| format!("setns {}: {e}", path.display()))
}

/// Moves the calling thread into the network namespace of the open file `fd` (only the system
/// call: safe to run between fork and exec).
///
/// # Errors
/// What `setns` answered.
pub fn setns_fd(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: setns on an open namespace file descriptor affects only the calling thread.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
