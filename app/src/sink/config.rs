//! The sink's settings, read once from the environment at boot. Every `QUEEN_S3_*` variable of
//! the reference, with its default and range; a blank value counts as unset; enumerated values
//! ignore case; a bad value stops the boot with one line naming the variable and what it is for.

use std::fmt;

use queen_domain::sink::keys::Align;
pub use queen_lake::AddressPolicy;

pub use queen_lake::{Compression, Format, ParquetCodec};

/// One object per window, or one per partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One object per window.
    Merged,
    /// One object per partition of a window.
    PerPartition,
}

/// Where a queue found for the first time starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From its first record.
    Earliest,
    /// From the moment the sink finds it.
    Latest,
}

/// Where the lake lives.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// An S3-compatible service.
    S3 {
        /// Endpoint URL (AWS when unset).
        endpoint: Option<String>,
        /// Region.
        region: String,
        /// Bucket in the URL path.
        path_style: bool,
        /// Bucket.
        bucket: String,
        /// Access key id.
        access_key: String,
        /// Secret key (never printed).
        secret_key: String,
        /// Server-side encryption.
        sse: Option<String>,
    },
    /// A local folder (`file://<path>`), the bucket a folder inside it.
    Local(std::path::PathBuf),
    /// Memory (`memory://`), for tests: gone with the process.
    Memory,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::S3 {
                endpoint,
                region,
                path_style,
                bucket,
                access_key,
                sse,
                ..
            } => f
                .debug_struct("S3")
                .field("endpoint", endpoint)
                .field("region", region)
                .field("path_style", path_style)
                .field("bucket", bucket)
                .field("access_key", access_key)
                .field("secret_key", &"***")
                .field("sse", sse)
                .finish(),
            Target::Local(p) => f.debug_tuple("Local").field(p).finish(),
            Target::Memory => f.write_str("Memory"),
        }
    }
}

/// Which queues to mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queues {
    /// Every queue.
    All,
    /// These.
    Named(Vec<String>),
}

/// The sink's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkSettings {
    /// The sink's name in KV documents and manifests.
    pub name: String,
    /// Tenant written in keys.
    pub tenant: String,
    /// Queues.
    pub queues: Queues,
    /// Lake.
    pub target: Target,
    /// Key prefix.
    pub prefix: String,
    /// Format.
    pub format: Format,
    /// JSONL compression.
    pub compression: Compression,
    /// Parquet codec.
    pub parquet_codec: ParquetCodec,
    /// Layout.
    pub layout: Layout,
    /// Start.
    pub start: Start,
    /// Window age limit, ms.
    pub max_window_ms: u64,
    /// Window size target, MiB.
    pub target_mb: u64,
    /// Alignment.
    pub align: Align,
    /// Node-wide buffer budget, MiB.
    pub memory_mb: u64,
    /// Guard below safeTime, ms.
    pub safe_guard_ms: u64,
    /// Lease TTL, ms.
    pub lease_ttl_ms: u64,
    /// Windows between checkpoints.
    pub checkpoint_every: u64,
    /// Parallel log reads per node.
    pub fetch_concurrency: u64,
    /// Drain budget at shutdown, ms.
    pub shutdown_grace_ms: u64,
    /// Name written in leases.
    pub instance: String,
    /// A tenant's own sink (the control plane's): mirrors that tenant's queues only. The
    /// node's own sink (`QUEEN_S3_*`) mirrors every tenant that has no sink of its own.
    pub own_tenant: bool,
    /// `QUEEN_S3_ALLOW_PRIVATE_ENDPOINTS` (node-wide): tenant sinks may reach loopback,
    /// private, link-local and metadata addresses.
    pub allow_private_endpoints: bool,
    /// Which addresses this sink's endpoint may reach: any for the operator's own endpoint,
    /// public-only for a tenant's unless `allow_private_endpoints`.
    pub addresses: AddressPolicy,
}

/// A setting that stops the boot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("QUEEN_S3_EMBEDDED=true: {0}")]
pub struct SinkConfigError(String);

/// What reading the environment gave.
#[derive(Debug)]
pub struct SinkBoot {
    /// The settings, when the sink is on.
    pub settings: Option<SinkSettings>,
    /// Warnings to log once logging is up.
    pub warnings: Vec<String>,
}

fn help(var: &str) -> &'static str {
    match var {
        "QUEEN_S3_MAX_WINDOW_MS" => {
            "It is how long a window may stay open; the lag SLO is about this plus the safe lag"
        }
        "QUEEN_S3_TARGET_MB" => "It is how much uncompressed data closes a window",
        "QUEEN_S3_MEMORY_MB" => "It is the node-wide budget of the sink's buffers",
        "QUEEN_S3_SAFE_GUARD_MS" => "It is how far below safeTime a window's end stays",
        "QUEEN_S3_LEASE_TTL_MS" => "It is how long a queue's lease lives without a refresh",
        "QUEEN_S3_CHECKPOINT_EVERY" => "It is how many windows pass between checkpoints",
        "QUEEN_S3_FETCH_CONCURRENCY" => "It is how many reads of the log run at once on this node",
        "QUEEN_S3_SHUTDOWN_GRACE_MS" => {
            "It is how long the broker waits for the sink's drain at shutdown"
        }
        "QUEEN_S3_QUEUES" => "It names the queues to mirror: * or a comma-separated list",
        "QUEEN_S3_BUCKET" => "It is the bucket the lake is written to",
        "QUEEN_S3_ENDPOINT" => {
            "It is the object store: an http(s) URL, file://<folder> or memory://"
        }
        _ => "See docs/s3-sink.md",
    }
}

fn bad(var: &str, shown: &str, problem: &str) -> SinkConfigError {
    SinkConfigError(format!("{var}={shown} {problem}. {}", help(var)))
}

fn missing(var: &str) -> SinkConfigError {
    SinkConfigError(format!("{var} is required. {}", help(var)))
}

struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.0)(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    fn num(&self, var: &str, default: u64, lo: u64, hi: u64) -> Result<u64, SinkConfigError> {
        let Some(v) = self.get(var) else {
            return Ok(default);
        };
        match v.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            Ok(_) => Err(bad(var, &v, &format!("is outside {lo}..={hi}"))),
            Err(_) => Err(bad(
                var,
                &v,
                &format!("is not a whole number in {lo}..={hi}"),
            )),
        }
    }

    fn choice<T: Copy>(
        &self,
        var: &str,
        default: T,
        options: &[(&str, T)],
    ) -> Result<T, SinkConfigError> {
        let Some(v) = self.get(var) else {
            return Ok(default);
        };
        options
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(&v))
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                bad(var, &v, &format!("is not one of {}", names.join(", ")))
            })
    }

    fn flag(&self, var: &str) -> Result<bool, SinkConfigError> {
        self.choice(
            var,
            false,
            &[
                ("true", true),
                ("false", false),
                ("1", true),
                ("0", false),
                ("yes", true),
                ("no", false),
            ],
        )
    }
}

/// Read the sink's settings. `node_id` names the instance when `QUEEN_S3_INSTANCE` is unset.
///
/// # Errors
/// A value that stops the boot, in the reference's one-line form.
pub fn from_env(
    get: &dyn Fn(&str) -> Option<String>,
    node_id: u64,
) -> Result<SinkBoot, SinkConfigError> {
    let env = Env(get);
    if !env
        .flag("QUEEN_S3_EMBEDDED")
        .map_err(|e| SinkConfigError(e.0.replacen("QUEEN_S3_EMBEDDED=true: ", "", 1)))?
    {
        return Ok(SinkBoot {
            settings: None,
            warnings: Vec::new(),
        });
    }
    if env.get("QUEEN_S3_PARTITIONS").is_some() {
        return Err(SinkConfigError(
            "QUEEN_S3_PARTITIONS is set: static partition lists are not supported, because a window can only close against what discovery reports. Unset it".into(),
        ));
    }
    let mut warnings = Vec::new();
    let leftovers: Vec<&str> = ["QUEEN_S3_LISTEN", "QUEEN_S3_LOG_FORMAT"]
        .into_iter()
        .filter(|v| env.get(v).is_some())
        .collect();
    if !leftovers.is_empty() {
        warnings.push(format!("{} left over from the standalone sink: ignored (the embedded sink opens no port and logs with the broker)", leftovers.join(" and ")));
    }
    let queues = match env.get("QUEEN_S3_QUEUES") {
        None => return Err(missing("QUEEN_S3_QUEUES")),
        Some(q) if q == "*" => Queues::All,
        Some(q) => {
            let names: Vec<String> = q
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            if let Some(n) = names
                .iter()
                .find(|n| queen_domain::names::QueueName::new(n.as_str()).is_err())
            {
                return Err(bad(
                    "QUEEN_S3_QUEUES",
                    &q,
                    &format!("names '{n}', which is not a queue name"),
                ));
            }
            if names.is_empty() {
                return Err(missing("QUEEN_S3_QUEUES"));
            }
            Queues::Named(names)
        }
    };
    let target = match env.get("QUEEN_S3_ENDPOINT") {
        Some(e) if e.to_ascii_lowercase().starts_with("file://") => {
            let path = std::path::PathBuf::from(&e["file://".len()..]);
            if path.as_os_str().is_empty() {
                return Err(bad("QUEEN_S3_ENDPOINT", &e, "names no folder"));
            }
            Target::Local(match env.get("QUEEN_S3_BUCKET") {
                Some(b) => {
                    endpoint::folder_bucket(&b)?;
                    path.join(b)
                }
                None => path,
            })
        }
        Some(e) if e.eq_ignore_ascii_case("memory://") => Target::Memory,
        endpoint => {
            // The operator's own endpoint: its addresses are the operator's choice.
            let endpoint = endpoint
                .map(|e| endpoint::s3_endpoint(&e, AddressPolicy::Any))
                .transpose()?;
            let bucket = env
                .get("QUEEN_S3_BUCKET")
                .ok_or_else(|| missing("QUEEN_S3_BUCKET"))?;
            endpoint::s3_bucket(&bucket)?;
            let region = env
                .get("QUEEN_S3_REGION")
                .unwrap_or_else(|| "us-east-1".to_owned());
            endpoint::s3_region(&region)?;
            let access_key = env.get("QUEEN_S3_ACCESS_KEY").ok_or_else(|| {
                SinkConfigError("QUEEN_S3_ACCESS_KEY is required for an S3 endpoint. It is the access key id of the bucket's credentials".into())
            })?;
            let secret_key = env.get("QUEEN_S3_SECRET_KEY").ok_or_else(|| {
                SinkConfigError("QUEEN_S3_SECRET_KEY is required for an S3 endpoint. It is the secret of the bucket's credentials (never logged)".into())
            })?;
            if secret_key.len() > 4096 {
                return Err(SinkConfigError("QUEEN_S3_SECRET_KEY is longer than 4 KiB. It is the secret of the bucket's credentials (never logged)".into()));
            }
            let sse = match env.get("QUEEN_S3_SSE") {
                None => None,
                Some(s) if s.eq_ignore_ascii_case("AES256") => Some("AES256".to_owned()),
                Some(s) if s.to_ascii_lowercase().starts_with("aws:kms") => Some(s),
                Some(s) => return Err(bad("QUEEN_S3_SSE", &s, "is not AES256 or aws:kms[:key]")),
            };
            Target::S3 {
                endpoint,
                region,
                path_style: env.flag("QUEEN_S3_PATH_STYLE")?,
                bucket,
                access_key,
                secret_key,
                sse,
            }
        }
    };
    let prefix = env
        .get("QUEEN_S3_PREFIX")
        .unwrap_or_else(|| "queen".to_owned())
        .trim_matches('/')
        .to_owned();
    if prefix.is_empty()
        || prefix
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(bad("QUEEN_S3_PREFIX", &prefix, "is not a key prefix"));
    }
    Ok(SinkBoot {
        settings: Some(SinkSettings {
            name: "default".to_owned(),
            tenant: queen_domain::sink::keys::DEFAULT_TENANT.to_owned(),
            queues,
            target,
            prefix,
            format: env.choice(
                "QUEEN_S3_FORMAT",
                Format::Jsonl,
                &[("jsonl", Format::Jsonl), ("parquet", Format::Parquet)],
            )?,
            compression: env.choice(
                "QUEEN_S3_COMPRESSION",
                Compression::Zstd,
                &[
                    ("zstd", Compression::Zstd),
                    ("gzip", Compression::Gzip),
                    ("none", Compression::None),
                ],
            )?,
            parquet_codec: env.choice(
                "QUEEN_S3_PARQUET_CODEC",
                ParquetCodec::Zstd,
                &[
                    ("zstd", ParquetCodec::Zstd),
                    ("snappy", ParquetCodec::Snappy),
                ],
            )?,
            layout: env.choice(
                "QUEEN_S3_LAYOUT",
                Layout::Merged,
                &[
                    ("merged", Layout::Merged),
                    ("per-partition", Layout::PerPartition),
                ],
            )?,
            start: env.choice(
                "QUEEN_S3_START",
                Start::Latest,
                &[("earliest", Start::Earliest), ("latest", Start::Latest)],
            )?,
            max_window_ms: env.num("QUEEN_S3_MAX_WINDOW_MS", 300_000, 100, 86_400_000)?,
            target_mb: env.num("QUEEN_S3_TARGET_MB", 128, 1, 4096)?,
            align: env.choice(
                "QUEEN_S3_ALIGN",
                Align::Hour,
                &[
                    ("hour", Align::Hour),
                    ("day", Align::Day),
                    ("none", Align::None),
                ],
            )?,
            memory_mb: env.num("QUEEN_S3_MEMORY_MB", 512, 16, 65_536)?,
            safe_guard_ms: env.num("QUEEN_S3_SAFE_GUARD_MS", 5000, 0, 600_000)?,
            lease_ttl_ms: env.num("QUEEN_S3_LEASE_TTL_MS", 30_000, 1000, 600_000)?,
            checkpoint_every: env.num("QUEEN_S3_CHECKPOINT_EVERY", 10, 1, 10_000)?,
            fetch_concurrency: env.num("QUEEN_S3_FETCH_CONCURRENCY", 4, 1, 64)?,
            shutdown_grace_ms: env.num("QUEEN_S3_SHUTDOWN_GRACE_MS", 30_000, 0, 600_000)?,
            instance: env
                .get("QUEEN_S3_INSTANCE")
                .unwrap_or_else(|| format!("node-{node_id}")),
            own_tenant: false,
            allow_private_endpoints: env.flag("QUEEN_S3_ALLOW_PRIVATE_ENDPOINTS")?,
            addresses: AddressPolicy::Any,
        }),
        warnings,
    })
}

impl SinkSettings {
    /// The one start line: every setting but the secret.
    #[must_use]
    pub fn describe(&self) -> String {
        let target = match &self.target {
            Target::S3 {
                endpoint,
                region,
                path_style,
                bucket,
                access_key,
                sse,
                ..
            } => format!(
                "endpoint={} region={region} path_style={path_style} bucket={bucket} access_key={access_key} sse={}",
                endpoint.as_deref().unwrap_or("aws"),
                sse.as_deref().unwrap_or("none")
            ),
            Target::Local(p) => format!("endpoint=file://{}", p.display()),
            Target::Memory => "endpoint=memory://".to_owned(),
        };
        let queues = match &self.queues {
            Queues::All => "*".to_owned(),
            Queues::Named(n) => n.join(","),
        };
        format!(
            "sink={} tenant={} queues={queues} {target} prefix={} format={} compression={} parquet_codec={} layout={} start={} max_window_ms={} target_mb={} align={} memory_mb={} safe_guard_ms={} lease_ttl_ms={} checkpoint_every={} fetch_concurrency={} shutdown_grace_ms={} instance={}",
            self.name,
            self.tenant,
            self.prefix,
            low(&self.format),
            low(&self.compression),
            low(&self.parquet_codec),
            if self.layout == Layout::Merged {
                "merged"
            } else {
                "per-partition"
            },
            low(&self.start),
            self.max_window_ms,
            self.target_mb,
            low(&self.align),
            self.memory_mb,
            self.safe_guard_ms,
            self.lease_ttl_ms,
            self.checkpoint_every,
            self.fetch_concurrency,
            self.shutdown_grace_ms,
            self.instance,
        )
    }
}

fn low(v: &dyn fmt::Debug) -> String {
    format!("{v:?}").to_lowercase()
}

mod endpoint;
#[cfg(test)]
mod tests;

/// The fields of a tenant sink's document (the control plane's `PUT .../s3`) and the variable
/// each stands for: the per-sink settings, with the environment's defaults and ranges.
const TENANT_FIELDS: [(&str, &str); 18] = [
    ("endpoint", "QUEEN_S3_ENDPOINT"),
    ("region", "QUEEN_S3_REGION"),
    ("pathStyle", "QUEEN_S3_PATH_STYLE"),
    ("bucket", "QUEEN_S3_BUCKET"),
    ("accessKey", "QUEEN_S3_ACCESS_KEY"),
    ("sse", "QUEEN_S3_SSE"),
    ("queues", "QUEEN_S3_QUEUES"),
    ("prefix", "QUEEN_S3_PREFIX"),
    ("format", "QUEEN_S3_FORMAT"),
    ("compression", "QUEEN_S3_COMPRESSION"),
    ("parquetCodec", "QUEEN_S3_PARQUET_CODEC"),
    ("layout", "QUEEN_S3_LAYOUT"),
    ("start", "QUEEN_S3_START"),
    ("maxWindowMs", "QUEEN_S3_MAX_WINDOW_MS"),
    ("targetMb", "QUEEN_S3_TARGET_MB"),
    ("align", "QUEEN_S3_ALIGN"),
    ("safeGuardMs", "QUEEN_S3_SAFE_GUARD_MS"),
    ("checkpointEvery", "QUEEN_S3_CHECKPOINT_EVERY"),
];

/// Node-wide settings: environment only, shared by every sink of the node; a tenant document
/// that names one is refused.
const NODE_WIDE_FIELDS: [&str; 10] = [
    "allowPrivateEndpoints",
    "memoryMb",
    "leaseTtlMs",
    "fetchConcurrency",
    "shutdownGraceMs",
    "instance",
    "embedded",
    "partitions",
    "listen",
    "logFormat",
];

/// The most bytes a tenant sink's settings may take, as JSON.
pub const TENANT_CONFIG_MAX_BYTES: usize = 32 * 1024;

/// A tenant sink's settings from its document, checked with the same rules, defaults and
/// ranges as the environment's; the node-wide settings come from `node` (the node's own
/// sink), the tenant is `tenant` (its broker tenant id). Only S3 endpoints are taken (a tenant
/// never writes into the node's own folders).
///
/// # Errors
/// The first problem, naming the document's field: an unknown field, a node-wide one, another
/// field named like a secret, a value outside its range, a missing bucket or access key.
pub fn tenant_settings(
    doc: &serde_json::Map<String, serde_json::Value>,
    secret: &str,
    node: &SinkSettings,
    tenant: &str,
) -> Result<SinkSettings, String> {
    if serde_json::to_vec(doc).map_or(0, |v| v.len()) > TENANT_CONFIG_MAX_BYTES {
        return Err("the sink's settings take more than 32 KiB".to_owned());
    }
    for (field, value) in doc {
        if NODE_WIDE_FIELDS.contains(&field.as_str()) {
            return Err(format!(
                "{field} is a node-wide setting: it comes from the node's environment and cannot be set per tenant"
            ));
        }
        let lower = field.to_ascii_lowercase();
        if ["secret", "password", "token", "credential", "private"]
            .iter()
            .any(|w| lower.contains(w))
        {
            return Err(format!(
                "{field} is named like a secret; the only secret a sink takes is secretKey, which is stored sealed"
            ));
        }
        if !TENANT_FIELDS.iter().any(|(f, _)| f == field) {
            let known: Vec<&str> = TENANT_FIELDS.iter().map(|(f, _)| *f).collect();
            return Err(format!(
                "{field} is not a sink setting (one of {})",
                known.join(", ")
            ));
        }
        if !(value.is_string() || value.is_number() || value.is_boolean() || value.is_null()) {
            return Err(format!("{field} must be a string, a number or a boolean"));
        }
    }
    match doc.get("endpoint").and_then(serde_json::Value::as_str) {
        Some(e) if e.starts_with("http://") || e.starts_with("https://") => {}
        _ => {
            return Err(
                "endpoint is required and must be an http:// or https:// URL (a tenant's sink writes to S3)"
                    .to_owned(),
            );
        }
    }
    let get = |var: &str| -> Option<String> {
        match var {
            "QUEEN_S3_EMBEDDED" => Some("true".to_owned()),
            "QUEEN_S3_SECRET_KEY" => Some(secret.to_owned()),
            _ => {
                let (field, _) = TENANT_FIELDS.iter().find(|(_, v)| *v == var)?;
                match doc.get(*field)? {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Null => None,
                    other => Some(other.to_string()),
                }
            }
        }
    };
    let boot = from_env(&get, 0).map_err(|e| {
        // The environment's sentence, with the document's field names.
        let mut text = e.0;
        for (field, var) in TENANT_FIELDS {
            text = text.replace(var, field);
        }
        text.replace("QUEEN_S3_SECRET_KEY", "secretKey")
    })?;
    let mut s = boot
        .settings
        .ok_or_else(|| "the sink's settings are incomplete".to_owned())?;
    s.tenant = tenant.to_owned();
    s.memory_mb = node.memory_mb;
    s.lease_ttl_ms = node.lease_ttl_ms;
    s.fetch_concurrency = node.fetch_concurrency;
    s.shutdown_grace_ms = node.shutdown_grace_ms;
    s.instance.clone_from(&node.instance);
    s.allow_private_endpoints = node.allow_private_endpoints;
    s.addresses = if node.allow_private_endpoints {
        AddressPolicy::Any
    } else {
        AddressPolicy::PublicOnly
    };
    if let Target::S3 {
        endpoint: Some(e), ..
    } = &s.target
    {
        // A literal address is judged now (a 400 at the control plane); a name at every
        // connection the sink makes.
        queen_lake::check_endpoint(e, s.addresses).map_err(|e| format!("endpoint {e}"))?;
    }
    Ok(s)
}
