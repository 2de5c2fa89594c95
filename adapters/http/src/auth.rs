//! Broker JWT on the client port: the `JWT_*` settings, token verification (HS256/384/512,
//! RS256/384/512, EdDSA, `auto`; a shared secret, a PEM public key or a JWK set), the roles a
//! token grants, and the level each route needs ([`routes::need`]).
//!
//! The check runs before any body byte is read. A missing token is a 401 `unauthorized` with
//! reason `missing_token`, a token that fails verification a 401 with the reason (`expired`,
//! `bad_signature`, `wrong_issuer`, ...), a valid token whose roles do not reach the route's
//! level a 403 `forbidden`. A token never reaches a log line, an answer or an error.

mod claims;
mod jwks;
pub(crate) mod routes;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use queen_domain::access::{Grants, Need, Role};
use serde_json::Value;

use crate::api::ApiError;
use jwks::Jwks;

/// A setting of `JWT_*` that stops the boot, named.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {problem}")]
pub struct AuthConfigError {
    /// The variable.
    pub var: &'static str,
    /// What is wrong with it (never its value when it is a secret).
    pub problem: String,
}

fn bad(var: &'static str, problem: impl Into<String>) -> AuthConfigError {
    AuthConfigError {
        var,
        problem: problem.into(),
    }
}

/// Which signature algorithms the node accepts (`JWT_ALGORITHM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accepts {
    /// HS256, HS384, HS512 with `JWT_SECRET`.
    Hmac,
    /// RS256, RS384, RS512 with `JWT_PUBLIC_KEY` or `JWT_JWKS_URL`.
    Rsa,
    /// EdDSA (Ed25519) with `JWT_PUBLIC_KEY` or `JWT_JWKS_URL`.
    Ed,
    /// Every family the configured key material serves.
    Auto,
}

const HMAC: [Algorithm; 3] = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
const RSA: [Algorithm; 3] = [Algorithm::RS256, Algorithm::RS384, Algorithm::RS512];

/// The broker JWT settings and key material. Built once at boot; [`Auth::from_env`] refuses
/// settings that could never verify a token.
pub struct Auth {
    accepts: Accepts,
    secret: Option<DecodingKey>,
    public_key: Option<DecodingKey>,
    jwks: Option<Arc<Jwks>>,
    issuer: Option<String>,
    audience: Option<String>,
    clock_skew: u64,
    skip_paths: Vec<SkipPath>,
    roles_claim: String,
    roles_array_claim: String,
    /// The claim that names the tenant a token acts for (`JWT_TENANT_CLAIM`).
    tenant_claim: String,
    role_names: [(String, Role); 4],
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("accepts", &self.accepts)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("public_key", &self.public_key.is_some())
            .field("jwks", &self.jwks.is_some())
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// Who a request is, once its token is verified.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principal {
    /// The token's `sub`, when it has one.
    pub sub: Option<String>,
    /// The roles it carries.
    pub grants: Grants,
    /// The tenant its tenant claim names (`JWT_TENANT_CLAIM`), as written.
    pub tenant: Option<String>,
}

fn set(get: &dyn Fn(&str) -> Option<String>, var: &str) -> Option<String> {
    get(var)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

fn flag(get: &dyn Fn(&str) -> Option<String>, var: &'static str) -> Result<bool, AuthConfigError> {
    match set(get, var).map(|v| v.to_ascii_lowercase()).as_deref() {
        None | Some("false" | "0" | "no" | "off") => Ok(false),
        Some("true" | "1" | "yes" | "on") => Ok(true),
        Some(other) => Err(bad(var, format!("'{other}' is not true or false"))),
    }
}

fn number(
    get: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    default: u64,
    max: u64,
) -> Result<u64, AuthConfigError> {
    match set(get, var) {
        None => Ok(default),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(bad(
                var,
                format!("'{v}' is not a whole number from 0 to {max}"),
            )),
        },
    }
}

/// One entry of `JWT_SKIP_PATHS`, as segments.
#[derive(Debug, Clone)]
struct SkipPath {
    segs: Vec<String>,
    /// Written with a trailing `/` (and not `/` itself): every path under it too.
    under: bool,
}

impl SkipPath {
    fn parse(path: &str) -> Self {
        let segs: Vec<String> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        Self {
            under: path.ends_with('/') && !segs.is_empty(),
            segs,
        }
    }
}

impl Auth {
    /// Read the `JWT_*` settings through `get`. `Ok(None)`: JWT is off (`JWT_ENABLED` unset or
    /// false).
    ///
    /// # Errors
    /// A setting that is malformed, or JWT enabled without the key material its algorithm
    /// needs (the boot stops with this line).
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, AuthConfigError> {
        if !flag(get, "JWT_ENABLED")? {
            return Ok(None);
        }
        let accepts = match set(get, "JWT_ALGORITHM")
            .unwrap_or_else(|| "HS256".to_owned())
            .to_ascii_uppercase()
            .as_str()
        {
            "HS256" | "HS384" | "HS512" => Accepts::Hmac,
            "RS256" | "RS384" | "RS512" => Accepts::Rsa,
            "EDDSA" => Accepts::Ed,
            "AUTO" => Accepts::Auto,
            other => {
                return Err(bad(
                    "JWT_ALGORITHM",
                    format!(
                        "'{other}' is not one of HS256, HS384, HS512, RS256, RS384, RS512, EdDSA, auto"
                    ),
                ));
            }
        };
        let secret = match set(get, "JWT_SECRET") {
            None => None,
            Some(s) => {
                if s.len() < 32 {
                    tracing::warn!(target: "queen-http", "JWT_SECRET is shorter than 32 bytes: an HMAC secret that short can be guessed");
                }
                Some(
                    DecodingKey::from_secret(s.as_bytes())
                        .map_err(|_| bad("JWT_SECRET", "is not a usable HMAC secret"))?,
                )
            }
        };
        let public_key = match set(get, "JWT_PUBLIC_KEY") {
            None => None,
            Some(pem) => {
                // The variable may hold the PEM text itself or, with `\n` written out, one line.
                let pem = pem.replace("\\n", "\n");
                let key = match accepts {
                    Accepts::Rsa => DecodingKey::from_rsa_pem(pem.as_bytes()).ok(),
                    Accepts::Ed => DecodingKey::from_ed_pem(pem.as_bytes()).ok(),
                    _ => DecodingKey::from_rsa_pem(pem.as_bytes())
                        .or_else(|_| DecodingKey::from_ed_pem(pem.as_bytes()))
                        .ok(),
                };
                Some(key.ok_or_else(|| {
                    bad(
                        "JWT_PUBLIC_KEY",
                        "is not a PEM public key of the algorithm's kind (an RSA key for RS*, an Ed25519 key for EdDSA)",
                    )
                })?)
            }
        };
        let jwks = match set(get, "JWT_JWKS_URL") {
            None => None,
            Some(url) => {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(bad("JWT_JWKS_URL", "is not an http:// or https:// URL"));
                }
                let refresh = number(get, "JWT_JWKS_REFRESH_INTERVAL", 3600, 86_400 * 7)?;
                let timeout = number(get, "JWT_JWKS_TIMEOUT_MS", 5000, 120_000)?;
                Some(Arc::new(
                    Jwks::new(
                        url,
                        Duration::from_secs(refresh.max(1)),
                        Duration::from_millis(timeout.max(1)),
                    )
                    .map_err(|e| bad("JWT_JWKS_URL", e))?,
                ))
            }
        };
        let has_public = public_key.is_some() || jwks.is_some();
        let missing = match accepts {
            Accepts::Hmac => secret.is_none().then_some("JWT_SECRET"),
            Accepts::Rsa | Accepts::Ed => (!has_public).then_some("JWT_PUBLIC_KEY or JWT_JWKS_URL"),
            Accepts::Auto => (secret.is_none() && !has_public)
                .then_some("JWT_SECRET, JWT_PUBLIC_KEY or JWT_JWKS_URL"),
        };
        if let Some(what) = missing {
            return Err(bad(
                "JWT_ENABLED",
                format!("JWT is on but {what} is not set: no token could be verified"),
            ));
        }
        let skip_paths = set(get, "JWT_SKIP_PATHS")
            // The metrics name every tenant's queues: not skipped unless the operator says so.
            .unwrap_or_else(|| "/health,/".to_owned())
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(SkipPath::parse)
            .collect();
        let name = |var: &str, default: &str| set(get, var).unwrap_or_else(|| default.to_owned());
        Ok(Some(Self {
            accepts,
            secret,
            public_key,
            jwks,
            issuer: set(get, "JWT_ISSUER"),
            audience: set(get, "JWT_AUDIENCE"),
            clock_skew: number(get, "JWT_CLOCK_SKEW", 30, 3600)?,
            skip_paths,
            roles_claim: name("JWT_ROLES_CLAIM", "role"),
            roles_array_claim: name("JWT_ROLES_ARRAY_CLAIM", "roles"),
            tenant_claim: name("JWT_TENANT_CLAIM", "tenant"),
            role_names: [
                (name("JWT_ROLE_ADMIN", "admin"), Role::Admin),
                (name("JWT_ROLE_READ_WRITE", "read-write"), Role::ReadWrite),
                (name("JWT_ROLE_READ_ONLY", "read-only"), Role::ReadOnly),
                (name("JWT_ROLE_WRITE_ONLY", "write-only"), Role::WriteOnly),
            ],
        }))
    }

    /// Fetch the JWK set once, if there is one, so the first requests do not wait for it. A
    /// failure is logged and the set is fetched again on the first token that needs it.
    pub async fn warm(&self) {
        if let Some(j) = &self.jwks {
            j.refresh_now().await;
        }
    }

    /// Whether a path (as decoded segments) is one of `JWT_SKIP_PATHS`: an entry matches its
    /// own path, and an entry written with a trailing `/` (other than `/` itself) also every
    /// path under it. Empty segments do not count (`/x/` and `/x` are the same path). Compared on the decoded segments the router matches, so no spelling of
    /// a path reaches a route other than the one that was skipped.
    #[must_use]
    pub fn skips(&self, segs: &[&str]) -> bool {
        self.skip_paths.iter().any(|skip| {
            let same = |n: usize| skip.segs.iter().zip(&segs[..n]).all(|(a, b)| a == b);
            (skip.segs.len() == segs.len() && same(segs.len()))
                || (skip.under && segs.len() > skip.segs.len() && same(skip.segs.len()))
        })
    }

    /// Authenticate and authorize one request that needs `need`, from its `authorization`
    /// header.
    ///
    /// # Errors
    /// 401 `unauthorized` (no token, or one that fails verification, with the reason), 403
    /// `forbidden` (a valid token whose roles do not reach `need`).
    pub async fn check(
        &self,
        authorization: Option<&hyper::header::HeaderValue>,
        need: Need,
    ) -> Result<Principal, ApiError> {
        if need == Need::Public {
            return Ok(Principal::default());
        }
        let token = bearer(authorization)?;
        let principal = self.verify(token).await?;
        if principal.grants.allow(need) {
            Ok(principal)
        } else {
            Err(ApiError::new(
                403,
                "forbidden",
                format!(
                    "this route needs the {} level; the token's roles do not reach it",
                    need.as_str()
                ),
            )
            .with_reason("role_too_low"))
        }
    }

    /// Who a token that verifies says the request is, on a route the check was skipped on (a
    /// skip path, or the raft token): its tenant still counts. A token that does not verify
    /// names no one.
    pub(crate) async fn identify(
        &self,
        authorization: Option<&hyper::header::HeaderValue>,
    ) -> Option<Principal> {
        let token = bearer(authorization).ok()?;
        self.verify(token).await.ok()
    }

    /// Verify a token's signature and claims and read its roles.
    async fn verify(&self, token: &str) -> Result<Principal, ApiError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| unauthorized("malformed", "the bearer token is not a JWT"))?;
        let alg = header.alg;
        let (family_ok, key) = if HMAC.contains(&alg) {
            (
                matches!(self.accepts, Accepts::Hmac | Accepts::Auto),
                self.secret.clone(),
            )
        } else if RSA.contains(&alg) || alg == Algorithm::EdDSA {
            let fits = if alg == Algorithm::EdDSA {
                matches!(self.accepts, Accepts::Ed | Accepts::Auto)
            } else {
                matches!(self.accepts, Accepts::Rsa | Accepts::Auto)
            };
            let pem = self
                .public_key
                .as_ref()
                .filter(|k| k.family() == alg.family())
                .cloned();
            let key = match (pem, &self.jwks) {
                (Some(k), _) => Some(k),
                (None, Some(j)) if fits => j.key_for(header.kid.as_deref(), alg).await,
                _ => None,
            };
            (fits, key)
        } else {
            (false, None)
        };
        if !family_ok {
            return Err(unauthorized(
                "algorithm_not_allowed",
                format!("tokens signed with {alg:?} are not accepted by this node"),
            ));
        }
        let Some(key) = key else {
            return Err(unauthorized(
                "unknown_key",
                "no key of this node verifies the token (an unknown kid, or no key for its algorithm)",
            ));
        };
        let mut v = Validation::new(alg);
        v.algorithms = vec![alg];
        // `exp` is optional, as in Queen; when present it is checked, with the skew. A
        // configured issuer or audience must be in the token (`null` counts as absent).
        v.required_spec_claims = HashSet::new();
        if self.issuer.is_some() {
            v.required_spec_claims.insert("iss".to_owned());
        }
        if self.audience.is_some() {
            v.required_spec_claims.insert("aud".to_owned());
        }
        v.leeway = self.clock_skew;
        v.validate_nbf = true;
        match &self.audience {
            Some(a) => v.set_audience(&[a]),
            None => v.validate_aud = false,
        }
        if let Some(i) = &self.issuer {
            v.set_issuer(&[i]);
        }
        let data = jsonwebtoken::decode::<claims::Claims>(token, &key, &v).map_err(|e| {
            let (reason, why) = match e.kind() {
                ErrorKind::ExpiredSignature => ("expired", "the token has expired"),
                ErrorKind::ImmatureSignature => {
                    ("not_yet_valid", "the token is not valid yet (nbf)")
                }
                ErrorKind::MissingRequiredClaim(c) if c == "iss" => (
                    "wrong_issuer",
                    "the token has no issuer (iss); this node requires one",
                ),
                ErrorKind::MissingRequiredClaim(c) if c == "aud" => (
                    "wrong_audience",
                    "the token has no audience (aud); this node requires one",
                ),
                ErrorKind::InvalidIssuer => (
                    "wrong_issuer",
                    "the token's issuer (iss) is not the one this node expects",
                ),
                ErrorKind::InvalidAudience => (
                    "wrong_audience",
                    "the token's audience (aud) is not the one this node expects",
                ),
                ErrorKind::InvalidSignature => {
                    ("bad_signature", "the token's signature does not verify")
                }
                ErrorKind::InvalidAlgorithm => (
                    "algorithm_not_allowed",
                    "the token's algorithm does not match the key",
                ),
                ErrorKind::InvalidClaimFormat(_) | ErrorKind::MissingRequiredClaim(_) => (
                    "bad_claims",
                    "a registered claim of the token has the wrong type",
                ),
                // Read after the signature verified: the payload is not one JSON object with
                // distinct keys (`claims`).
                ErrorKind::Json(_) => (
                    "bad_claims",
                    "the token's claims are not a JSON object with distinct keys",
                ),
                _ => ("malformed", "the bearer token could not be read"),
            };
            unauthorized(reason, why)
        })?;
        Ok(self.principal(&data.claims.0))
    }

    /// The roles and subject a token's claims carry. Claim names may be dotted paths into
    /// nested objects (`realm_access.roles`).
    fn principal(&self, claims: &Value) -> Principal {
        let at = |path: &str| {
            path.split('.')
                .try_fold(claims, |v, k| v.get(k))
                .filter(|v| !v.is_null())
        };
        let mut names: Vec<&str> = Vec::new();
        if let Some(Value::String(s)) = at(&self.roles_claim) {
            names.push(s);
        }
        if let Some(Value::Array(a)) = at(&self.roles_array_claim) {
            names.extend(a.iter().filter_map(Value::as_str));
        }
        let grants = names.iter().fold(Grants::none(), |g, n| {
            self.role_names
                .iter()
                .find(|(name, _)| name == n)
                .map_or(g, |(_, role)| g.with(*role))
        });
        Principal {
            sub: claims.get("sub").and_then(Value::as_str).map(str::to_owned),
            grants,
            tenant: at(&self.tenant_claim).map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }),
        }
    }
}

fn unauthorized(reason: &'static str, why: impl Into<String>) -> ApiError {
    ApiError::new(401, "unauthorized", why).with_reason(reason)
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(h: Option<&hyper::header::HeaderValue>) -> Result<&str, ApiError> {
    let Some(h) = h else {
        return Err(unauthorized(
            "missing_token",
            "this route needs a token: send Authorization: Bearer <JWT>",
        ));
    };
    let v = h
        .to_str()
        .map_err(|_| unauthorized("malformed", "the authorization header is not text"))?;
    match v.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(unauthorized(
            "missing_token",
            "the authorization header is not Bearer <JWT>",
        )),
    }
}
