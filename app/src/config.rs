//! Configuration: the raw values as read (environment or flags), validated once into a typed
//! `Config`. Every refusal names the variable.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Values as given, before validation (blank counts as unset).
#[derive(Debug, Clone, Default)]
pub struct RawConfig {
    /// `PORT`
    pub port: Option<String>,
    /// `HOST`
    pub host: Option<String>,
    /// `QUEEN_RAFT_DIR`
    pub raft_dir: Option<String>,
    /// `QUEEN_RAFT_NODE_ID`
    pub node_id: Option<String>,
    /// `QUEEN_RAFT_PEERS`
    pub peers: Option<String>,
    /// `QUEEN_RAFT_TOKEN` (never logged)
    pub token: Option<String>,
    /// `QUEEN_RAFT_REPLICATOR`
    pub replicator: Option<String>,
    /// `QUEEN_MAX_BODY_BYTES`
    pub max_body_bytes: Option<String>,
    /// `QUEEN_REQUEST_TIMEOUT_MS`
    pub request_timeout_ms: Option<String>,
    /// `QUEEN_MAX_MESSAGE_BYTES`
    pub max_message_bytes: Option<String>,
    /// `QUEEN_BODY_TIMEOUT_MS`
    pub body_timeout_ms: Option<String>,
    /// `QUEEN_BODY_BUDGET_BYTES`
    pub body_budget_bytes: Option<String>,
    /// `QUEEN_RAFT_DISK_HIGH_PCT`
    pub disk_high_pct: Option<String>,
    /// `QUEEN_RAFT_DISK_RESERVE_BYTES`
    pub disk_reserve_bytes: Option<String>,
    /// `QUEEN_RAFT_JOIN`
    pub join: Option<String>,
    /// `QUEEN_RAFT_CLIENT_OFFLOAD`
    pub client_offload: Option<String>,
    /// `QUEEN_TENANCY_HEADER`
    pub tenancy_header: Option<String>,
    /// `QUEEN_KV_TRUSTED_PROXY`
    pub kv_trusted_proxy: Option<String>,
    /// `QUEEN_RAFT_PROMOTE_MAX_LAG`
    pub promote_max_lag: Option<String>,
    /// `QUEEN_RAFT_READY_LAG_ENTRIES`
    pub ready_lag_entries: Option<String>,
    /// `QUEEN_RAFT_READY_LAG_MS`
    pub ready_lag_ms: Option<String>,
    /// `QUEEN_RAFT_MAX_CLOCK_SKEW_MS`
    pub max_clock_skew_ms: Option<String>,
    /// The machine's hostname, for `QUEEN_RAFT_NODE_ID=ordinal`.
    pub hostname: Option<String>,
    /// `QUEEN_ENCRYPTION_KEY`
    pub encryption_key: Option<SecretText>,
    /// `QUEEN_RAFT_HEARTBEAT_MS`
    pub heartbeat_ms: Option<String>,
    /// `QUEEN_EPHEMERAL_MAX_BYTES`, `QUEEN_EPHEMERAL_QUEUE_MAX_BYTES`,
    /// `QUEEN_EPHEMERAL_QUEUE_MAX_LENGTH`, `QUEEN_EPHEMERAL_LEASE_S`,
    /// `QUEEN_EPHEMERAL_RETRY_LIMIT`, `QUEEN_EPHEMERAL_IDLE_S`, `QUEEN_EPHEMERAL_MAX_QUEUES`,
    /// `QUEEN_EPHEMERAL_MAX_QUEUES_PER_TENANT`, in this order.
    pub ephemeral: [Option<String>; 8],
    /// `QUEEN_ANALYTICS_INTERVAL_MS`, `QUEEN_ANALYTICS_RETENTION_S`,
    /// `QUEEN_ANALYTICS_MAX_BYTES`, in this order.
    pub analytics: [Option<String>; 3],
    /// `QUEEN_RAFT_ELECTION_MIN_MS`
    pub election_min_ms: Option<String>,
    /// `QUEEN_RAFT_ELECTION_MAX_MS`
    pub election_max_ms: Option<String>,
    /// `QUEEN_RAFT_GROUPS`
    pub raft_groups: Option<String>,
    /// `QUEEN_TENANT_GROUPS`
    pub tenant_groups: Option<String>,
    /// `QUEEN_TEST_*`: the test hooks.
    pub test_hooks: RawTestHooks,
}

/// A secret setting as given: cloned and passed on, never printed.
#[derive(Clone, Default)]
pub struct SecretText(pub String);

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// A peer of the raft group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Node id.
    pub id: u64,
    /// Raft address `host:port`.
    pub raft: String,
    /// Client address `host:port`.
    pub http: String,
}

pub use queen_domain::groups::group_raft_addr;

/// The validated configuration.
#[derive(Clone)]
pub struct Config {
    /// Client port.
    pub port: u16,
    /// Address to bind.
    pub host: IpAddr,
    /// Data directory.
    pub raft_dir: PathBuf,
    /// This node's id.
    pub node_id: u64,
    /// The voters (empty: this node alone).
    pub peers: Vec<Peer>,
    /// Shared raft secret.
    pub token: Option<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Deadline of a request that has to commit.
    pub request_timeout: Duration,
    /// Largest payload of one message, and of one KV value or timer payload.
    pub max_message_bytes: usize,
    /// How long a request body may take to arrive (client and raft ports).
    pub body_timeout: Duration,
    /// Bytes of request bodies held in memory at once, per port (client, raft).
    pub body_budget_bytes: usize,
    /// Above this disk use (percent) the node answers its own clients' writes 507.
    pub disk_high_pct: u8,
    /// Free space (bytes) no write may take: pops, acks and the sink's commits stop here too,
    /// before the state store would fail a write.
    pub disk_reserve_bytes: u64,
    /// Start empty and wait to be added as a learner.
    pub join: bool,
    /// Followers forward their clients' commands to the leader (else they answer 503).
    pub client_offload: bool,
    /// `x-queen-tenant` names a request's tenant (only behind a trusted proxy).
    pub tenancy_header: bool,
    /// A learner further behind is not promoted without `force`.
    pub promote_max_lag: u64,
    /// Ready within this many entries of the commit index...
    pub ready_lag_entries: u64,
    /// ...or when the last applied entry is this recent (broker time).
    pub ready_lag_ms: u64,
    /// After a leader change, leases timed under the previous leader are held this long past
    /// their expiry.
    pub max_clock_skew_ms: u64,
    /// The leader's heartbeat period, in ms.
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in `election_min_ms..election_max_ms`
    /// stands for election; a voter refuses other candidates for `election_max_ms` after it last
    /// heard the leader (openraft's leader lease).
    pub election_min_ms: u64,
    /// See `election_min_ms`.
    pub election_max_ms: u64,
    /// The payload cipher of encrypted queues, from `QUEEN_ENCRYPTION_KEY` (none: unset).
    pub encryption: Option<std::sync::Arc<queen_crypto::Aes256Gcm>>,
    /// The ephemeral queues' ceilings and defaults.
    pub ephemeral: queen_domain::ephemeral::Limits,
    /// How often the node samples its analytics, and how much of them it keeps.
    pub analytics: AnalyticsSettings,
    /// The raft groups this process runs (`QUEEN_RAFT_GROUPS`) and where each tenant lives
    /// (`QUEEN_TENANT_GROUPS`).
    pub placement: queen_domain::groups::Placement,
    /// The test hooks (`QUEEN_TEST_*`), off unless a test sets them.
    pub test_hooks: TestHooks,
}

/// The analytics sampler's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnalyticsSettings {
    /// Milliseconds between samples (0: no sampling, no analytics).
    pub interval_ms: u64,
    /// Seconds of samples kept.
    pub retention_s: u64,
    /// Bytes of samples kept at most.
    pub max_bytes: u64,
}

impl Default for AnalyticsSettings {
    fn default() -> Self {
        Self {
            interval_ms: 60_000,
            retention_s: 7 * 86_400,
            max_bytes: 256 << 20,
        }
    }
}

/// The analytics settings, each checked against its range.
fn analytics_settings(raw: &[Option<String>; 3]) -> Result<AnalyticsSettings, ConfigError> {
    let d = AnalyticsSettings::default();
    let within = |i: usize, var: &'static str, default: u64, lo: u64, hi: u64| {
        let v: u64 = number(&raw[i], var, default, "a whole number")?;
        if v == 0 && i == 0 || (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(bad(var, format!("{v} is outside {lo}..={hi}")))
        }
    };
    Ok(AnalyticsSettings {
        interval_ms: within(
            0,
            "QUEEN_ANALYTICS_INTERVAL_MS",
            d.interval_ms,
            100,
            3_600_000,
        )?,
        retention_s: within(
            1,
            "QUEEN_ANALYTICS_RETENTION_S",
            d.retention_s,
            10,
            366 * 86_400,
        )?,
        max_bytes: within(
            2,
            "QUEEN_ANALYTICS_MAX_BYTES",
            d.max_bytes,
            64 << 10,
            1 << 40,
        )?,
    })
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("port", &self.port)
            .field("host", &self.host)
            .field("raft_dir", &self.raft_dir)
            .field("node_id", &self.node_id)
            .field("peers", &self.peers)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("request_timeout", &self.request_timeout)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("body_timeout", &self.body_timeout)
            .field("body_budget_bytes", &self.body_budget_bytes)
            .field("disk_high_pct", &self.disk_high_pct)
            .field("disk_reserve_bytes", &self.disk_reserve_bytes)
            .field("join", &self.join)
            .field("encryption", &self.encryption.as_ref().map(|_| "<key set>"))
            .field("test_hooks", &self.test_hooks)
            .finish()
    }
}

impl Config {
    /// The settings the node runs with, on one line for its start-up log: every value but the
    /// raft token, which shows only whether it is set.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "peers={} token={} encryption_key={} request_timeout_ms={} max_body_bytes={} max_message_bytes={} body_timeout_ms={} body_budget_bytes={} disk_high_pct={} disk_reserve_bytes={} client_offload={} promote_max_lag={} ready_lag_entries={} ready_lag_ms={} max_clock_skew_ms={} heartbeat_ms={} election_ms={}..{} join={} raft_groups={}",
            self.peers.len(),
            if self.token.is_some() { "set" } else { "unset" },
            if self.encryption.is_some() {
                "set"
            } else {
                "unset"
            },
            self.request_timeout.as_millis(),
            self.max_body_bytes,
            self.max_message_bytes,
            self.body_timeout.as_millis(),
            self.body_budget_bytes,
            self.disk_high_pct,
            self.disk_reserve_bytes,
            self.client_offload,
            self.promote_max_lag,
            self.ready_lag_entries,
            self.ready_lag_ms,
            self.max_clock_skew_ms,
            self.heartbeat_ms,
            self.election_min_ms,
            self.election_max_ms,
            self.join,
            self.placement.groups(),
        )
    }
}

/// A value that stops the boot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct ConfigError {
    /// The variable's name.
    pub variable: &'static str,
    /// What is wrong (never echoes a secret).
    pub problem: String,
}

/// Default largest message payload: one message always fits in the 8 MiB a fetch reads per
/// entry by default, and one large message cannot hold up everyone else's reads for long.
const DEFAULT_MAX_MESSAGE: usize = 8 << 20;
/// Default budget of request bodies in memory per port (or `QUEEN_MAX_BODY_BYTES` if larger).
const DEFAULT_BODY_BUDGET: usize = 256 << 20;
/// Largest budget of request bodies in memory per port.
const MAX_BODY_BUDGET: usize = 16 << 30;
/// Largest `QUEEN_RAFT_DISK_RESERVE_BYTES` (1 TiB).
const MAX_RESERVE_BYTES: u64 = 1 << 40;

fn bad(variable: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        variable,
        problem: problem.into(),
    }
}

fn set(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn number<T: std::str::FromStr>(
    v: &Option<String>,
    var: &'static str,
    default: T,
    what: &str,
) -> Result<T, ConfigError> {
    match set(v) {
        None => Ok(default),
        Some(s) => s
            .parse()
            .map_err(|_| bad(var, format!("'{s}' is not {what}"))),
    }
}

/// The ephemeral queues' settings, each checked against its range.
fn ephemeral_limits(
    raw: &[Option<String>; 8],
) -> Result<queen_domain::ephemeral::Limits, ConfigError> {
    let d = queen_domain::ephemeral::Limits::default();
    let within = |i: usize, var: &'static str, default: u64, lo: u64, hi: u64| {
        let v: u64 = number(&raw[i], var, default, "a whole number")?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(bad(var, format!("{v} is outside {lo}..={hi}")))
        }
    };
    let node_max_bytes = within(
        0,
        "QUEEN_EPHEMERAL_MAX_BYTES",
        d.node_max_bytes,
        1 << 20,
        1 << 40,
    )?;
    let max_queues = within(6, "QUEEN_EPHEMERAL_MAX_QUEUES", d.max_queues, 1, 1_000_000)?;
    Ok(queen_domain::ephemeral::Limits {
        node_max_bytes,
        queue_max_bytes: within(
            1,
            "QUEEN_EPHEMERAL_QUEUE_MAX_BYTES",
            d.queue_max_bytes.min(node_max_bytes),
            1024,
            node_max_bytes,
        )?,
        queue_max_length: within(
            2,
            "QUEEN_EPHEMERAL_QUEUE_MAX_LENGTH",
            d.queue_max_length,
            1,
            10_000_000,
        )?,
        lease_ms: within(3, "QUEEN_EPHEMERAL_LEASE_S", d.lease_ms / 1000, 1, 86_400)? * 1000,
        retry_limit: u32::try_from(within(
            4,
            "QUEEN_EPHEMERAL_RETRY_LIMIT",
            u64::from(d.retry_limit),
            0,
            1000,
        )?)
        .unwrap_or(1000),
        idle_ms: within(5, "QUEEN_EPHEMERAL_IDLE_S", d.idle_ms / 1000, 0, 7 * 86_400)? * 1000,
        max_queues,
        max_queues_per_tenant: within(
            7,
            "QUEEN_EPHEMERAL_MAX_QUEUES_PER_TENANT",
            d.max_queues_per_tenant.min(max_queues),
            1,
            max_queues,
        )?,
    })
}

fn flag(v: &Option<String>, var: &'static str, default: bool) -> Result<bool, ConfigError> {
    match set(v).map(str::to_ascii_lowercase).as_deref() {
        None => Ok(default),
        Some("true" | "1" | "yes" | "on") => Ok(true),
        Some("false" | "0" | "no" | "off") => Ok(false),
        Some(other) => Err(bad(var, format!("'{other}' is not true or false"))),
    }
}

/// Parse `id=raft_host:port/http_host:port,...`.
///
/// # Errors
/// The first malformed peer, named.
pub fn parse_peers(s: &str) -> Result<Vec<Peer>, ConfigError> {
    let mut out: Vec<Peer> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let shape = || {
            bad(
                "QUEEN_RAFT_PEERS",
                format!("'{part}' is not id=raft_host:port/http_host:port"),
            )
        };
        let (id, addrs) = part.split_once('=').ok_or_else(shape)?;
        let id: u64 = id.trim().parse().map_err(|_| shape())?;
        let (raft, http) = addrs.split_once('/').ok_or_else(shape)?;
        for a in [raft, http] {
            let (h, p) = a.rsplit_once(':').ok_or_else(shape)?;
            if h.is_empty() || p.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(shape());
            }
        }
        if out.iter().any(|p| p.id == id) {
            return Err(bad(
                "QUEEN_RAFT_PEERS",
                format!("node id {id} appears twice"),
            ));
        }
        out.push(Peer {
            id,
            raft: raft.to_owned(),
            http: http.to_owned(),
        });
    }
    Ok(out)
}

impl RawConfig {
    /// Validate.
    ///
    /// # Errors
    /// The first bad value, naming its variable.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let port: u16 = number(&self.port, "PORT", 6632, "a port number (1-65535)")?;
        if port == 0 {
            return Err(bad("PORT", "'0' is not a port number (1-65535)"));
        }
        let host: IpAddr = number(
            &self.host,
            "HOST",
            IpAddr::from([0, 0, 0, 0]),
            "an IP address",
        )?;
        let raft_dir = PathBuf::from(set(&self.raft_dir).unwrap_or("./queen-data"));
        let node_id = match set(&self.node_id) {
            None => 1,
            Some(s) if s.eq_ignore_ascii_case("ordinal") => {
                let host = set(&self.hostname).unwrap_or("");
                let n = host
                    .rsplit_once('-')
                    .and_then(|(_, n)| n.parse::<u64>().ok())
                    .ok_or_else(|| {
                        bad(
                            "QUEEN_RAFT_NODE_ID",
                            format!("'ordinal' needs a hostname ending in -N, got '{host}'"),
                        )
                    })?;
                n + 1
            }
            Some(s) => match s.parse::<u64>() {
                Ok(0) | Err(_) => {
                    return Err(bad(
                        "QUEEN_RAFT_NODE_ID",
                        format!("'{s}' is not a node id (a number from 1, or ordinal)"),
                    ));
                }
                Ok(n) => n,
            },
        };
        if let Some(r) = set(&self.replicator)
            && !r.eq_ignore_ascii_case("openraft")
        {
            return Err(bad(
                "QUEEN_RAFT_REPLICATOR",
                format!("'{r}' is not a replicator (openraft)"),
            ));
        }
        let peers = match set(&self.peers) {
            None => Vec::new(),
            Some(s) => parse_peers(s)?,
        };
        if !peers.is_empty() && !peers.iter().any(|p| p.id == node_id) {
            return Err(bad(
                "QUEEN_RAFT_PEERS",
                format!("does not list this node's id {node_id}"),
            ));
        }
        let token = set(&self.token).map(str::to_owned);
        if peers.len() > 1 && token.is_none() {
            return Err(bad(
                "QUEEN_RAFT_TOKEN",
                "is required with more than one voter",
            ));
        }
        let max_body_bytes: usize = number(
            &self.max_body_bytes,
            "QUEEN_MAX_BODY_BYTES",
            64 << 20,
            "a byte count",
        )?;
        if !(1024..=1 << 30).contains(&max_body_bytes) {
            return Err(bad(
                "QUEEN_MAX_BODY_BYTES",
                format!("{max_body_bytes} is outside 1024..=1073741824"),
            ));
        }
        let timeout_ms: u64 = number(
            &self.request_timeout_ms,
            "QUEEN_REQUEST_TIMEOUT_MS",
            30_000,
            "milliseconds",
        )?;
        if !(100..=600_000).contains(&timeout_ms) {
            return Err(bad(
                "QUEEN_REQUEST_TIMEOUT_MS",
                format!("{timeout_ms} is outside 100..=600000"),
            ));
        }
        let max_message_bytes: usize = number(
            &self.max_message_bytes,
            "QUEEN_MAX_MESSAGE_BYTES",
            DEFAULT_MAX_MESSAGE.min(max_body_bytes),
            "a byte count",
        )?;
        if !(1024..=max_body_bytes).contains(&max_message_bytes) {
            return Err(bad(
                "QUEEN_MAX_MESSAGE_BYTES",
                format!(
                    "{max_message_bytes} is outside 1024..={max_body_bytes} (a message must fit in a body: at most QUEEN_MAX_BODY_BYTES)"
                ),
            ));
        }
        let body_timeout_ms: u64 = number(
            &self.body_timeout_ms,
            "QUEEN_BODY_TIMEOUT_MS",
            30_000,
            "milliseconds",
        )?;
        if !(1000..=600_000).contains(&body_timeout_ms) {
            return Err(bad(
                "QUEEN_BODY_TIMEOUT_MS",
                format!("{body_timeout_ms} is outside 1000..=600000"),
            ));
        }
        let body_budget_bytes: usize = number(
            &self.body_budget_bytes,
            "QUEEN_BODY_BUDGET_BYTES",
            DEFAULT_BODY_BUDGET.max(max_body_bytes),
            "a byte count",
        )?;
        if !(max_body_bytes..=MAX_BODY_BUDGET).contains(&body_budget_bytes) {
            return Err(bad(
                "QUEEN_BODY_BUDGET_BYTES",
                format!(
                    "{body_budget_bytes} is outside {max_body_bytes}..={MAX_BODY_BUDGET} (at least QUEEN_MAX_BODY_BYTES, so one largest body fits)"
                ),
            ));
        }
        let disk_high_pct: u8 = number(
            &self.disk_high_pct,
            "QUEEN_RAFT_DISK_HIGH_PCT",
            85,
            "a percentage (1-100)",
        )?;
        if !(1..=100).contains(&disk_high_pct) {
            return Err(bad(
                "QUEEN_RAFT_DISK_HIGH_PCT",
                format!("{disk_high_pct} is outside 1..=100"),
            ));
        }
        let disk_reserve_bytes: u64 = number(
            &self.disk_reserve_bytes,
            "QUEEN_RAFT_DISK_RESERVE_BYTES",
            crate::disk_gate::DEFAULT_RESERVE_BYTES,
            "a byte count",
        )?;
        if disk_reserve_bytes > MAX_RESERVE_BYTES {
            return Err(bad(
                "QUEEN_RAFT_DISK_RESERVE_BYTES",
                format!("{disk_reserve_bytes} is outside 0..={MAX_RESERVE_BYTES}"),
            ));
        }
        let join = flag(&self.join, "QUEEN_RAFT_JOIN", false)?;
        let client_offload = flag(&self.client_offload, "QUEEN_RAFT_CLIENT_OFFLOAD", true)?;
        let tenancy_header = flag(&self.tenancy_header, "QUEEN_TENANCY_HEADER", false)?;
        if tenancy_header && !flag(&self.kv_trusted_proxy, "QUEEN_KV_TRUSTED_PROXY", false)? {
            return Err(bad(
                "QUEEN_TENANCY_HEADER",
                "lets any client that reaches this port name any tenant in x-queen-tenant; it needs QUEEN_KV_TRUSTED_PROXY=1, which says a proxy in front of the node sets that header and drops the clients' own",
            ));
        }
        if join && !peers.iter().any(|p| p.id == node_id) {
            return Err(bad(
                "QUEEN_RAFT_JOIN",
                "needs this node's own entry in QUEEN_RAFT_PEERS (its raft address)",
            ));
        }
        let promote_max_lag: u64 = number(
            &self.promote_max_lag,
            "QUEEN_RAFT_PROMOTE_MAX_LAG",
            1000,
            "an entry count",
        )?;
        let ready_lag_entries: u64 = number(
            &self.ready_lag_entries,
            "QUEEN_RAFT_READY_LAG_ENTRIES",
            1000,
            "an entry count",
        )?;
        let ready_lag_ms: u64 = number(
            &self.ready_lag_ms,
            "QUEEN_RAFT_READY_LAG_MS",
            2000,
            "milliseconds",
        )?;
        let max_clock_skew_ms: u64 = number(
            &self.max_clock_skew_ms,
            "QUEEN_RAFT_MAX_CLOCK_SKEW_MS",
            500,
            "milliseconds",
        )?;
        if max_clock_skew_ms > 60_000 {
            return Err(bad(
                "QUEEN_RAFT_MAX_CLOCK_SKEW_MS",
                format!("{max_clock_skew_ms} is outside 0..=60000"),
            ));
        }
        let (heartbeat_ms, election_min_ms, election_max_ms) = timings::validate(self)?;
        let encryption = match self
            .encryption_key
            .as_ref()
            .filter(|k| !k.0.trim().is_empty())
        {
            None => None,
            Some(k) => Some(std::sync::Arc::new(
                queen_crypto::Aes256Gcm::from_hex(&k.0)
                    .map_err(|e| bad("QUEEN_ENCRYPTION_KEY", e.to_string()))?,
            )),
        };
        let ephemeral = ephemeral_limits(&self.ephemeral)?;
        let analytics = analytics_settings(&self.analytics)?;
        let groups: u16 = number(
            &self.raft_groups,
            "QUEEN_RAFT_GROUPS",
            1,
            "a group count (1-64)",
        )?;
        let placement = queen_domain::groups::Placement::new(groups, "")
            .map_err(|e| bad("QUEEN_RAFT_GROUPS", e.to_string()))?;
        let placement = match self.tenant_groups.as_deref() {
            Some(pins) if !pins.trim().is_empty() => {
                queen_domain::groups::Placement::new(groups, pins)
                    .map_err(|e| bad("QUEEN_TENANT_GROUPS", e.to_string()))?
            }
            _ => placement,
        };
        if let Some(p) = peers
            .iter()
            .find(|p| group_raft_addr(&p.raft, groups - 1).is_none())
        {
            return Err(bad(
                "QUEEN_RAFT_GROUPS",
                format!(
                    "group {} of node {} would listen on its raft port plus {}, which is not a port: lower the raft port",
                    groups - 1,
                    p.id,
                    groups - 1
                ),
            ));
        }
        if groups > 1 && !client_offload {
            return Err(bad(
                "QUEEN_RAFT_GROUPS",
                "several groups need QUEEN_RAFT_CLIENT_OFFLOAD on: a node serves every tenant, and forwards to the leader of the tenant's group what it does not lead",
            ));
        }
        Ok(Config {
            test_hooks: self.test_hooks.resolve(),
            placement,
            ephemeral,
            analytics,
            heartbeat_ms,
            election_min_ms,
            election_max_ms,
            encryption,
            join,
            client_offload,
            tenancy_header,
            promote_max_lag,
            ready_lag_entries,
            ready_lag_ms,
            max_clock_skew_ms,
            disk_high_pct,
            disk_reserve_bytes,
            port,
            host,
            raft_dir,
            node_id,
            peers,
            token,
            max_body_bytes,
            request_timeout: Duration::from_millis(timeout_ms),
            max_message_bytes,
            body_timeout: Duration::from_millis(body_timeout_ms),
            body_budget_bytes,
        })
    }
}

mod test_hooks;
mod timings;

pub use test_hooks::{RawTestHooks, S3CrashPoint, TestHooks};

#[cfg(test)]
mod tests;
