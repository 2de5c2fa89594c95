//! Faults on a real network: three nodes, each in its own network namespace behind a router
//! namespace (`queen_tests::netns`), and the test's client in another. Three producers, one
//! per partition, push numbered messages, each to the node that took the last one (every tenth
//! to the next node in turn), retrying it with the same transactionId on the next node until
//! one acknowledges it, while the test cuts the network under them, each fault held at least
//! five seconds: the leader isolated from both followers (both directions), the leader's
//! outgoing traffic cut (one way), a bridge (the leader cut from one follower only, the third
//! node seeing both sides), the leader paused with SIGSTOP, 10% packet loss, every packet
//! delayed 30-70 ms at random (so reordered), then 200-220 ms (a distant link), the leader's link slowed, and the leader killed
//! with SIGKILL and started again on its data, the leader stopped with SIGTERM (and started
//! again), a follower paused and a follower killed; two consumers of one group pop
//! and ack throughout. After each fault it heals and checks that writes went on. The checkers
//! then read every partition from each node: the same records in the same order on all three,
//! every acknowledged message exactly once, no transactionId twice, and each partition in its
//! producer's order; and the group: every acknowledged message consumed, none handed to a
//! consumer inside another's valid lease or after a confirmed ack. An isolated leader's
//! `/health` must turn non-200.
//!
//! Runs as root where `ip netns` works; elsewhere it prints a SKIPPED line and passes.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use queen_tests::linearizable::{self, KvInput, KvOutput, KvRegister, Verdict};
use queen_tests::netns::Net;
use queen_tests::{
    Node, eventually, folder_sink_env, or_skip, partition_txns, post_url_within, try_get_url,
};
use serde_json::{Value, json};

const HTTP: u16 = 6632;
const RAFT: u16 = 7400;
const QUEUE: &str = "faults";
const PARTITIONS: u64 = 3;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_queen"))
}

/// Three nodes in `net`'s namespaces (the same ports in each: every namespace has its own).
fn cluster(net: &Net, dir: &Path, lake: &Path) -> Vec<Node> {
    let lake_url = format!("file://{}", lake.display());
    let peers = (1..=3)
        .map(|i| format!("{i}={a}:{RAFT}/{a}:{HTTP}", a = net.addr(i)))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| {
            let id = i.to_string();
            // Every node runs the embedded S3 sink into one shared folder: the sink's leases
            // and fenced commits go through the log, under the same faults.
            let mut env = vec![
                ("QUEEN_RAFT_NODE_ID", id.as_str()),
                ("QUEEN_RAFT_PEERS", &peers),
                ("QUEEN_RAFT_TOKEN", "netns-faults"),
            ];
            env.extend(folder_sink_env(&lake_url));
            let mut n = Node::prepare(bin(), &dir.join(format!("n{i}")), HTTP, &env);
            n.in_netns(net.ns_path(i), &net.addr(i));
            n
        })
        .collect();
    for n in &mut nodes {
        n.launch();
    }
    net.as_client(|| {
        for n in &mut nodes {
            n.wait_healthy(Duration::from_secs(60));
        }
        // Healthy is not enough: a node still joining is a learner, which no isolation makes
        // unhealthy and no election needs. The faults start once all three vote.
        assert!(
            eventually(Duration::from_secs(60), || nodes.iter().all(|n| matches!(
                health(n).1["raft"]["role"].as_str(),
                Some("leader" | "follower")
            ))),
            "the three nodes never all became voters"
        );
    });
    nodes
}

fn health(n: &Node) -> (u16, Value) {
    try_get_url(&n.url("/health"), Duration::from_secs(2))
        .map(|(s, t)| (s, serde_json::from_str(&t).unwrap_or(Value::Null)))
        .unwrap_or((0, Value::Null))
}

/// The leader every reachable node agrees on (1-based), if any.
fn leader(nodes: &[Node]) -> Option<usize> {
    let mut seen = HashSet::new();
    for n in nodes {
        let (status, h) = health(n);
        if status == 200 {
            seen.insert(h["raft"]["leaderId"].as_u64()?);
        }
    }
    (seen.len() == 1).then(|| {
        seen.into_iter()
            .next()
            .and_then(|l| usize::try_from(l).ok())
    })?
}

/// What the producer did.
#[derive(Default)]
struct Log {
    /// (number, partition, when) of each acknowledged message, in acknowledgement order.
    acked: Vec<(u64, u64, Instant)>,
    /// Messages given up on after their time bound (they may or may not be stored).
    abandoned: Vec<u64>,
    /// Failed attempts (timeouts, refusals), each retried.
    failures: u64,
}

fn txn(k: u64) -> String {
    format!("m{k:07}")
}

/// Pushes to partition `p<part>` of `queue` the messages `m<part>000000`, `m<part>000001`, ...
/// one at a time, `pace` apart, retrying each with the same transactionId on the next node until
/// one acknowledges it (20 s at most), until `stop`. One producer per partition, so a
/// partition's order is its producer's.
fn produce(
    (nodes, queue, pace): (&[String], &str, Duration),
    stop: &AtomicBool,
    log: &Mutex<Log>,
    part: u64,
) {
    let mut k = part * 1_000_000;
    let mut last_ok = usize::try_from(part).unwrap_or(0);
    while !stop.load(Ordering::SeqCst) && k < part * 1_000_000 + 100_000 {
        let body = json!({"items": [{"queue": queue, "partition": format!("p{part}"), "transactionId": txn(k), "payload": {"k": k}}]}).to_string();
        let until = Instant::now() + Duration::from_secs(20);
        // The node that took the last one, as a client with failover does; every tenth message
        // starts at the next node in turn, so that every node keeps being tried.
        if k.is_multiple_of(10) {
            last_ok = usize::try_from(k / 10).unwrap_or(0) % nodes.len();
        }
        let mut at = last_ok;
        loop {
            let n = &nodes[at % nodes.len()];
            // 2 s for each attempt of the first round over the nodes, 4 s in the second and 8 s
            // after, as a client that adapts its deadline does: quick to fail over past a dead
            // or cut-off node, yet able to finish a write whose round trips are all slow
            // (through a distant link a push through a follower can take over 2 s).
            let tries = u32::try_from((at - last_ok) / nodes.len())
                .unwrap_or(2)
                .min(2);
            let within = Duration::from_secs(2) * (1 << tries);
            let ok = post_url_within(&format!("{n}/api/v1/push"), &body, within)
                .ok()
                .filter(|(s, _)| *s < 300)
                .and_then(|(_, t)| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| matches!(v[0]["status"].as_str(), Some("queued" | "duplicate")));
            let mut l = log.lock().unwrap();
            if ok {
                last_ok = at % nodes.len();
                l.acked.push((k, part, Instant::now()));
                break;
            }
            l.failures += 1;
            if Instant::now() > until {
                l.abandoned.push(k);
                break;
            }
            drop(l);
            at += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        k += 1;
        std::thread::sleep(pace);
    }
}

/// The lease a pop takes (the queue's `leaseTime`), short so that a delivery whose ack was lost
/// is handed out again within the test.
const LEASE: Duration = Duration::from_secs(3);
/// The consumer group the consumers share.
const GROUP: &str = "workers";
/// Consumers in the group.
const CONSUMERS: usize = 2;

/// One message handed to one consumer.
struct Delivery {
    txn: String,
    consumer: usize,
    /// When the pop was sent and when its answer came: the lease began between the two.
    sent: Instant,
    got: Instant,
    /// When the consumer sent the ack that the node confirmed (`success`, not a no-op), and
    /// when the confirmation came: the ack took effect between the two.
    acked: Option<(Instant, Instant)>,
}

/// A consumer of `GROUP`: pops up to 10 (no wait) from the node that answered it last, and acks
/// them as completed in one batch; a failed request moves it to the next node. Every delivery
/// and confirmed ack is kept in `seen`.
fn consume(nodes: &[String], stop: &AtomicBool, seen: &Mutex<Vec<Delivery>>, c: usize) {
    let mut at = c;
    let path = format!("/api/v1/pop/queue/{QUEUE}?consumerGroup={GROUP}&batch=10&wait=false");
    while !stop.load(Ordering::SeqCst) {
        let n = &nodes[at % nodes.len()];
        let sent = Instant::now();
        let answer = try_get_url(&format!("{n}{path}"), Duration::from_secs(2));
        let got = Instant::now();
        let popped = match answer {
            Ok((200, text)) => serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            Ok((204, _)) => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            _ => {
                at += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let msgs = popped["messages"].as_array().cloned().unwrap_or_default();
        let first = {
            let mut s = seen.lock().unwrap();
            let first = s.len();
            s.extend(msgs.iter().map(|m| Delivery {
                txn: m["transactionId"].as_str().unwrap_or_default().to_owned(),
                consumer: c,
                sent,
                got,
                acked: None,
            }));
            first
        };
        let acks: Vec<Value> = msgs
            .iter()
            .map(|m| json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": popped["leaseId"], "status": "completed"}))
            .collect();
        let ack_sent = Instant::now();
        let body = json!({"acknowledgments": acks, "consumerGroup": GROUP}).to_string();
        let answer = post_url_within(
            &format!("{n}/api/v1/ack/batch"),
            &body,
            Duration::from_secs(2),
        );
        let results = match answer {
            Ok((200, text)) => serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            _ => {
                at += 1;
                continue;
            }
        };
        let confirmed = Instant::now();
        let mut s = seen.lock().unwrap();
        for (i, r) in results.as_array().into_iter().flatten().enumerate() {
            if r["success"] == true
                && r["noop"] != true
                && let Some(d) = s.get_mut(first + i)
            {
                d.acked = Some((ack_sent, confirmed));
            }
        }
    }
}

/// The queue whose consumer fails every message, its group, and its `retryLimit`.
const DLQ_QUEUE: &str = "faults-dlq";
const DLQ_GROUP: &str = "failing";
const RETRY_LIMIT: usize = 2;
/// The dead-letter producer's partition (`p9`, messages `m9000000`, ...).
const DLQ_PART: u64 = 9;

/// What the failing consumer saw of one message.
#[derive(Default)]
struct Failing {
    /// When each pop that handed it out was sent.
    delivered: Vec<Instant>,
    /// When each `failed` ack the node confirmed (success, not a no-op) was answered.
    confirmed: Vec<Instant>,
    /// `failed` acks sent whose answer never came (they may have counted).
    unanswered: usize,
}

/// A consumer of `DLQ_GROUP` that pops one message at a time and acks it `failed`, so that every
/// message is dead-lettered after `RETRY_LIMIT` retries; a failed request moves it to the next
/// node.
fn fail_everything(nodes: &[String], stop: &AtomicBool, seen: &Mutex<BTreeMap<String, Failing>>) {
    let mut at = 1;
    let path =
        format!("/api/v1/pop/queue/{DLQ_QUEUE}?consumerGroup={DLQ_GROUP}&batch=1&wait=false");
    while !stop.load(Ordering::SeqCst) {
        let n = &nodes[at % nodes.len()];
        let sent = Instant::now();
        let popped = match try_get_url(&format!("{n}{path}"), Duration::from_secs(2)) {
            Ok((200, text)) => serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            Ok((204, _)) => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            _ => {
                at += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Some(m) = popped["messages"].get(0) else {
            continue;
        };
        let txn = m["transactionId"].as_str().unwrap_or_default().to_owned();
        seen.lock()
            .unwrap()
            .entry(txn.clone())
            .or_default()
            .delivered
            .push(sent);
        let body = json!({"transactionId": txn, "partitionId": m["partitionId"], "leaseId": popped["leaseId"], "status": "failed", "consumerGroup": DLQ_GROUP}).to_string();
        let answer = post_url_within(&format!("{n}/api/v1/ack"), &body, Duration::from_secs(2));
        let confirmed = Instant::now();
        let mut s = seen.lock().unwrap();
        let f = s.entry(txn).or_default();
        match answer
            .ok()
            .filter(|(status, _)| *status == 200)
            .and_then(|(_, t)| serde_json::from_str::<Value>(&t).ok())
        {
            // An array of one item.
            Some(v) => {
                if v[0]["success"] == true && v[0]["noop"] != true {
                    f.confirmed.push(confirmed);
                }
            }
            None => {
                f.unanswered += 1;
                at += 1;
            }
        }
    }
}

/// Every item of `messages` a listing route answers on node `n`, page by page (1000 a page,
/// 100 pages at most; `path` carries the route and its filters).
fn listed(n: &Node, path: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for page in 0..100 {
        let url = n.url(&format!("{path}&limit=1000&offset={}", page * 1000));
        let Ok((200, text)) = try_get_url(&url, Duration::from_secs(10)) else {
            break;
        };
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let full = msgs.len() == 1000;
        out.extend(msgs);
        if !full {
            break;
        }
    }
    out
}

/// The dead letters of `DLQ_GROUP`, by transactionId, as node `n` lists them (each id as many
/// times as it is listed).
fn dead_letters(n: &Node) -> Vec<String> {
    listed(
        n,
        &format!("/api/v1/dlq?queue={DLQ_QUEUE}&consumerGroup={DLQ_GROUP}"),
    )
    .iter()
    .map(|m| m["transactionId"].as_str().unwrap_or_default().to_owned())
    .collect()
}

/// The dead-letter checker: every acknowledged push dead-lettered exactly once, nothing else
/// dead-lettered, none before `RETRY_LIMIT + 1` failed acks were sent for it, no more than that
/// many confirmed, and none handed out again after its last allowed failure was confirmed.
fn dlq_anomalies(
    (acked, abandoned): (&[String], &[String]),
    dead: &[String],
    seen: &BTreeMap<String, Failing>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for d in dead {
        *counts.entry(d.as_str()).or_default() += 1;
    }
    let wanted: HashSet<&str> = acked.iter().map(String::as_str).collect();
    for (t, n) in &counts {
        if *n > 1 {
            out.push(format!("{t} dead-lettered {n} times"));
        }
        // A push given up on (no answer within 20 s) may have been stored all the same.
        if !wanted.contains(t) && !abandoned.iter().any(|a| a == t) {
            out.push(format!("{t} dead-lettered but never pushed"));
        }
        let f = seen.get(*t);
        let sent = f.map_or(0, |f| f.confirmed.len() + f.unanswered);
        if sent <= RETRY_LIMIT {
            out.push(format!("{t} dead-lettered after only {sent} failed acks"));
        }
    }
    for t in acked {
        if !counts.contains_key(t.as_str()) {
            out.push(format!("{t} acknowledged but not dead-lettered"));
        }
    }
    for (t, f) in seen {
        if f.confirmed.len() > RETRY_LIMIT + 1 {
            out.push(format!("{t}: {} failed acks confirmed", f.confirmed.len()));
        }
        if let Some(last) = f.confirmed.get(RETRY_LIMIT)
            && let Some(after) = f.delivered.iter().find(|d| *d > last)
        {
            out.push(format!(
                "{t} handed out {:?} after its last allowed failure was confirmed",
                after.duration_since(*last)
            ));
        }
    }
    out
}

/// Each message's status for `GROUP` as node `n` browses it (`pending`, `processing`,
/// `completed`, `dead_letter`), by transactionId.
fn group_status(n: &Node) -> BTreeMap<String, String> {
    listed(
        n,
        &format!("/api/v1/messages?queue={QUEUE}&consumerGroup={GROUP}"),
    )
    .iter()
    .map(|m| {
        (
            m["transactionId"].as_str().unwrap_or_default().to_owned(),
            m["status"].as_str().unwrap_or_default().to_owned(),
        )
    })
    .collect()
}

/// The consumer group's anomalies: a message handed out while another consumer's lease on it
/// was surely still valid and unacknowledged, and a message handed out after an ack of it was
/// confirmed. (A lease begins between its pop's send and answer, so it surely lasts until the
/// send plus `LEASE`; an ack ends it between its send and its confirmation. Every request is
/// bounded to 2 s, less than `LEASE`, so a pair listed in the order their answers came cannot
/// be a legitimate hand-over in the other order.)
fn group_anomalies(seen: &[Delivery]) -> (Vec<String>, usize) {
    let mut by_txn: BTreeMap<&str, Vec<&Delivery>> = BTreeMap::new();
    for d in seen {
        by_txn.entry(d.txn.as_str()).or_default().push(d);
    }
    let mut anomalies = Vec::new();
    let mut redelivered = 0;
    for (txn, ds) in &by_txn {
        redelivered += ds.len() - 1;
        for (i, a) in ds.iter().enumerate() {
            for b in &ds[i + 1..] {
                let lease_end = a
                    .acked
                    .map_or(a.sent + LEASE, |(sent, _)| sent.min(a.sent + LEASE));
                if b.got < lease_end {
                    anomalies.push(format!(
                        "{txn}: consumer {} got it {:?} after consumer {} did, inside that lease",
                        b.consumer,
                        b.got.duration_since(a.sent),
                        a.consumer
                    ));
                }
                if let Some((_, t)) = a.acked
                    && b.sent > t
                {
                    anomalies.push(format!(
                        "{txn}: handed to consumer {} {:?} after consumer {}'s ack was confirmed",
                        b.consumer,
                        b.sent.duration_since(t),
                        a.consumer
                    ));
                }
            }
        }
    }
    (anomalies, redelivered)
}

/// KV registers the KV clients share, and the clients.
const KV_KEYS: u64 = 4;
const KV_CLIENTS: u64 = 3;

/// What the KV clients did.
#[derive(Default)]
struct KvLog {
    /// Each operation with its key.
    ops: Vec<(u64, linearizable::Op<KvInput, KvOutput>)>,
    /// (value, version) pairs the answers named.
    versions: Vec<(i64, u64)>,
}

/// A small deterministic generator (xorshift64*): the workload needs no cryptographic randomness.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// One KV operation through node `n`: its answer (the first result), or `None` when none came
/// within 2 s or the node refused (the operation may or may not have taken effect).
fn kv_call(n: &str, op: &Value, versions: &mut Vec<(i64, u64)>) -> Option<Value> {
    let body = json!({"operations": [op]}).to_string();
    let (status, text) =
        post_url_within(&format!("{n}/api/v1/kv"), &body, Duration::from_secs(2)).ok()?;
    if status != 200 {
        return None;
    }
    let r = serde_json::from_str::<Value>(&text).ok()?["results"][0].take();
    if let (Some(v), Some(ver)) = (r["value"].as_i64(), r["version"].as_u64()) {
        versions.push((v, ver));
    }
    (r.is_object()).then_some(r)
}

/// A KV client: reads, upserts, creates, compare-and-sets and deletes (the last two with the
/// version a read just gave) on `KV_KEYS` registers through the nodes, each value written once,
/// moving to the next node after a failure and every seventh operation. Each operation is
/// logged with when it was sent and when (and what) it was answered.
fn kv_client(nodes: &[String], stop: &AtomicBool, log: &Mutex<KvLog>, c: u64) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (c + 1) ^ knobs().seed.wrapping_mul(0x1000_0001));
    let mut at = usize::try_from(c).unwrap_or(0);
    let mut written = 0_i64;
    let mut versions = Vec::new();
    let mut count = 0_u64;
    while !stop.load(Ordering::SeqCst) && count < 100_000 {
        count += 1;
        if count.is_multiple_of(7) {
            at += 1;
        }
        let node = &nodes[at % nodes.len()];
        let key = rng.below(KV_KEYS);
        let k = format!("k{key}");
        let choice = rng.below(10);
        written += 1;
        let value = i64::try_from(c + 1).unwrap_or(1) * 1_000_000_000 + written;
        let mut ops = Vec::new();
        // A compare-and-set or delete reads first, and expects what it read.
        let mut read = None;
        if choice >= 7 {
            let call = Instant::now();
            let r = kv_call(
                node,
                &json!({"op": "get", "ns": "lin", "key": k}),
                &mut versions,
            );
            let Some(r) = r else {
                at += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            let found = (r["found"] == true).then(|| r["value"].as_i64()).flatten();
            ops.push((call, Some(KvOutput::Read(found)), KvInput::Get));
            read = found.zip(r["version"].as_u64());
        }
        let (input, op) = match (choice, read) {
            (0..=3, _) => (KvInput::Get, json!({"op": "get", "ns": "lin", "key": k})),
            (4 | 5, _) => (
                KvInput::Put(value),
                json!({"op": "put", "ns": "lin", "key": k, "value": value, "forever": true}),
            ),
            (6..=8, None) => (
                KvInput::PutIfAbsent(value),
                json!({"op": "putIfAbsent", "ns": "lin", "key": k, "value": value, "forever": true}),
            ),
            (7 | 8, Some((expect, version))) => (
                KvInput::Cas { expect, value },
                json!({"op": "put", "ns": "lin", "key": k, "value": value, "expect": version, "forever": true}),
            ),
            (_, Some((expect, version))) => (
                KvInput::Delete { expect },
                json!({"op": "delete", "ns": "lin", "key": k, "expect": version}),
            ),
            (_, None) => (KvInput::Get, json!({"op": "get", "ns": "lin", "key": k})),
        };
        let call = Instant::now();
        let answer = kv_call(node, &op, &mut versions).and_then(|r| match input {
            KvInput::Get => Some(KvOutput::Read(
                (r["found"] == true).then(|| r["value"].as_i64()).flatten(),
            )),
            _ => match r["applied"].as_bool()? {
                true => Some(KvOutput::Applied),
                false => Some(KvOutput::Refused(r["value"].as_i64())),
            },
        });
        if answer.is_none() {
            at += 1;
        }
        // A read without an answer tells nothing; a write without one may have happened.
        if answer.is_some() || !matches!(input, KvInput::Get) {
            ops.push((call, answer, input));
        }
        let done = Instant::now();
        let mut l = log.lock().unwrap();
        l.versions.append(&mut versions);
        for (call, answer, input) in ops {
            let ret = answer.map(|a| (done, a));
            l.ops.push((key, linearizable::Op { call, ret, input }));
        }
        drop(l);
        if answer.is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The KV checkers: each register's history linearizable, and each value at one version (and
/// each version one value). Counts, or what failed.
fn kv_check(log: KvLog) -> Result<String, String> {
    let mut failures = Vec::new();
    let mut by_value: BTreeMap<i64, u64> = BTreeMap::new();
    let mut by_version: BTreeMap<u64, i64> = BTreeMap::new();
    for (v, ver) in &log.versions {
        if *by_value.entry(*v).or_insert(*ver) != *ver
            || *by_version.entry(*ver).or_insert(*v) != *v
        {
            failures.push(format!(
                "value {v} and version {ver} do not pair one to one"
            ));
        }
    }
    let answered = log.ops.iter().filter(|(_, o)| o.ret.is_some()).count();
    // How many conditional writes won: a history of refusals alone would prove little.
    let won = |f: fn(&KvInput) -> bool| {
        log.ops
            .iter()
            .filter(|(_, o)| f(&o.input) && matches!(o.ret, Some((_, KvOutput::Applied))))
            .count()
    };
    let kinds = format!(
        "{} creations, {} compare-and-sets and {} deletes applied",
        won(|i| matches!(i, KvInput::PutIfAbsent(_))),
        won(|i| matches!(i, KvInput::Cas { .. })),
        won(|i| matches!(i, KvInput::Delete { .. }))
    );
    let unanswered = log.ops.len() - answered;
    for key in 0..KV_KEYS {
        let ops: Vec<_> = log
            .ops
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, o)| o.clone())
            .collect();
        let ops = linearizable::kv_without_unseen_writes(ops);
        let started = Instant::now();
        let verdict = linearizable::check(&KvRegister, &ops, Duration::from_secs(60), 5_000_000);
        println!(
            "KV register k{key}: {} operations checked in {:?}: {verdict:?}",
            ops.len(),
            started.elapsed()
        );
        if verdict != Verdict::Linearizable {
            failures.push(format!("k{key}: {verdict:?}"));
        }
    }
    let summary = format!(
        "KV: {answered} operations answered ({kinds}), {unanswered} writes unanswered, {} values with versions, {} not linearizable",
        by_value.len(),
        failures.len()
    );
    if failures.is_empty() {
        Ok(summary)
    } else {
        Err(format!("{summary}\n{}", failures.join("\n")))
    }
}

/// Waits until writes acknowledged grow by `more` (within `limit`); the count reached.
fn progress(log: &Mutex<Log>, more: usize, limit: Duration) -> Result<usize, usize> {
    let from = log.lock().unwrap().acked.len();
    let got = eventually(limit, || log.lock().unwrap().acked.len() >= from + more);
    let now = log.lock().unwrap().acked.len();
    if got { Ok(now) } else { Err(now) }
}

/// Sleeps until `hold` has passed since `since`.
fn hold_since(since: Instant, hold: Duration) {
    if let Some(left) = (since + hold).checked_duration_since(Instant::now()) {
        std::thread::sleep(left);
    }
}

/// The share of packets dropped under the packet-loss fault.
const LOSS_PERCENT: u8 = 10;

/// The delay fault: every packet the router forwards waits `DELAY` plus a uniform random share of
/// `JITTER` (wider than the gap between packets under load, so they are reordered too).
const DELAY: Duration = Duration::from_millis(30);
const JITTER: Duration = Duration::from_millis(40);

/// The distant-link fault: 200-220 ms each way, a round trip four times the heartbeat interval
/// (openraft gives a heartbeat one interval to be answered, so every heartbeat times out and
/// only appends carry the leader's contact). Wider jitter is in `docs/reliability.md`.
const FAR_DELAY: Duration = Duration::from_millis(200);
const FAR_JITTER: Duration = Duration::from_millis(20);

/// Writes acknowledged under each fault before it is healed (and at least `HOLD`).
const WRITES: usize = 60;
/// Under the distant link a push is several round trips of 400-440 ms and the three producers
/// write one or two a second between them: it must still go on, at this many.
const FAR_WRITES: usize = 20;

/// The slow-link fault: the leader's link carries this many kbit/s each way and queues up to
/// `SLOW_LATENCY_MS` before dropping.
const SLOW_KBIT: u32 = 256;
const SLOW_LATENCY_MS: u32 = 400;

/// The longest time without an acknowledged write under any fault: an election and a client's
/// retries on the other nodes (2 s per attempt) take a few seconds on a loaded machine.
const MAX_WAIT: Duration = Duration::from_secs(12);

/// How long each fault stays in place at least (past the election timeouts).
const HOLD: Duration = Duration::from_secs(5);

/// The campaign's knobs (`bench/faults.sh` sets them; CI runs the defaults): `QUEEN_FAULTS_SEED`
/// shuffles the faults' order and seeds the KV clients (0, the default, keeps the order above),
/// `QUEEN_FAULTS_HOLD_S` holds each fault longer than `HOLD`, `QUEEN_FAULTS_ROUNDS` runs the
/// whole list that many times (1 to 20), `QUEEN_FAULTS_ONLY` runs only the faults named there
/// (comma-separated names as printed, such as `a follower isolated,the leader paused`), in that
/// order, and `QUEEN_FAULTS_KEEP=1` keeps the directories.
struct Knobs {
    seed: u64,
    hold: Duration,
    rounds: usize,
    only: Option<Vec<String>>,
}

#[allow(
    clippy::disallowed_methods,
    reason = "a test: its seed, rounds and scenarios"
)]
fn knobs() -> Knobs {
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    Knobs {
        seed: num("QUEEN_FAULTS_SEED").unwrap_or(0),
        hold: num("QUEEN_FAULTS_HOLD_S").map_or(HOLD, |s| Duration::from_secs(s.clamp(5, 600))),
        rounds: num("QUEEN_FAULTS_ROUNDS")
            .map_or(1, |r| usize::try_from(r.clamp(1, 20)).unwrap_or(1)),
        only: std::env::var("QUEEN_FAULTS_ONLY")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.split(',').map(|n| n.trim().to_owned()).collect()),
    }
}

/// The longest time without an acknowledgement since `since` (from `since` to the first one,
/// and between any two after it), to now.
fn longest_gap(log: &Mutex<Log>, since: Instant) -> Duration {
    let l = log.lock().unwrap();
    let mut last = since;
    let mut gap = Duration::ZERO;
    let acked = l.acked.iter().map(|(_, _, t)| *t).filter(|t| *t >= since);
    for t in acked.chain([Instant::now()]) {
        gap = gap.max(t.duration_since(last));
        last = t;
    }
    gap
}

fn wait_leader(nodes: &[Node], limit: Duration) -> usize {
    let mut l = None;
    assert!(
        eventually(limit, || {
            l = leader(nodes);
            l.is_some()
        }),
        "no leader that every node agrees on"
    );
    l.expect("a leader")
}

/// One fault under the producers: `make(leader)` makes it and names it, `check(leader)` may
/// look at the cluster under it; then at least `writes` more acknowledged writes and `HOLD` from its
/// start, and `undo(leader)` ends it; once every node is healthy again, `after(leader)` may
/// check how the cluster came back. Each step is printed and kept in `events`.
struct Fault<'a> {
    name: &'a str,
    /// Writes that must be acknowledged under it (within 60 s).
    writes: usize,
    make: &'a dyn Fn(usize) -> String,
    check: &'a dyn Fn(usize) -> Result<String, String>,
    undo: &'a dyn Fn(usize) -> String,
    after: &'a dyn Fn(usize) -> Result<String, String>,
}

/// The faults, one after another under the producers; after each, writes must go on. The
/// events, or what failed with them.
fn faults(
    net: &Net,
    nodes: &Mutex<Vec<Node>>,
    log: &Mutex<Log>,
    started: Instant,
) -> Result<Vec<String>, (String, Vec<String>)> {
    let mut events = Vec::new();
    let mut step = |what: String| {
        let line = format!("{:>6.1} s  {what}", started.elapsed().as_secs_f64());
        println!("{line}");
        events.push(line);
    };
    let none = |_: usize| Ok(String::new());
    // A node cut off from the majority must say so on /health within 20 s.
    let unhealthy = |i: usize, what: &str| {
        let since = Instant::now();
        if eventually(Duration::from_secs(20), || {
            health(&nodes.lock().unwrap()[i - 1]).0 != 200
        }) {
            Ok(format!(
                "the {what} {i}'s /health is non-200 after {:.1} s",
                since.elapsed().as_secs_f64()
            ))
        } else {
            Err(format!("the {what} {i} kept answering 200 on /health"))
        }
    };
    let heal = |_: usize| {
        net.heal();
        "healed".to_owned()
    };
    // The leader's term when a follower was cut off: with pre-vote, the follower cannot raise
    // the term while alone, so its return must not depose the leader.
    let term_before = Mutex::new(None::<(usize, u64)>);
    let term_of = |i: usize| health(&nodes.lock().unwrap()[i - 1]).1["raft"]["term"].as_u64();
    // What the delay faults' delayer did, from its undo to its check.
    let delayed = Mutex::new(None::<queen_tests::netdelay::DelayStats>);
    let delay = |d: Duration, j: Duration| match net.delay(d, j, knobs().seed) {
        Ok(()) => format!(
            "delay every packet {}-{} ms at random (reordering them), in every direction",
            d.as_millis(),
            (d + j).as_millis()
        ),
        Err(e) => format!("SKIPPED delay: {e} (needs /dev/net/tun)"),
    };
    let undelay = |_: usize| {
        let stats = net.undelay();
        *delayed.lock().unwrap() = stats;
        net.heal();
        stats.map_or_else(|| "healed".to_owned(), |s| format!("healed; {s}"))
    };
    // The fault must have happened: packets held, and some overtaken.
    let delayed_check = |_: usize| match delayed.lock().unwrap().take() {
        Some(s) if s.packets == 0 || s.reordered == 0 => {
            Err(format!("the delay fault did nothing: {s}"))
        }
        _ => Ok(String::new()),
    };
    let list = [
        Fault {
            name: "the leader isolated",
            writes: WRITES,
            make: &|l| {
                net.isolate(l);
                format!("isolate leader {l} from both followers")
            },
            // A leader without a majority says so on /health.
            check: &|l| unhealthy(l, "isolated leader"),
            undo: &heal,
            after: &none,
        },
        Fault {
            name: "a follower isolated",
            writes: WRITES,
            make: &|l| {
                let f = l % 3 + 1;
                *term_before.lock().unwrap() = term_of(l).map(|t| (l, t));
                net.isolate(f);
                format!("isolate follower {f} from both other nodes")
            },
            check: &|l| unhealthy(l % 3 + 1, "isolated follower"),
            undo: &heal,
            after: &|_| {
                let Some((l, t)) = *term_before.lock().unwrap() else {
                    return Ok(String::new());
                };
                // Give a disruptive return time to show: a few election timeouts.
                std::thread::sleep(Duration::from_secs(3));
                let now_leader = leader(&nodes.lock().unwrap());
                let now = (now_leader, term_of(l));
                if now == (Some(l), Some(t)) {
                    Ok(format!("the follower rejoined; leader {l} kept term {t}"))
                } else {
                    Err(format!(
                        "the follower's return disrupted leader {l} of term {t}: now leader {:?}, term {:?}",
                        now.0, now.1
                    ))
                }
            },
        },
        Fault {
            name: "the leader mute",
            writes: WRITES,
            make: &|l| {
                for j in (1..=3).filter(|j| *j != l) {
                    net.cut_one_way(l, j);
                }
                format!("cut leader {l}'s outgoing traffic (it still hears the others)")
            },
            check: &|l| {
                // It hears the others but they do not hear it: cut off, it must say so.
                unhealthy(l, "muted leader")
            },
            undo: &heal,
            after: &none,
        },
        Fault {
            name: "a bridge",
            writes: WRITES,
            make: &|l| {
                let other = if l == 1 { 2 } else { 1 };
                net.cut(l, other);
                format!("cut {l} <-> {other} (the third node sees both)")
            },
            check: &none,
            undo: &heal,
            after: &none,
        },
        Fault {
            name: "the leader paused",
            writes: WRITES,
            make: &|l| {
                nodes.lock().unwrap()[l - 1].signal("-STOP");
                format!("SIGSTOP leader {l}")
            },
            check: &none,
            undo: &|l| {
                nodes.lock().unwrap()[l - 1].signal("-CONT");
                format!("SIGCONT {l}")
            },
            after: &none,
        },
        Fault {
            name: "packet loss",
            writes: WRITES,
            make: &|_| match net.lose(LOSS_PERCENT) {
                Ok(()) => format!("drop {LOSS_PERCENT}% of all packets, in every direction"),
                Err(e) => format!("SKIPPED packet loss: {e} (needs the nft command)"),
            },
            check: &none,
            undo: &heal,
            after: &none,
        },
        Fault {
            name: "delay and reordering",
            writes: WRITES,
            make: &|_| delay(DELAY, JITTER),
            check: &none,
            undo: &undelay,
            after: &delayed_check,
        },
        Fault {
            name: "a distant link",
            writes: FAR_WRITES,
            make: &|_| delay(FAR_DELAY, FAR_JITTER),
            check: &none,
            undo: &undelay,
            after: &delayed_check,
        },
        Fault {
            name: "the leader's link slow",
            writes: WRITES,
            make: &|l| match net.slow(l, SLOW_KBIT, SLOW_LATENCY_MS) {
                Ok(()) => format!(
                    "slow leader {l}'s link to {SLOW_KBIT} kbit/s each way, queueing up to {SLOW_LATENCY_MS} ms"
                ),
                Err(e) => format!("SKIPPED slow link: {e} (needs tc with tbf)"),
            },
            check: &none,
            undo: &heal,
            after: &none,
        },
        Fault {
            name: "the leader killed",
            writes: WRITES,
            make: &|l| {
                nodes.lock().unwrap()[l - 1].kill9();
                format!("kill -9 leader {l}")
            },
            check: &none,
            undo: &|l| {
                nodes.lock().unwrap()[l - 1].launch();
                format!("node {l} started again on its data")
            },
            after: &none,
        },
        Fault {
            name: "the leader stopped",
            writes: WRITES,
            make: &|l| {
                let since = Instant::now();
                let status = nodes.lock().unwrap()[l - 1].sigterm(Duration::from_secs(60));
                format!(
                    "SIGTERM leader {l} (it hands leadership over first): {status} after {:.1} s",
                    since.elapsed().as_secs_f64()
                )
            },
            check: &none,
            undo: &|l| {
                nodes.lock().unwrap()[l - 1].launch();
                format!("node {l} started again on its data")
            },
            after: &none,
        },
        Fault {
            name: "a follower paused",
            writes: WRITES,
            make: &|l| {
                let f = l % 3 + 1;
                nodes.lock().unwrap()[f - 1].signal("-STOP");
                format!("SIGSTOP follower {f}")
            },
            check: &none,
            undo: &|l| {
                let f = l % 3 + 1;
                nodes.lock().unwrap()[f - 1].signal("-CONT");
                format!("SIGCONT {f}")
            },
            after: &none,
        },
        Fault {
            name: "a follower killed",
            writes: WRITES,
            make: &|l| {
                let f = l % 3 + 1;
                nodes.lock().unwrap()[f - 1].kill9();
                format!("kill -9 follower {f}")
            },
            check: &none,
            undo: &|l| {
                let f = l % 3 + 1;
                nodes.lock().unwrap()[f - 1].launch();
                format!("node {f} started again on its data")
            },
            after: &none,
        },
    ];
    let k = knobs();
    // The order: as listed for seed 0, else a shuffle of each round by the seed.
    let mut order = Vec::new();
    let mut rng = Rng(k.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for _ in 0..k.rounds {
        let mut round: Vec<usize> = (0..list.len()).collect();
        if let Some(only) = &k.only {
            round = only
                .iter()
                .map(|n| {
                    list.iter()
                        .position(|f| f.name == n)
                        .unwrap_or_else(|| panic!("QUEEN_FAULTS_ONLY: no fault named {n:?}"))
                })
                .collect();
        } else if k.seed != 0 {
            for i in (1..round.len()).rev() {
                let j = usize::try_from(rng.below(i as u64 + 1)).unwrap_or(0);
                round.swap(i, j);
            }
        }
        order.extend(round);
    }
    let mut run = || -> Result<(), String> {
        let l = wait_leader(&nodes.lock().unwrap(), Duration::from_secs(30));
        progress(log, 20, Duration::from_secs(30))
            .map_err(|n| format!("no warm-up writes ({n})"))?;
        step(format!(
            "warm: leader {l}; seed {}, {} faults, each held {:?} at least",
            k.seed,
            order.len(),
            k.hold
        ));
        for f in order.iter().map(|i| &list[*i]) {
            let l = wait_leader(&nodes.lock().unwrap(), Duration::from_secs(30));
            let since = Instant::now();
            let (acked_before, failed_before) = {
                let g = log.lock().unwrap();
                (g.acked.len(), g.failures)
            };
            step((f.make)(l));
            let checked = (f.check)(l);
            let more = checked.and_then(|c| {
                if !c.is_empty() {
                    step(c);
                }
                progress(log, f.writes, Duration::from_secs(60))
                    .map_err(|n| format!("no writes under {} ({n} in all)", f.name))
            });
            hold_since(since, k.hold);
            let gap = longest_gap(log, since);
            let (acked, failed) = {
                let g = log.lock().unwrap();
                (g.acked.len() - acked_before, g.failures - failed_before)
            };
            let undone = (f.undo)(l);
            more?;
            // Writes must go on under every fault, not merely come back after it: a stall of a
            // healthy majority (about 20 s, found by the long campaign: forwards held by a
            // paused leader) fails the run.
            if gap > MAX_WAIT {
                return Err(format!(
                    "under {}: no write acknowledged for {:.1} s (at most {MAX_WAIT:?})",
                    f.name,
                    gap.as_secs_f64()
                ));
            }
            step(format!(
                "under {}: {acked} writes acknowledged, {failed} attempts failed, longest wait between acknowledgements {:.1} s; {undone}",
                f.name,
                gap.as_secs_f64()
            ));
            for (i, n) in nodes.lock().unwrap().iter().enumerate() {
                if !eventually(Duration::from_secs(30), || health(n).0 == 200) {
                    return Err(format!("node {} unhealthy 30 s after {}", i + 1, f.name));
                }
            }
            let back = (f.after)(l)?;
            if !back.is_empty() {
                step(back);
            }
        }
        progress(log, 20, Duration::from_secs(30))
            .map_err(|n| format!("no writes after the last fault ({n})"))?;
        step("every node healthy; writes go on".into());
        Ok(())
    };
    let result = run();
    net.heal();
    match result {
        Ok(()) => Ok(events),
        Err(e) => Err((e, events)),
    }
}

#[test]
fn partitions_and_pauses_lose_double_and_reorder_nothing() {
    let Some(net) = or_skip(
        Net::new(3),
        "network-namespace fault test",
        "needs root and `ip netns`",
    ) else {
        return;
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    // `QUEEN_FAULTS_KEEP=1` keeps the nodes' directories and logs for a post-mortem.
    #[allow(
        clippy::disallowed_methods,
        reason = "a test: whether to keep the nodes' files"
    )]
    let root = if std::env::var("QUEEN_FAULTS_KEEP").is_ok_and(|v| v == "1") {
        let kept = dir.keep();
        println!("keeping the nodes' directories in {}", kept.display());
        kept
    } else {
        dir.path().to_path_buf()
    };
    let lake = root.join("lake");
    let nodes = cluster(&net, &root, &lake);
    // The workload reaches the nodes by address; the faults stop and start them.
    let urls: Vec<String> = nodes.iter().map(|n| n.url("")).collect();
    let nodes = Mutex::new(nodes);
    let stop = AtomicBool::new(false);
    let consumers_stop = AtomicBool::new(false);
    let log = Mutex::new(Log::default());
    let seen: Mutex<Vec<Delivery>> = Mutex::new(Vec::new());
    let kv_log = Mutex::new(KvLog::default());
    let dlq_log = Mutex::new(Log::default());
    let failing: Mutex<BTreeMap<String, Failing>> = Mutex::new(BTreeMap::new());
    let mut dead = Vec::new();

    // Everything below runs in the client's namespace: the producer (a thread of its own, which
    // starts there too), the checks, and the faults (made with `ip -n <router>`, from anywhere).
    let reads: Vec<BTreeMap<u64, Vec<String>>> = net.as_client(|| {
        let configured = nodes.lock().unwrap()[0].post(
            "/api/v1/configure",
            &json!({"queue": QUEUE, "options": {"leaseTime": LEASE.as_secs(), "retryLimit": 1000}}),
        );
        assert_eq!(configured.status, 200, "{}", configured.text);
        let configured = nodes.lock().unwrap()[0].post(
            "/api/v1/configure",
            &json!({"queue": DLQ_QUEUE, "options": {"leaseTime": LEASE.as_secs(), "retryLimit": RETRY_LIMIT, "dlqAfterMaxRetries": true}}),
        );
        assert_eq!(configured.status, 200, "{}", configured.text);
        let outcome = std::thread::scope(|s| {
            // A slower producer of messages that one consumer fails every time.
            let dlq_producer = {
                let (nodes, stop, log) = (&urls, &stop, &dlq_log);
                s.spawn(move || {
                    produce((nodes, DLQ_QUEUE, Duration::from_millis(150)), stop, log, DLQ_PART);
                })
            };
            let failer = {
                let (nodes, stop, seen) = (&urls, &consumers_stop, &failing);
                s.spawn(move || fail_everything(nodes, stop, seen))
            };
            let producers: Vec<_> = (0..PARTITIONS)
                .map(|p| {
                    let (nodes, stop, log) = (&urls, &stop, &log);
                    s.spawn(move || produce((nodes, QUEUE, Duration::ZERO), stop, log, p))
                })
                .collect();
            let consumers: Vec<_> = (0..CONSUMERS)
                .map(|c| {
                    let (nodes, stop, seen) = (&urls, &consumers_stop, &seen);
                    s.spawn(move || consume(nodes, stop, seen, c))
                })
                .collect();
            let kv_clients: Vec<_> = (0..KV_CLIENTS)
                .map(|c| {
                    let (nodes, stop, log) = (&urls, &stop, &kv_log);
                    s.spawn(move || kv_client(nodes, stop, log, c))
                })
                .collect();
            let outcome = faults(&net, &nodes, &log, started);
            stop.store(true, Ordering::SeqCst);
            for p in producers.into_iter().chain(kv_clients).chain([dlq_producer]) {
                p.join().expect("a producer");
            }
            // The group consumes every acknowledged message (bounded).
            let want: HashSet<String> = log
                .lock()
                .unwrap()
                .acked
                .iter()
                .map(|(k, _, _)| txn(*k))
                .collect();
            // A message counts as consumed when an ack of it was confirmed, or when the group's
            // state says completed (an ack that took effect but whose answer was lost: it is
            // never handed out again, and the consumer cannot know).
            let unconfirmed = || -> Vec<String> {
                let s = seen.lock().unwrap();
                let done: HashSet<&str> = s
                    .iter()
                    .filter(|d| d.acked.is_some())
                    .map(|d| d.txn.as_str())
                    .collect();
                want.iter()
                    .filter(|t| !done.contains(t.as_str()))
                    .cloned()
                    .collect()
            };
            let mut lost_answers = Vec::new();
            let mut missing = Vec::new();
            let drained = eventually(Duration::from_secs(40), || {
                let open = unconfirmed();
                if open.is_empty() {
                    return true;
                }
                let status = group_status(&nodes.lock().unwrap()[0]);
                (lost_answers, missing) = open
                    .into_iter()
                    .partition(|t| status.get(t).is_some_and(|s| s == "completed"));
                missing.is_empty()
            });
            // Every message of the failing consumer's queue dead-lettered (bounded).
            let dlq_want: HashSet<String> =
                dlq_log.lock().unwrap().acked.iter().map(|(k, _, _)| txn(*k)).collect();
            eventually(Duration::from_secs(60), || {
                dead = dead_letters(&nodes.lock().unwrap()[0]);
                dlq_want.iter().all(|t| dead.contains(t))
            });
            consumers_stop.store(true, Ordering::SeqCst);
            failer.join().expect("the failing consumer");
            for c in consumers {
                c.join().expect("a consumer");
            }
            println!(
                "acks that took effect with their answer lost: {} {lost_answers:?}",
                lost_answers.len()
            );
            // What the group's state says of those left, and what the consumers saw of them.
            let status = group_status(&nodes.lock().unwrap()[0]);
            let missing = missing
                .iter()
                .map(|t| {
                    let s = seen.lock().unwrap();
                    let got: Vec<String> = s
                        .iter()
                        .filter(|d| d.txn == *t)
                        .map(|d| {
                            format!(
                                "consumer {} at {:.1} s, acked {}",
                                d.consumer,
                                d.got.duration_since(started).as_secs_f64(),
                                d.acked.is_some()
                            )
                        })
                        .collect();
                    format!(
                        "{t}: {} (deliveries: {got:?})",
                        status.get(t).map_or("absent", String::as_str)
                    )
                })
                .collect::<Vec<_>>();
            outcome.and_then(|events| {
                if drained {
                    Ok(events)
                } else {
                    Err((
                        format!(
                            "the group did not consume {} acknowledged messages within 40 s:\n{}",
                            missing.len(),
                            missing.join("\n")
                        ),
                        events,
                    ))
                }
            })
        });
        if let Err((e, events)) = outcome {
            panic!("{e}\n{}", events.join("\n"));
        }
        // Every node settles on the same log holding every acknowledged write.
        let want = log.lock().unwrap().acked.len();
        let mut reads = Vec::new();
        let settled = eventually(Duration::from_secs(30), || {
            reads = nodes
                .lock()
                .unwrap()
                .iter()
                .map(|n| {
                    (0..PARTITIONS)
                        .map(|p| {
                            (
                                p,
                                partition_txns(n, QUEUE, &format!("p{p}")).unwrap_or_default(),
                            )
                        })
                        .collect::<BTreeMap<_, _>>()
                })
                .collect::<Vec<_>>();
            reads.iter().all(|r| *r == reads[0])
                && reads[0].values().map(Vec::len).sum::<usize>() >= want
        });
        assert!(
            settled,
            "the nodes' logs differ or miss writes 30 s after the last fault"
        );
        reads
    });

    // The checker: each acknowledged message once, in the producer's order per partition.
    let l = log.into_inner().unwrap();
    let abandoned: HashSet<String> = l.abandoned.iter().map(|k| txn(*k)).collect();
    let (mut lost, mut doubled, mut reordered, mut extra) = (0, 0, 0, 0);
    for p in 0..PARTITIONS {
        let want: Vec<String> = l
            .acked
            .iter()
            .filter(|(_, q, _)| *q == p)
            .map(|(k, _, _)| txn(*k))
            .collect();
        let wanted: HashSet<&String> = want.iter().collect();
        let got = &reads[0][&p];
        let mut seen = HashSet::new();
        doubled += got.iter().filter(|t| !seen.insert(t.as_str())).count();
        lost += want.iter().filter(|t| !seen.contains(t.as_str())).count();
        // Stored but never acknowledged: only a message given up on may be.
        extra += got
            .iter()
            .filter(|t| !wanted.contains(t) && !abandoned.contains(*t))
            .count();
        // The acknowledged ones in the order stored, against the order acknowledged.
        let stored: Vec<&String> = got.iter().filter(|t| wanted.contains(t)).collect();
        reordered += stored.iter().zip(&want).filter(|(a, b)| **a != *b).count();
    }
    let seen = seen.into_inner().unwrap();
    let (anomalies, redelivered) = group_anomalies(&seen);
    println!(
        "group {GROUP}: {} deliveries to {CONSUMERS} consumers, {redelivered} redelivered after a lost ack or an expired lease, {} inside a valid lease or after a confirmed ack",
        seen.len(),
        anomalies.len()
    );
    assert!(anomalies.is_empty(), "{}", anomalies.join("\n"));
    println!(
        "acknowledged {}, abandoned {}, failed attempts {}: lost {lost}, doubled {doubled}, reordered {reordered}, unexpected {extra}, in {:?}",
        l.acked.len(),
        l.abandoned.len(),
        l.failures,
        started.elapsed()
    );
    assert_eq!(
        (lost, doubled, reordered, extra),
        (0, 0, 0, 0),
        "lost, doubled, reordered, unexpected"
    );
    assert!(l.acked.len() >= 100, "too few writes to mean anything");
    let kv = kv_check(kv_log.into_inner().unwrap());
    match kv {
        Ok(summary) => println!("{summary}"),
        Err(e) => panic!("{e}"),
    }
    let dlq_log = dlq_log.into_inner().unwrap();
    let dlq_acked: Vec<String> = dlq_log.acked.iter().map(|(k, _, _)| txn(*k)).collect();
    let dlq_abandoned: Vec<String> = dlq_log.abandoned.iter().map(|k| txn(*k)).collect();
    let failing = failing.into_inner().unwrap();
    let anomalies = dlq_anomalies((&dlq_acked, &dlq_abandoned), &dead, &failing);
    println!(
        "dead letters: {} pushed ({} more given up on), {} dead-lettered after {} deliveries and {} confirmed failed acks, {} anomalies",
        dlq_acked.len(),
        dlq_abandoned.len(),
        dead.len(),
        failing.values().map(|f| f.delivered.len()).sum::<usize>(),
        failing.values().map(|f| f.confirmed.len()).sum::<usize>(),
        anomalies.len()
    );
    assert!(anomalies.is_empty(), "{}", anomalies.join("\n"));
    let stored: Vec<String> = reads[0].values().flatten().cloned().collect();
    println!("{}", lake_check(&lake, &stored));
}

/// The lake checker: `queen lake verify` clean once the sink caught up with the log (within
/// 90 s), and DuckDB and pyarrow each reading every stored record exactly once and nothing
/// else. Run from the root namespace (no network needed: the lake is a folder).
fn lake_check(lake: &Path, stored: &[String]) -> String {
    let endpoint = format!("file://{}", lake.display());
    let mut report = Value::Null;
    let mut ok = false;
    let caught_up = eventually(Duration::from_secs(90), || {
        let out = std::process::Command::new(bin())
            .args(["lake", "verify", "--endpoint", &endpoint])
            .output()
            .expect("queen lake verify");
        ok = out.status.success();
        report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let records = report["queues"]
            .as_array()
            .and_then(|qs| qs.iter().find(|q| q["queue"] == QUEUE))
            .map_or(0, |q| q["records"].as_u64().unwrap_or(0));
        records == stored.len() as u64 || !ok
    });
    assert!(ok, "lake verify found problems: {report:#}");
    assert!(
        caught_up,
        "the lake did not catch up with the log ({} records) within 90 s: {report:#}",
        stored.len()
    );
    let root = lake.to_string_lossy();
    let read =
        queen_tests::s3::read_lake(&["--root", &root, "--prefix", "queen", "--queue", QUEUE]);
    let want: HashSet<&str> = stored.iter().map(String::as_str).collect();
    for reader in ["duckdb", "pyarrow"] {
        let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
        for r in read[reader]["records"].as_array().into_iter().flatten() {
            *seen.entry(r[4].as_str().unwrap_or_default()).or_default() += 1;
        }
        let doubled = seen.values().filter(|n| **n > 1).count();
        let foreign = seen.keys().filter(|t| !want.contains(*t)).count();
        let missing = want.iter().filter(|t| !seen.contains_key(*t)).count();
        assert_eq!(
            (doubled, foreign, missing),
            (0, 0, 0),
            "{reader}: records doubled, not in the log, missing from the lake"
        );
    }
    format!(
        "lake: verify clean, {} records; DuckDB and pyarrow each read every stored record once",
        stored.len()
    )
}

/// The delay fault by itself, without a broker: numbered UDP datagrams from the client's
/// namespace to node 1's arrive no sooner than the delay and out of order while it is in place,
/// and promptly and in order after `undelay`, which says what it held and reordered.
#[test]
fn the_delay_fault_holds_and_reorders_real_packets() {
    use std::net::UdpSocket;
    let Some(net) = or_skip(Net::new(1), "delay fault test", "needs root and `ip netns`") else {
        return;
    };
    let (delay, jitter) = (Duration::from_millis(40), Duration::from_millis(30));
    if let Err(e) = net.delay(delay, jitter, 7) {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED delay fault test: {e} (needs /dev/net/tun)"
        );
        return;
    }
    let to = format!("{}:9000", net.addr(1));
    // Sends `count` datagrams numbered from `first`, 100 µs apart; when each was sent.
    let send = |first: u32, count: u32| -> Vec<Instant> {
        net.as_client(|| {
            let sock = UdpSocket::bind("0.0.0.0:0").expect("bind a client socket");
            (first..first + count)
                .map(|k| {
                    let at = Instant::now();
                    sock.send_to(&k.to_be_bytes(), &to).expect("send");
                    std::thread::sleep(Duration::from_micros(100));
                    at
                })
                .collect()
        })
    };
    let ns = net.ns_path(1);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let bound = to.clone();
    // Receives until 2 s pass without a datagram (bounded); each number with when it came.
    let receiver = std::thread::spawn(move || {
        queen_tests::netns::enter(&ns).expect("enter node 1's namespace");
        let sock = UdpSocket::bind(&bound).expect("bind in node 1's namespace");
        sock.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        ready_tx.send(()).expect("ready");
        let mut got = Vec::new();
        let mut buf = [0u8; 4];
        while got.len() < 10_000 {
            match sock.recv_from(&mut buf) {
                Ok((4, _)) => got.push((u32::from_be_bytes(buf), Instant::now())),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        got
    });
    ready_rx.recv().expect("the receiver started");
    let mut sent = send(0, 300);
    // Every packet held leaves when the delay ends; wait for the last to come out first.
    std::thread::sleep(delay + jitter + Duration::from_millis(200));
    let stats = net.undelay().expect("a delay was in place");
    sent.extend(send(300, 100));
    let got = receiver.join().expect("the receiver");
    let order = |range: std::ops::Range<u32>| -> Vec<u32> {
        got.iter()
            .map(|(k, _)| *k)
            .filter(|k| range.contains(k))
            .collect()
    };
    let late = |range: std::ops::Range<u32>| -> (Duration, Duration) {
        let waits: Vec<Duration> = got
            .iter()
            .filter(|(k, _)| range.contains(k))
            .map(|(k, at)| at.duration_since(sent[*k as usize]))
            .collect();
        let min = waits.iter().min().copied().unwrap_or_default();
        let max = waits.iter().max().copied().unwrap_or_default();
        (min, max)
    };
    let delayed = order(0..300);
    let inversions = delayed.windows(2).filter(|w| w[0] > w[1]).count();
    let (fastest, slowest) = late(0..300);
    println!(
        "delayed: {} of 300 arrived, {inversions} out of order, {:.1}-{:.1} ms late; {stats}",
        delayed.len(),
        fastest.as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3
    );
    assert_eq!(delayed.len(), 300, "the delay lost datagrams");
    assert!(
        fastest >= delay,
        "a datagram came sooner than the delay: {fastest:?}"
    );
    assert!(inversions > 0, "nothing was reordered");
    assert!(stats.packets >= 300 && stats.reordered > 0, "{stats}");
    let after = order(300..400);
    let (_, slowest_after) = late(300..400);
    assert_eq!(
        after,
        (300..400).collect::<Vec<_>>(),
        "after undelay: lost or reordered"
    );
    assert!(
        slowest_after < delay,
        "after undelay a datagram still took {slowest_after:?}"
    );
}
