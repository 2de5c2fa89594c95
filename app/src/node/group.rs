//! One raft group of a node (`QUEEN_RAFT_GROUPS`): its directory, state store, log and broker;
//! the marker that keeps the group count of a data directory; and the hand-back of leadership
//! to a group's preferred member.
//!
//! Group 0 lives in the data directory itself (the layout of a node with one group), group
//! `g > 0` in `groups/g<g>/` under it, each with its own `state/`, `log/` and cluster version
//! marker. Group `g` listens on the node's raft port plus `g`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_domain::groups::preferred_leader;
use queen_ports::{RaftRole, ReplicatedLog, SystemClock};
use queen_raft::{RaftNode, RaftNodeConfig};
use queen_store::{FjallStore, StoreConfig};
use queen_telemetry::Telemetry;

use crate::broker::Broker;
use crate::config::{Config, group_raft_addr};
use crate::error::AppError;

/// The file in the data directory that records how many groups it holds.
const COUNT_FILE: &str = "raft-groups";

/// How often a leader looks at whether its group's preferred member should lead.
const PREFER_EVERY: Duration = Duration::from_secs(1);
/// Looks in a row the preferred member must be live and caught up before it is handed the
/// group (so a member that just came back is not handed leadership while it still catches up,
/// and nothing flaps).
const PREFER_STREAK: u32 = 5;
/// Entries the preferred member may lag and still be handed the group.
const PREFER_MAX_LAG: u64 = 64;
/// How long a leader keeps a group before it hands it back (after an election or a hand-off).
const PREFER_AFTER: Duration = Duration::from_secs(5);

/// One running group.
pub(super) struct Group {
    /// Its number.
    pub(super) index: u16,
    /// Its data directory.
    pub(super) dir: PathBuf,
    /// Its replicated log.
    pub(super) raft: RaftNode,
    /// Its use cases.
    pub(super) broker: Arc<Broker>,
    /// The cluster version its directory's marker held at start.
    pub(super) marker: u32,
}

/// The data directory of group `group` under the node's `root`.
pub(super) fn dir_of(root: &Path, group: u16) -> PathBuf {
    if group == 0 {
        root.to_path_buf()
    } else {
        root.join("groups").join(format!("g{group}"))
    }
}

/// Refuse a data directory written with another group count. A directory from before the
/// marker holds one group. Answers whether the count is still to be recorded
/// ([`record_count`], once the peers agree).
pub(super) fn check_count(root: &Path, count: u16) -> Result<bool, AppError> {
    let path = root.join(COUNT_FILE);
    let recorded = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text.trim().parse::<u16>().map_err(|_| {
            AppError::Groups(format!(
                "{} does not hold a group count; it says '{}'",
                path.display(),
                text.trim()
            ))
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            root.join("state").exists().then_some(1)
        }
        Err(e) => {
            return Err(AppError::Groups(format!(
                "cannot read {}: {e}",
                path.display()
            )));
        }
    };
    match recorded {
        Some(n) if n != count => Err(AppError::Groups(format!(
            "this node's data directory {} holds {n} raft group(s) and QUEEN_RAFT_GROUPS is {count}; the count is the cluster's and cannot change: start it with QUEEN_RAFT_GROUPS={n}",
            root.display()
        ))),
        Some(_) => Ok(false),
        None => Ok(true),
    }
}

/// Record the group count of a data directory.
pub(super) fn record_count(root: &Path, count: u16) -> Result<(), AppError> {
    std::fs::write(root.join(COUNT_FILE), format!("{count}\n")).map_err(|source| {
        AppError::DataDir {
            dir: root.display().to_string(),
            source,
        }
    })
}

/// What every group of a node is started with.
pub(super) struct Common<'a> {
    pub(super) cfg: &'a Config,
    pub(super) kinds: u32,
    pub(super) telemetry: &'a Telemetry,
}

/// Open group `index`'s store and log and build its broker (group 0 also gets the sink's
/// settings and the analytics log).
pub(super) async fn start(
    c: &Common<'_>,
    index: u16,
    sink: Option<crate::SinkSettings>,
    samples: Option<Arc<dyn queen_ports::SampleLog>>,
) -> Result<Group, AppError> {
    let cfg = c.cfg;
    let dir = dir_of(&cfg.raft_dir, index);
    std::fs::create_dir_all(&dir).map_err(|source| AppError::DataDir {
        dir: dir.display().to_string(),
        source,
    })?;
    let marker = crate::cluster::check_marker(&dir, c.kinds)?;
    let store = FjallStore::open(&StoreConfig::new(dir.join("state")))?;
    crate::cluster::refuse_newer(
        &dir,
        queen_domain::reads::cluster_version(&store).unwrap_or(0),
        c.kinds,
    )?;
    let mut raft_cfg = RaftNodeConfig::single(cfg.node_id, dir.clone());
    raft_cfg.token = cfg.token.clone();
    raft_cfg.heartbeat_ms = cfg.heartbeat_ms;
    raft_cfg.election_min_ms = cfg.election_min_ms;
    raft_cfg.election_max_ms = cfg.election_max_ms;
    raft_cfg.join = cfg.join;
    raft_cfg.log_kinds = c.kinds;
    raft_cfg.groups = cfg.placement.groups();
    raft_cfg.faults_file = cfg.test_hooks.faults_file(&cfg.raft_dir);
    if let Some(every) = cfg.test_hooks.snapshot_every {
        raft_cfg.snapshot_every_entries = every;
    }
    if let Some(bytes) = cfg.test_hooks.log_segment_bytes {
        raft_cfg.log_segment_bytes = bytes;
    }
    // The raft port carries one client body per forwarded command, and appends split at
    // `MAX_APPEND_BYTES` unless one entry is larger: bound its bodies by the largest client
    // body plus room for the entry's own framing.
    raft_cfg.max_body_bytes = cfg
        .max_body_bytes
        .saturating_add(1 << 20)
        .max(queen_raft::MAX_APPEND_BYTES);
    raft_cfg.body_timeout = cfg.body_timeout;
    raft_cfg.body_budget_bytes = cfg.body_budget_bytes.max(raft_cfg.max_body_bytes);
    raft_cfg.peers = cfg
        .peers
        .iter()
        .map(|p| queen_raft::Peer {
            id: p.id,
            // Checked when the settings were read: every group's port exists.
            raft_addr: group_raft_addr(&p.raft, index).unwrap_or_else(|| p.raft.clone()),
            http_addr: p.http.clone(),
        })
        .collect();
    let raft = RaftNode::start(raft_cfg, Arc::new(store.clone())).await?;
    let fsync_source = raft.clone();
    let broker = Arc::new(
        Broker::new(
            Arc::new(raft.clone()) as Arc<dyn ReplicatedLog>,
            Arc::new(store.clone()) as Arc<dyn queen_ports::StateReader>,
            Arc::new(SystemClock),
            c.telemetry.clone(),
            cfg.request_timeout,
            Arc::new(move || fsync_source.fsync_count()),
        )
        .with_disk_gate(cfg.disk_high_pct, cfg.disk_reserve_bytes)
        .with_max_message_bytes(cfg.max_message_bytes)
        .with_cluster(
            Arc::new(raft.clone()) as Arc<dyn queen_ports::Membership>,
            cfg.promote_max_lag,
            cfg.ready_lag_entries,
            cfg.ready_lag_ms,
        )
        .with_client_offload(cfg.client_offload)
        .with_log_kinds(c.kinds)
        .with_cipher(
            match &cfg.encryption {
                Some(k) => k.clone() as Arc<dyn queen_ports::PayloadCipher>,
                None => Arc::new(queen_crypto::NoKey),
            },
            cfg.encryption.is_some(),
        )
        .with_ephemeral_limits(cfg.ephemeral.clone())
        .with_sink_settings(sink)
        .with_samples_if(samples)
        .with_peers(Arc::new(raft.clone()) as Arc<dyn queen_ports::PeerCalls>)
        .with_push_lane()
        .with_group(index, cfg.placement.groups()),
    );
    // Waiting pops are woken by what this node applies, leader or follower.
    store.observe(broker.apply_observer());
    Ok(Group {
        index,
        dir,
        raft,
        broker,
        marker,
    })
}

/// The node's own sink's settings in group `index`, or `None` when that group runs no sink:
/// with one group, the settings as they are; with several, every group runs one over its own
/// queues when the sink mirrors every queue (each with its share of `QUEEN_S3_MEMORY_MB`), and
/// only the default tenant's group when it names queues (names of the default tenant).
pub(super) fn sink_settings(
    node: &crate::SinkSettings,
    index: u16,
    placement: &queen_domain::groups::Placement,
) -> Option<crate::SinkSettings> {
    let count = placement.groups();
    if count == 1 {
        return Some(node.clone());
    }
    match node.queues {
        crate::sink::config::Queues::All => Some(crate::SinkSettings {
            memory_mb: (node.memory_mb / u64::from(count)).max(1),
            ..node.clone()
        }),
        crate::sink::config::Queues::Named(_) => {
            (placement.group_of(&queen_domain::tenant::Tenant::default()) == index)
                .then(|| node.clone())
        }
    }
}

/// Refuse to start when a peer that answers runs another number of groups (asked over its
/// raft port, a second at most each, before this node opens anything; peers that do not answer
/// yet are not waited for).
pub(super) async fn check_peers(cfg: &Config, count: u16) -> Result<(), AppError> {
    if cfg.peers.len() < 2 {
        return Ok(());
    }
    let peers: Vec<queen_raft::Peer> = cfg
        .peers
        .iter()
        .map(|p| queen_raft::Peer {
            id: p.id,
            raft_addr: p.raft.clone(),
            http_addr: p.http.clone(),
        })
        .collect();
    for (id, theirs) in queen_raft::peer_groups(cfg.token.clone(), cfg.node_id, &peers).await {
        if let Some(n) = theirs
            && n != count
        {
            return Err(AppError::Groups(format!(
                "node {id} runs {n} raft group(s) and this node was started with {count}; the count is the cluster's: start this node with QUEEN_RAFT_GROUPS={n}"
            )));
        }
    }
    Ok(())
}

/// Refuse to start when a group holds queues of a tenant that now lives in another group (a
/// pin added, changed or removed after the tenant had data): its data would be out of reach.
pub(super) fn check_tenants(
    groups: &[Group],
    placement: &queen_domain::groups::Placement,
) -> Result<(), AppError> {
    if placement.groups() == 1 {
        return Ok(());
    }
    for g in groups {
        let state = queen_ports::ClientApi::state(&*g.broker);
        let unreadable = |e: queen_domain::StoreError| {
            AppError::Groups(format!("cannot read group {}: {e}", g.index))
        };
        // KV rows (locks included) and timers of tenants without a queue.
        for (table, what) in [
            (queen_domain::keys::table::KV, "KV rows"),
            (queen_domain::keys::table::TIMER, "timers"),
        ] {
            for id in queen_domain::reads::scoped_tenants(&*state, table).map_err(unreadable)? {
                let home = placement.group_of_id(&id);
                if home != g.index {
                    return Err(AppError::Groups(format!(
                        "tenant {id} has {what} in group {} but QUEEN_TENANT_GROUPS and the hash place it in group {home}; a tenant with data cannot be moved: restore its pin to group {}",
                        g.index, g.index
                    )));
                }
            }
        }
        let queues = queen_domain::reads::queues(&*state, usize::MAX).map_err(unreadable)?;
        for q in queues {
            let id = queen_domain::tenant::split(&q.name)
                .0
                .unwrap_or(queen_domain::tenant::DEFAULT_TENANT);
            let home = placement.group_of_id(id);
            if home != g.index {
                return Err(AppError::Groups(format!(
                    "tenant {id} has data in group {} (queue '{}') but QUEEN_TENANT_GROUPS and the hash place it in group {home}; a tenant with data cannot be moved: restore its pin to group {}",
                    g.index,
                    queen_domain::tenant::split(&q.name).1,
                    g.index
                )));
            }
        }
    }
    Ok(())
}

/// On every node, for one group: while this node leads it and another member is its preferred
/// leader, hand the group back once that member has been live and caught up for a while.
pub(super) async fn keep_preferred(
    raft: RaftNode,
    index: u16,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut streak = 0u32;
    let mut leading_since: Option<Instant> = None;
    let mut every = tokio::time::interval(PREFER_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.changed() => return,
        }
        let progress = raft.progress();
        if progress.role != RaftRole::Leader {
            streak = 0;
            leading_since = None;
            continue;
        }
        let since = *leading_since.get_or_insert_with(Instant::now);
        let members = raft.members();
        let voters: Vec<u64> = members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        let Some(preferred) = preferred_leader(index, &voters) else {
            continue;
        };
        let ready = preferred != progress.node_id
            && members
                .iter()
                .any(|m| m.id == preferred && m.live && m.lag <= PREFER_MAX_LAG);
        streak = if ready { streak + 1 } else { 0 };
        if streak >= PREFER_STREAK && since.elapsed() >= PREFER_AFTER {
            streak = 0;
            match raft.transfer_to(preferred).await {
                Some((to, ms)) => {
                    tracing::info!(target: "queen-app", group = index, to, ms, "group handed back to its preferred leader");
                    leading_since = None;
                }
                None => {
                    tracing::info!(target: "queen-app", group = index, preferred, "hand-back to the preferred leader did not complete; trying again later");
                }
            }
        }
    }
}
