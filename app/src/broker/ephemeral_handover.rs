//! Moving ephemeral rings to their owner: whenever a node holds a ring another live member
//! owns (membership changed, a member came back, a member stops), it ships the ring there
//! with its messages and every group's position. A ring is only ever removed here once its
//! new owner said it took it; a refused or failed shipment goes back into this node's rings
//! and is tried again, so a member that is still starting never loses what it is handed.
//!
//! On SIGTERM a node first tells the others it leaves, stops owning anything, and ships every
//! ring it holds, within `DRAIN_FOR`; it logs what it handed over and what it could not.
//! A node that starts tells the others it is ready, so they move its partitions back to it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use queen_domain::ephemeral::RingExport;
use queen_ports::PeerCallError;

use super::Broker;

/// The peer route of shipped rings.
pub(crate) const ADOPT: &str = "ephemeral/adopt";
/// The peer route of "I am stopping".
pub(crate) const LEAVING: &str = "ephemeral/leaving";
/// The peer route of "I am ready to own partitions".
pub(crate) const READY: &str = "ephemeral/ready";
/// The peer route of "how many messages do you hold".
pub(crate) const HELD: &str = "ephemeral/held";
/// How long a member that said it stops owns nothing in the others' view (unless it says it
/// is ready before).
const LEAVING_FOR: Duration = Duration::from_secs(30);
/// How long a stopping node tries to ship its rings.
const DRAIN_FOR: Duration = Duration::from_secs(15);
/// Deadline of one shipment.
const SHIP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of rings in one shipment (more go in the next).
const SHIP_BYTES: usize = 8 << 20;

/// What a pass moved.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Moved {
    /// Rings shipped and taken.
    pub(crate) rings: u64,
    /// Their messages.
    pub(crate) messages: u64,
    /// Rings that went back into this node's rings (their owner did not take them).
    pub(crate) kept: u64,
}

impl Broker {
    /// Answer the hand-over calls of other nodes; `None` for another route.
    pub(crate) async fn ephemeral_handover_call(
        &self,
        route: &str,
        body: &[u8],
    ) -> Option<Vec<u8>> {
        let answer: Result<u64, String> = match route {
            ADOPT => match postcard::from_bytes::<Vec<RingExport>>(body) {
                // A stopping node takes nothing: the sender keeps the rings and tries the
                // next owner.
                Ok(_)
                    if self
                        .eph_owners
                        .leaving
                        .load(std::sync::atomic::Ordering::Relaxed) =>
                {
                    Err("this node is stopping".into())
                }
                Ok(rings) => {
                    let now = self.clock.now_micros() / 1000;
                    let mut r = self.ephemeral.lock();
                    let mut n = 0;
                    let queues: Vec<String> = rings.iter().map(|x| x.queue.clone()).collect();
                    for ring in rings {
                        n += r.adopt(ring, now);
                    }
                    drop(r);
                    for q in queues {
                        self.ephemeral.wake(&q);
                    }
                    Ok(n)
                }
                Err(e) => Err(format!("rings did not decode: {e}")),
            },
            LEAVING | READY => match postcard::from_bytes::<(u64, u64)>(body) {
                Ok((node, epoch)) => {
                    if route == LEAVING {
                        self.eph_owners.exclude(node, LEAVING_FOR);
                        lock(&self.eph_owners.graceful).insert(node);
                    } else {
                        self.eph_owners.include(node);
                        self.eph_note_return(node, epoch);
                    }
                    Ok(0)
                }
                Err(e) => Err(format!("node id did not decode: {e}")),
            },
            HELD => {
                let r = self.ephemeral.lock();
                return Some(postcard::to_allocvec(&(r.epoch(), r.len())).unwrap_or_default());
            }
            _ => return None,
        };
        Some(postcard::to_allocvec(&answer).unwrap_or_default())
    }

    /// Send a small note (`LEAVING`, `READY`) to every other member; how many took it.
    async fn eph_tell_all(&self, route: &'static str) -> usize {
        let (Some(peers), Some(membership)) = (&self.peers, &self.membership) else {
            return 0;
        };
        let me = peers.me();
        let epoch = self.ephemeral.lock().epoch();
        let body = postcard::to_allocvec(&(me, epoch)).unwrap_or_default();
        let mut told = 0;
        for m in membership.members().into_iter().filter(|m| m.id != me) {
            if peers
                .call(m.id, route, body.clone(), Duration::from_secs(2))
                .await
                .is_ok()
            {
                told += 1;
            }
        }
        told
    }

    /// A member said it is ready with incarnation `epoch`. When it held messages under another
    /// incarnation and had not said it stops, it crashed: what it held was lost.
    fn eph_note_return(&self, node: u64, epoch: u64) {
        let graceful = lock(&self.eph_owners.graceful).remove(&node);
        let seen = lock(&self.eph_owners.seen).remove(&node);
        if let Some((before, messages)) = seen
            && before != epoch
            && messages > 0
            && !graceful
        {
            tracing::warn!(target: "queen-app", node, messages, "a member came back without handing its ephemeral rings over: their messages were lost");
            let mut l = lock(&self.eph_owners.losses);
            if l.len() >= 32 {
                l.pop_front();
            }
            l.push_back((node, messages, self.clock.now_micros() / 1000));
        }
    }

    /// Ask every other member what it holds (for the losses a crash leaves, `/status`).
    async fn eph_ask_held(&self) {
        let (Some(peers), Some(membership)) = (&self.peers, &self.membership) else {
            return;
        };
        let me = peers.me();
        for m in membership.members().into_iter().filter(|m| m.id != me) {
            if let Ok(reply) = peers
                .call(m.id, HELD, Vec::new(), Duration::from_secs(1))
                .await
                && let Ok((epoch, messages)) = postcard::from_bytes::<(u64, u64)>(&reply)
            {
                lock(&self.eph_owners.seen).insert(m.id, (epoch, messages));
            }
        }
    }

    /// This node's ephemeral figures for `/status`.
    pub(crate) fn ephemeral_status(&self) -> serde_json::Value {
        let (bytes, messages, queues) = self.ephemeral.figures();
        let budget = self.ephemeral.limits().node_max_bytes;
        let losses: Vec<serde_json::Value> = lock(&self.eph_owners.losses)
            .iter()
            .map(|(node, messages, at)| {
                serde_json::json!({
                    "node": node,
                    "messages": messages,
                    "at": queen_domain::time::Stamp(at * 1000).iso_millis(),
                })
            })
            .collect();
        serde_json::json!({
            "messages": messages,
            "bytes": bytes,
            "queues": queues,
            "budgetBytes": budget,
            "lostOnCrash": losses.iter().filter_map(|l| l["messages"].as_u64()).sum::<u64>(),
            "crashes": losses,
        })
    }

    /// Ship every ring this node holds whose owner is another live member; rings nobody took
    /// go back into this node's rings.
    pub(crate) async fn ephemeral_rebalance(&self) -> Moved {
        let mut moved = Moved::default();
        let Some((me, members)) = self.eph_members() else {
            return moved;
        };
        let held = self.ephemeral.lock().partitions();
        let mut by_owner: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
        for (q, p) in held {
            let o = queen_domain::ephemeral::owner::owner(&q, &p, &members).unwrap_or(me);
            if o != me {
                by_owner.entry(o).or_default().push((q, p));
            }
        }
        let leaving = self
            .eph_owners
            .leaving
            .load(std::sync::atomic::Ordering::Relaxed);
        for (to, parts) in by_owner {
            let _exclusive = if leaving {
                Some(self.eph_ship_lock.write().await)
            } else {
                None
            };
            let rings: Vec<RingExport> = {
                let mut r = self.ephemeral.lock();
                parts.iter().filter_map(|(q, p)| r.detach(q, p)).collect()
            };
            for batch in batches(rings) {
                let count = batch.len() as u64;
                let messages: u64 = batch.iter().map(|r| r.messages.len() as u64).sum();
                match self.eph_ship(to, &batch).await {
                    Ok(()) => {
                        moved.rings += count;
                        moved.messages += messages;
                    }
                    Err(e) => {
                        tracing::debug!(target: "queen-app", to, error = %e, "ephemeral rings not taken; kept here");
                        let now = self.clock.now_micros() / 1000;
                        let mut r = self.ephemeral.lock();
                        for ring in batch {
                            r.adopt(ring, now);
                        }
                        moved.kept += count;
                    }
                }
            }
        }
        moved
    }

    async fn eph_ship(&self, to: u64, rings: &[RingExport]) -> Result<(), String> {
        let Some(peers) = &self.peers else {
            return Err("no peers".into());
        };
        let body = postcard::to_allocvec(rings).map_err(|e| e.to_string())?;
        let reply = peers
            .call(to, ADOPT, body, SHIP_TIMEOUT)
            .await
            .map_err(|e| {
                if matches!(e, PeerCallError::Unreachable { .. }) {
                    self.eph_owners.exclude(to, Duration::from_secs(5));
                }
                e.to_string()
            })?;
        match postcard::from_bytes::<Result<u64, String>>(&reply) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(format!("the answer did not decode: {e}")),
        }
    }

    /// Keep rings with their owners for the life of the node: tell the others this node is
    /// ready, then move misplaced rings every half second.
    pub async fn ephemeral_placement(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        if self.peers.is_none() {
            return;
        }
        let mut told = false;
        let mut tick: u64 = 0;
        let mut every = tokio::time::interval(Duration::from_millis(500));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.changed() => return,
            }
            if self
                .eph_owners
                .leaving
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                continue;
            }
            if !told {
                // Until every member heard it, keep saying it (a member may still be starting).
                let others = self
                    .membership
                    .as_ref()
                    .map_or(0, |m| m.members().len().saturating_sub(1));
                told = self.eph_tell_all(READY).await >= others;
            }
            tick += 1;
            if tick.is_multiple_of(2) {
                self.eph_ask_held().await;
            }
            let m = self.ephemeral_rebalance().await;
            if m.rings > 0 {
                tracing::info!(target: "queen-app", rings = m.rings, messages = m.messages, "ephemeral rings moved to their owners");
            }
        }
    }

    /// On SIGTERM, before the leadership hand-off: tell the others, stop owning, ship every
    /// ring within `DRAIN_FOR`, and log what went and what was lost.
    pub async fn ephemeral_drain(&self) {
        if self.eph_members().is_none() {
            let lost = self.ephemeral.lock().len();
            if lost > 0 {
                tracing::info!(target: "queen-app", lost, "ephemeral messages dropped at stop (no other member to hand them to)");
            }
            return;
        }
        // Stop owning here first: operations that reach this node are served from the rings
        // it still holds or relayed to the next owners, so nothing lands on a next owner before
        // the ring it belongs behind. The others hear it once the rings are there.
        self.eph_owners
            .leaving
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        let (mut rings, mut delivered) = (0, 0);
        loop {
            let m = self.ephemeral_rebalance().await;
            rings += m.rings;
            delivered += m.messages;
            let left = self.ephemeral.lock().partitions().len();
            if left == 0 || started.elapsed() >= DRAIN_FOR {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.eph_tell_all(LEAVING).await;
        let lost = self.ephemeral.lock().len();
        tracing::info!(target: "queen-app", rings, delivered, lost, "ephemeral rings handed over");
    }
}

/// Rings in shipments of at most `SHIP_BYTES` of payload each (one ring per shipment at least).
fn batches(rings: Vec<RingExport>) -> Vec<Vec<RingExport>> {
    let mut out: Vec<Vec<RingExport>> = Vec::new();
    let mut size = 0;
    for r in rings {
        let bytes: usize = r.messages.iter().map(|(_, p)| p.len() + 16).sum();
        if out.is_empty() || size + bytes > SHIP_BYTES {
            out.push(Vec::new());
            size = 0;
        }
        size += bytes;
        out.last_mut().expect("pushed above").push(r);
    }
    out
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
