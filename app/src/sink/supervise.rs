//! The supervisor: finding the queues to sink, placing each on a node, announcing this node's
//! presence, and running one queue's task until it ends or moves.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use queen_domain::kv::{Expiry, KvOp, KvResult};
use queen_domain::reads;
use queen_domain::sink::documents::{self, NS, PresenceDoc};

use super::config::Queues;
use super::queue::{Ended, Look, QueueTask};
use super::{DISCOVER_EVERY, PRESENCE_FRESH, Shared};

/// How long a node waits, per node present that holds fewer queues, before it claims a free
/// queue: long enough for that node's presence write and claim to go through the log first.
const CLAIM_STAGGER: Duration = Duration::from_millis(100);

/// How often a node waiting on a queue held elsewhere reads its own applied state for the
/// lease row's release.
const RELEASE_POLL: Duration = Duration::from_millis(250);

/// How long after a held lease row's expiry a node looks at it again.
const EXPIRY_SLACK: Duration = Duration::from_millis(200);

/// How long a stopping node keeps trying to remove its presence row (a raft leadership
/// hand-off in the same moment makes the first tries fail).
const PRESENCE_REMOVE_FOR: Duration = Duration::from_secs(3);

/// The longest wait between two probes of a bucket that does not answer (the first wait is
/// half a second, doubled each time): a failing endpoint sees at most one probe (the store's
/// own three retries inside it) every half minute.
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Probe the bucket until it answers, then discover queues and run them.
pub(super) async fn supervise(shared: Arc<Shared>) {
    let mut stop = shared.stop.clone();
    let mut wait = Duration::from_millis(500);
    loop {
        match shared.lake.probe(&shared.settings.prefix).await {
            Ok(()) => {
                shared.set_sink(|s| {
                    s.bucket_reachable = true;
                    s.bucket_error = None;
                    s.bucket_failure = None;
                    s.phase = "running";
                });
                break;
            }
            Err(e) => {
                let msg = format!(
                    "the bucket did not answer the probe: {e}; check the endpoint, the bucket name and the credentials"
                );
                tracing::warn!(target: "queen-s3", error = %msg, "bucket probe failed");
                shared.set_sink(|s| {
                    s.bucket_reachable = false;
                    s.bucket_error = Some(msg);
                    s.bucket_failure = e.failure();
                    s.phase = "backoff";
                });
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => { shared.set_sink(|s| s.phase = "stopped"); return; }
        }
        wait = (wait * 2).min(PROBE_BACKOFF_MAX);
    }
    let mut tasks: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut over_since: Option<std::time::Instant> = None;
    loop {
        if *stop.borrow() {
            break;
        }
        let found = discover(&shared);
        over_since = place(&shared, found.present.len() as u64, over_since);
        for q in &found.present {
            if tasks
                .get(q)
                .is_none_or(tokio::task::JoinHandle::is_finished)
            {
                tasks.insert(
                    q.clone(),
                    tokio::spawn(run_queue(shared.clone(), q.clone())),
                );
            }
        }
        for q in &found.missing {
            if !tasks.contains_key(q) {
                shared.update_queue(q, |s| {
                    s.state = "missing";
                    s.running = false;
                });
            }
        }
        presence(&shared).await;
        tokio::select! {
            () = tokio::time::sleep(DISCOVER_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
    // Leave the presence rows first, then drain: the other nodes weigh the queues this one
    // frees against the members that stay (a share of queues / 2 rather than / 3), so they
    // do not claim as if it still counted and give a queue back later.
    // On SIGTERM the node hands raft leadership over at the same time, and a write in flight
    // then may fail ("leadership changed"): retried for `PRESENCE_REMOVE_FOR`, or the others count this node
    // for up to `PRESENCE_FRESH` more, claim its queues as if the share were a third, and each
    // give one back a lease TTL later.
    let gone = KvOp::Delete {
        ns: NS.into(),
        key: documents::presence_key(&shared.settings.name, &shared.settings.instance),
        expect: None,
        required: false,
    };
    shared
        .kv_write_retrying(&[gone], "presence row removal", PRESENCE_REMOVE_FOR)
        .await;
    for (_, t) in tasks {
        let _ = t.await;
    }
    shared.set_sink(|s| s.phase = "stopped");
}

/// Fair placement: a node over its share (queues / nodes, rounded up) for a whole lease TTL gives
/// back one queue at a time, the one with the least buffered. Answers when it went over; a node
/// still over its share once a queue is given back gives the next one at the next round
/// without waiting another TTL, since it has been over all along.
pub(super) fn place(
    shared: &Shared,
    queues: u64,
    over_since: Option<std::time::Instant>,
) -> Option<std::time::Instant> {
    shared.set_sink(|s| s.queues = queues);
    let nodes = shared
        .sink
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .nodes
        .max(1);
    let share = shared.share();
    let held = shared.held();
    let mut giving = shared
        .give_back
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(q) = giving.as_deref() {
        let still_running = shared
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(q)
            .is_some_and(|s| s.running);
        if still_running {
            return over_since;
        }
        *giving = None;
    }
    if held <= share {
        return None;
    }
    let since = over_since.unwrap_or_else(std::time::Instant::now);
    if since.elapsed() < Duration::from_millis(shared.settings.lease_ttl_ms) {
        return Some(since);
    }
    let all = shared.queues.lock().unwrap_or_else(PoisonError::into_inner);
    let pick = all
        .iter()
        .filter(|(_, q)| q.running)
        .min_by_key(|(_, q)| q.buffered)
        .map(|(n, _)| n.clone());
    drop(all);
    if let Some(q) = pick {
        tracing::info!(target: "queen-s3", queue = %queen_domain::tenant::display(&q), held, share, nodes, "over the fair share for a whole lease TTL: giving one queue back");
        shared.telemetry.metrics().s3().queue_given_back();
        *giving = Some(q);
    }
    Some(since)
}

pub(super) struct Found {
    present: Vec<String>,
    missing: Vec<String>,
}

pub(super) fn discover(shared: &Shared) -> Found {
    let state = shared.log.applied();
    let mut existing: Vec<String> = reads::queues(&*state, usize::MAX)
        .map(|v| v.into_iter().map(|q| q.name).collect())
        .unwrap_or_default();
    let own = queen_domain::tenant::Tenant::any(&shared.settings.tenant).unwrap_or_default();
    if shared.settings.own_tenant {
        // A tenant's sink: that tenant's queues, by the names its clients use.
        existing.retain(|q| own.owns(q));
    } else {
        // The node's sink: every tenant but those with a sink of their own.
        let others = {
            let dir = shared.log.directory();
            queen_domain::proxy::directory::sink_tenants(&*dir, shared.log.wall_clock())
                .unwrap_or_default()
        };
        if !others.is_empty() {
            existing.retain(|q| !others.iter().any(|t| t.owns(q)));
        }
    }
    match &shared.settings.queues {
        Queues::All => Found {
            present: existing,
            missing: Vec::new(),
        },
        Queues::Named(names) => {
            let (present, missing) = names
                .iter()
                .map(|n| {
                    if shared.settings.own_tenant {
                        own.name(n)
                    } else {
                        n.clone()
                    }
                })
                .partition(|n| existing.contains(n));
            Found { present, missing }
        }
    }
}

/// Refresh this node's presence row and count the nodes running the sink.
pub(super) async fn presence(shared: &Shared) {
    let s = &shared.settings;
    let doc = PresenceDoc {
        instance: s.instance.clone(),
        held: shared.held(),
    };
    let ttl = s.lease_ttl_ms.div_ceil(1000).max(1) * 2;
    let ops = vec![
        KvOp::Put {
            ns: NS.into(),
            key: documents::presence_key(&s.name, &s.instance),
            value: serde_json::to_vec(&doc).unwrap_or_default(),
            expiry: Expiry::Ttl(ttl),
            expect: None,
            required: false,
        },
        KvOp::GetPrefix {
            ns: NS.into(),
            prefix: documents::presence_prefix(&s.name),
            after: None,
            limit: 1000,
            keys_only: false,
        },
    ];
    if let Ok(out) = shared.log.sink_kv(ops).await
        && let Some(KvResult::Prefix { rows, .. }) = out.results.get(1)
    {
        // A running node rewrites its row every discovery period (and at each claim); a row
        // older than two of them is a node that died and whose row has not expired yet: it
        // runs nothing and claims nothing, so it counts for neither the share nor the wait.
        let fresh_from = shared
            .log
            .wall_clock()
            .0
            .saturating_sub(u64::try_from(PRESENCE_FRESH.as_micros()).unwrap_or(u64::MAX));
        let present: Vec<PresenceDoc> = rows
            .iter()
            .filter(|r| r.updated.0 >= fresh_from)
            .filter_map(|r| serde_json::from_slice(&r.value).ok())
            .collect();
        let n = present.len().max(1) as u64;
        let rank = documents::claim_rank(&present, &s.instance, doc.held);
        shared.set_sink(|st| {
            st.nodes = n;
            st.someone_under = documents::someone_under_share(&present, &s.instance, st.queues);
            st.claim_rank = rank;
        });
    }
}

/// What a look at the lease row settles unless the queue is free (`None`): held by another
/// instance (and until when, into `expires`), or a row under this node's own name (a restart
/// within the TTL), taken back at once.
async fn unless_free(
    task: &mut QueueTask,
    look: Result<Look, String>,
    expires: &mut Option<queen_domain::time::Stamp>,
) -> Option<Result<Option<String>, String>> {
    match look {
        Err(e) => Some(Err(e)),
        Ok(Look::Held { holder, expires: e }) => {
            *expires = e;
            Some(Ok(Some(holder)))
        }
        Ok(Look::Mine(version)) => Some(task.take(version).await),
        Ok(Look::Free) => None,
    }
}

/// One queue: claim, run while held, look again later.
pub(super) async fn run_queue(shared: Arc<Shared>, queue: String) {
    let ttl = Duration::from_millis(shared.settings.lease_ttl_ms);
    let mut stop = shared.stop.clone();
    // A run that ended fenced stops the queue here: the row keeps saying `fenced` (and names
    // the new holder) until this node runs the queue again, which it does only once the lease
    // is free, like any other node.
    let mut fenced = false;
    // How many queues this node held when it last left the free queue to a less loaded node
    // for a TTL, if it did: it claims the queue at the next look if nobody did and it took
    // nothing else meanwhile. A node that grew meanwhile (it claimed another of the queues that
    // came free at once, say a stopping node's two) weighs it afresh, so it does not end over
    // its share and give a queue back a TTL later.
    let mut left: Option<u64> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let mut task = QueueTask::new(shared.clone(), queue.clone());
        if !fenced {
            shared.update_queue(&queue, |q| q.state = "claiming");
        }
        let mut turn = None;
        let mut expires = None;
        let look = task.look().await;
        let claimed = match unless_free(&mut task, look, &mut expires).await {
            Some(done) => done,
            None => {
                // One claim at a time on this node, each after a short stagger for every node
                // present that holds fewer queues (`claim_rank`), so the least loaded node claims
                // first and no claim costs more than a fraction of a second per node, however
                // many queues this one runs (a dead node's queues all come free at once). A node
                // already at its fair share first leaves the queue to the nodes under theirs for
                // a lease TTL (when there is one), without holding its turn.
                let guard = tokio::select! {
                    g = shared.claim_turn.lock() => g,
                    _ = stop.changed() => return,
                };
                // Another node may have claimed it while this task waited for its turn (a queue
                // that came free on every node at once): look again before waiting, so that a
                // queue of such tasks drains at one read each.
                let look = task.look().await;
                match unless_free(&mut task, look, &mut expires).await {
                    Some(done) => done,
                    None => {
                        // Fresh counts first: presence rows otherwise trail by a discovery
                        // period, and a node that just claimed would still look under its share.
                        let alone = shared.log.alone();
                        if !alone {
                            presence(&shared).await;
                        }
                        let held = shared.held();
                        let (rank, someone_under) = {
                            let s = shared.sink.lock().unwrap_or_else(PoisonError::into_inner);
                            (s.claim_rank, s.someone_under)
                        };
                        // A node that is the cluster's only member has nobody to leave a
                        // queue to.
                        let leave = !alone && held >= shared.share() && someone_under;
                        tracing::debug!(target: "queen-s3", queue = %queen_domain::tenant::display(&queue), held, share = shared.share(), rank, someone_under, leave, left = ?left, "claim");
                        if leave && left.is_none_or(|then| held > then) {
                            // Leave it for a TTL without holding this node's turn, so its
                            // claims of other queues (a stopping node's, say) go on meanwhile;
                            // then look again and, if it is still free, claim it.
                            left = Some(held);
                            drop(guard);
                            tokio::select! {
                                () = tokio::time::sleep(ttl) => {}
                                _ = stop.changed() => return,
                            }
                            continue;
                        }
                        let mut wait = CLAIM_STAGGER * u32::try_from(rank).unwrap_or(u32::MAX);
                        if alone {
                            wait = Duration::ZERO;
                        }
                        if !wait.is_zero() {
                            tokio::select! {
                                () = tokio::time::sleep(wait) => {}
                                _ = stop.changed() => return,
                            }
                        }
                        turn = Some(guard);
                        task.take(0).await
                    }
                }
            }
        };
        left = None;
        tracing::debug!(target: "queen-s3", queue = %queen_domain::tenant::display(&queue), claimed = ?claimed, "lease look");
        let held_elsewhere = matches!(claimed, Ok(Some(_)));
        let look_again = match claimed {
            Ok(None) => {
                fenced = false;
                shared.update_queue(&queue, |q| {
                    q.state = "held";
                    q.held_by = Some(shared.settings.instance.clone());
                    q.running = true;
                    q.failing = false;
                });
                // Counted in `held` now: tell the other nodes, then the next claim on this node
                // may go.
                if turn.is_some() && !shared.log.alone() {
                    presence(&shared).await;
                }
                drop(turn.take());
                let ended = task.run().await;
                // The queue is no longer this node's to write: its health is the next owner's.
                shared.update_queue(&queue, |q| {
                    q.state = ended.state();
                    q.running = false;
                    q.failing = false;
                });
                shared.set_buffered(&queue, 0);
                match ended {
                    Ended::Drained => return,
                    Ended::Missing => return,
                    // Stay away long enough for a less loaded node to take it.
                    Ended::Released => ttl * 2,
                    Ended::Fenced => {
                        tracing::warn!(target: "queen-s3", queue = %queen_domain::tenant::display(&queue), "lease lost to another node; the queue stops here");
                        fenced = true;
                        ttl / 3
                    }
                }
            }
            Ok(Some(holder)) => {
                shared.update_queue(&queue, |q| {
                    q.state = if fenced { "fenced" } else { "held" };
                    q.held_by = Some(holder);
                    q.running = false;
                    q.failing = false;
                });
                // Every third of the TTL, or just after the row expires when that comes first
                // (its holder died): a dead node's queues move within the TTL and a fraction of
                // a second, not up to a third of the TTL later.
                Duration::from_micros(documents::next_look_micros(
                    expires,
                    shared.log.wall_clock(),
                    u64::try_from((ttl / 3).as_micros()).unwrap_or(u64::MAX),
                    u64::try_from(EXPIRY_SLACK.as_micros()).unwrap_or(u64::MAX),
                ))
            }
            Err(e) => {
                tracing::warn!(target: "queen-s3", queue = %queen_domain::tenant::display(&queue), error = %e, "sink queue claim failed");
                shared.update_queue(&queue, |q| q.fail(e));
                Duration::from_secs(1)
            }
        };
        drop(turn);
        tracing::debug!(target: "queen-s3", queue = %queen_domain::tenant::display(&queue), ?look_again, held_elsewhere, "next lease look");
        let woke = if held_elsewhere {
            until_released(&shared, &queue, look_again)
        } else {
            Box::pin(tokio::time::sleep(look_again))
        };
        tokio::select! {
            () = woke => {}
            _ = stop.changed() => return,
        }
    }
}

/// Sleep up to `d`, waking early once this node's applied state shows no live lease row for
/// `queue`: its holder gave it back (a SIGTERM drains and deletes the row) or the row expired.
/// A hint read every [`RELEASE_POLL`] from the local state (no log round trip); the look and
/// the claim that follow go through the log.
fn until_released<'a>(
    shared: &'a Shared,
    queue: &'a str,
    d: Duration,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        let until = tokio::time::Instant::now() + d;
        loop {
            let now = tokio::time::Instant::now();
            if now >= until {
                return;
            }
            tokio::time::sleep(RELEASE_POLL.min(until - now)).await;
            let state = shared.log.applied();
            let free = documents::lease_live(
                &*state,
                &shared.settings.name,
                queue,
                shared.log.wall_clock(),
            )
            .is_ok_and(|live| !live);
            if free {
                return;
            }
        }
    })
}
