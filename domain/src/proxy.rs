//! The embedded proxy's rules: which cluster and tenant a request is for, what its API key may
//! do, what a cluster's status lets through, and the documents the proxy keeps about tenants,
//! clusters and keys.
//!
//! A *tenant* is a customer; it owns *clusters* (a cluster is what a client addresses, by the
//! first label of `Host` or by its key); each cluster has its own broker tenant id
//! (`broker_tenant_uuid`), under which the broker stores that cluster's queues, KV and timers.
//! API keys (`qk_<env>_<43 base64url characters>`) belong to one cluster and carry scopes; only
//! their SHA-256 is ever stored. The documents live in the replicated KV store under the
//! proxy's reserved tenant ([`crate::tenant::PROXY_TENANT`]), laid out in [`directory`].

use sha2::{Digest, Sha256};

pub mod directory;
pub mod plans;
pub mod routes;

/// The plans a cluster may be on.
pub const PLANS: [&str; 4] = ["free", "dev", "pro", "dedicated-s"];

/// A cluster's stored status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterStatus {
    /// Everything allowed.
    Active,
    /// Pushes refused; consumers and readers may drain.
    PushBlocked,
    /// Every data-plane request refused.
    Suspended,
    /// On its way out: refused like `Suspended`.
    Deleting,
}

/// A tenant's stored status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TenantStatus {
    /// Everything allowed.
    Active,
    /// A grace period (unpaid, say): pushes refused like `push_blocked`.
    Grace,
    /// Every data-plane request refused.
    Suspended,
    /// On its way out: refused like `Suspended`; purge and delete need it.
    Deleting,
}

impl ClusterStatus {
    /// From its wire name.
    ///
    /// # Errors
    /// When `text` is not one of `active`, `push_blocked`, `suspended`, `deleting`.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        match text {
            "active" => Ok(Self::Active),
            "push_blocked" => Ok(Self::PushBlocked),
            "suspended" => Ok(Self::Suspended),
            "deleting" => Ok(Self::Deleting),
            _ => Err("must be one of active, push_blocked, suspended, deleting"),
        }
    }

    /// Its wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::PushBlocked => "push_blocked",
            Self::Suspended => "suspended",
            Self::Deleting => "deleting",
        }
    }
}

impl TenantStatus {
    /// From its wire name.
    ///
    /// # Errors
    /// When `text` is not one of `active`, `grace`, `suspended`, `deleting`.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        match text {
            "active" => Ok(Self::Active),
            "grace" => Ok(Self::Grace),
            "suspended" => Ok(Self::Suspended),
            "deleting" => Ok(Self::Deleting),
            _ => Err("must be one of active, grace, suspended, deleting"),
        }
    }

    /// Its wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Grace => "grace",
            Self::Suspended => "suspended",
            Self::Deleting => "deleting",
        }
    }
}

/// What a cluster's and its tenant's statuses together let through: the worse of the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effective {
    /// Everything.
    Active,
    /// Everything but growing writes (pushes and their kin).
    PushBlocked,
    /// Nothing of the data plane.
    Suspended,
}

/// The worse of a cluster's and its tenant's status.
#[must_use]
pub fn effective(cluster: ClusterStatus, tenant: TenantStatus) -> Effective {
    let c = match cluster {
        ClusterStatus::Active => Effective::Active,
        ClusterStatus::PushBlocked => Effective::PushBlocked,
        ClusterStatus::Suspended | ClusterStatus::Deleting => Effective::Suspended,
    };
    let t = match tenant {
        TenantStatus::Active => Effective::Active,
        TenantStatus::Grace => Effective::PushBlocked,
        TenantStatus::Suspended | TenantStatus::Deleting => Effective::Suspended,
    };
    c.max(t)
}

/// What an API key may do: a non-empty subset of produce, consume, admin and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// Push and transactions.
    pub const PRODUCE: Self = Self(1);
    /// Pop, ack, leases, fetch.
    pub const CONSUME: Self = Self(2);
    /// Queue administration (configure, deletions, DLQ retries).
    pub const ADMIN: Self = Self(4);
    /// Listings, status, message reads.
    pub const READ: Self = Self(8);
    /// Every scope (a bootstrap key).
    pub const ALL: Self = Self(15);

    const NAMES: [(&'static str, Self); 4] = [
        ("produce", Self::PRODUCE),
        ("consume", Self::CONSUME),
        ("admin", Self::ADMIN),
        ("read", Self::READ),
    ];

    /// From their names.
    ///
    /// # Errors
    /// When the list is empty or names something else.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        let mut out = Self(0);
        for n in names {
            let n = n.as_ref();
            match Self::NAMES.iter().find(|(k, _)| *k == n) {
                Some((_, s)) => out.0 |= s.0,
                None => {
                    return Err(format!(
                        "'{n}' is not a scope (produce, consume, admin, read)"
                    ));
                }
            }
        }
        if out.0 == 0 {
            return Err("must name at least one scope".to_owned());
        }
        Ok(out)
    }

    /// Their names, in a fixed order.
    #[must_use]
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(_, s)| self.has(*s))
            .map(|(n, _)| *n)
            .collect()
    }

    /// Whether every scope of `other` is here.
    #[must_use]
    pub fn has(self, other: Self) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }

    /// Whether any scope of `other` is here.
    #[must_use]
    pub fn any(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// The union.
    #[must_use]
    pub fn or(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// The SHA-256 of an API key in lowercase hexadecimal: the only form of a key that is stored.
#[must_use]
pub fn key_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether `text` is 64 lowercase hexadecimal digits (a key's hash as the control plane takes
/// it).
#[must_use]
pub fn is_hash(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Whether a bearer credential is an API key: `qk_<env>_<43 base64url characters>`, `env` a
/// short lowercase word.
#[must_use]
pub fn is_api_key(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("qk_") else {
        return false;
    };
    let Some((env, secret)) = rest.split_once('_') else {
        return false;
    };
    !env.is_empty()
        && env.len() <= 16
        && env
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && secret.len() == 43
        && secret
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// An API key from 32 random bytes: `qk_<env>_` and the bytes in unpadded base64url.
#[must_use]
pub fn format_key(env: &str, random: &[u8; 32]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = format!("qk_{env}_");
    let mut bits = 0u32;
    let mut n = 0u32;
    for &b in random {
        bits = (bits << 8) | u32::from(b);
        n += 8;
        while n >= 6 {
            n -= 6;
            out.push(char::from(B64[((bits >> n) & 63) as usize]));
        }
    }
    if n > 0 {
        out.push(char::from(B64[((bits << (6 - n)) & 63) as usize]));
    }
    out
}

/// Whether `text` is a DNS label: 1 to 63 of `a-z 0-9 -`, not starting or ending with `-`.
#[must_use]
pub fn is_slug(text: &str) -> bool {
    let b = text.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// The cluster a `Host` header names: its first DNS label, lowercased, without the port. An
/// IP address names none.
#[must_use]
pub fn host_label(host: &str) -> Option<String> {
    let host = host.trim();
    if host.starts_with('[') {
        return None;
    }
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    if name.is_empty() || name.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
        return None;
    }
    let label = name.split('.').next()?.to_ascii_lowercase();
    is_slug(&label).then_some(label)
}

/// Whether a request whose `Host` names the cluster `label` (`None`: an address, or no
/// `Host`) may act on `key_cluster`, the cluster of its (valid) key: the `Host` names that
/// cluster, or that cluster is the node's `default` one, the fallback of every `Host` that
/// names no cluster. A default cluster's key acts on it whatever the `Host` says, so no key's
/// answer tells whether the cluster a `Host` names exists.
#[must_use]
pub fn host_admits(label: Option<&str>, key_cluster: &str, default: Option<&str>) -> bool {
    label == Some(key_cluster) || default == Some(key_cluster)
}

/// The host part of a `Host` header, lowercased, without the port.
#[must_use]
pub fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = if host.starts_with('[') {
        host.split_once(']')
            .map_or(host, |(h, _)| h)
            .trim_start_matches('[')
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_admits_its_own_cluster_and_the_default_cluster_any_host() {
        assert!(host_admits(Some("acme"), "acme", None));
        assert!(!host_admits(Some("beta"), "acme", None));
        assert!(!host_admits(None, "acme", None));
        // The default cluster's key: whatever the host, known or not.
        assert!(host_admits(Some("beta"), "acme", Some("acme")));
        assert!(host_admits(Some("nowhere"), "acme", Some("acme")));
        assert!(host_admits(None, "acme", Some("acme")));
        // Another cluster's key: the same refusal for a known and an unknown name.
        assert!(!host_admits(Some("nowhere"), "beta", Some("acme")));
        assert!(!host_admits(None, "beta", Some("acme")));
    }

    #[test]
    fn the_worse_status_applies() {
        use ClusterStatus as C;
        use TenantStatus as T;
        assert_eq!(effective(C::Active, T::Active), Effective::Active);
        assert_eq!(effective(C::PushBlocked, T::Active), Effective::PushBlocked);
        assert_eq!(effective(C::Active, T::Grace), Effective::PushBlocked);
        assert_eq!(
            effective(C::PushBlocked, T::Suspended),
            Effective::Suspended
        );
        assert_eq!(effective(C::Deleting, T::Grace), Effective::Suspended);
        assert_eq!(effective(C::Active, T::Deleting), Effective::Suspended);
    }

    #[test]
    fn scopes_parse_and_name() {
        let s = Scopes::parse(&["consume", "produce"]).expect("scopes");
        assert_eq!(s.names(), ["produce", "consume"]);
        assert!(s.has(Scopes::PRODUCE) && !s.has(Scopes::ADMIN));
        assert!(Scopes::parse::<&str>(&[]).is_err());
        assert!(Scopes::parse(&["write"]).is_err());
        assert_eq!(Scopes::ALL.names().len(), 4);
    }

    #[test]
    fn a_formatted_key_is_a_key_and_hashes_to_hex() {
        let k = format_key("live", &[7u8; 32]);
        assert!(is_api_key(&k), "{k}");
        assert_eq!(k.len(), "qk_live_".len() + 43);
        assert!(is_hash(&key_hash(&k)));
        assert_eq!(
            key_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(!is_api_key("qk_live_short"));
        assert!(!is_api_key("eyJhbGciOi.x.y"));
        assert!(!is_hash(&key_hash("abc").to_uppercase()));
    }

    #[test]
    fn slugs_are_dns_labels() {
        assert!(is_slug("acme-1"));
        assert!(!is_slug("-acme") && !is_slug("Acme") && !is_slug("") && !is_slug("a.b"));
        assert!(!is_slug(&"a".repeat(64)));
    }

    #[test]
    fn the_host_names_a_cluster_by_its_first_label() {
        assert_eq!(
            host_label("acme.queen.example.com").as_deref(),
            Some("acme")
        );
        assert_eq!(host_label("ACME.example.com:6711").as_deref(), Some("acme"));
        assert_eq!(host_label("localhost:6711").as_deref(), Some("localhost"));
        assert_eq!(host_label("127.0.0.1:6711"), None);
        assert_eq!(host_label("[::1]:6711"), None);
        assert_eq!(host_name("Queen.Example.com:443"), "queen.example.com");
        assert_eq!(host_name("[::1]:80"), "::1");
    }
}
