//! A JWK set fetched from `JWT_JWKS_URL`: keys by `kid`, refreshed every
//! `JWT_JWKS_REFRESH_INTERVAL`, and fetched again when a token names a `kid` the set does not
//! have, at most once per [`REFETCH_GAP`] whatever the number of such tokens, so a stream of
//! forged `kid`s cannot turn the node into a client flooding the identity provider.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{Mutex, RwLock};

/// The shortest time between two fetches caused by an unknown `kid`.
pub(super) const REFETCH_GAP: Duration = Duration::from_secs(5);
/// The largest JWK set read (bytes).
const MAX_SET_BYTES: usize = 1 << 20;
/// The most keys kept from one set.
const MAX_KEYS: usize = 256;

/// What a key verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rsa,
    Ed,
}

#[derive(Clone)]
struct Key {
    kid: Option<String>,
    kind: Kind,
    key: DecodingKey,
}

/// The cached set and its fetcher.
pub(super) struct Jwks {
    url: String,
    client: reqwest::Client,
    refresh: Duration,
    keys: RwLock<Arc<Vec<Key>>>,
    /// When the last fetch was tried (successful or not): read without waiting by every
    /// request whose key the set holds.
    last: std::sync::Mutex<Option<Instant>>,
    /// Held while a fetch runs, so concurrent requests wait for one fetch instead of starting
    /// their own.
    fetching: Mutex<()>,
}

impl Jwks {
    pub(super) fn new(url: String, refresh: Duration, timeout: Duration) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(|e| format!("no HTTP client for the JWK set: {e}"))?;
        Ok(Self {
            url,
            client,
            refresh,
            keys: RwLock::new(Arc::new(Vec::new())),
            last: std::sync::Mutex::new(None),
            fetching: Mutex::new(()),
        })
    }

    /// Fetch now, whatever the time since the last fetch.
    pub(super) async fn refresh_now(&self) {
        let _one = self.fetching.lock().await;
        self.fetch().await;
    }

    /// The time since the last fetch was tried, if one was.
    fn since_last(&self) -> Option<Duration> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map(|t| t.elapsed())
    }

    /// The key that verifies a token of `alg` naming `kid`: fetched again first when the set
    /// is older than the refresh interval, or when it lacks `kid` and the last fetch is older
    /// than [`REFETCH_GAP`]. A token without `kid` takes the set's only key of its kind.
    pub(super) async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let kind = if alg == Algorithm::EdDSA {
            Kind::Ed
        } else {
            Kind::Rsa
        };
        if self.since_last().is_some_and(|d| d < self.refresh)
            && let Some(k) = self.find(kid, kind).await
        {
            return Some(k);
        }
        let one = self.fetching.lock().await;
        // Another request may have fetched while this one waited for the lock: then the gap
        // has not passed, and the set it fetched answers.
        if self.since_last().is_none_or(|d| d >= REFETCH_GAP) {
            self.fetch().await;
        }
        drop(one);
        self.find(kid, kind).await
    }

    async fn find(&self, kid: Option<&str>, kind: Kind) -> Option<DecodingKey> {
        let keys = self.keys.read().await.clone();
        match kid {
            Some(kid) => keys
                .iter()
                .find(|k| k.kind == kind && k.kid.as_deref() == Some(kid))
                .map(|k| k.key.clone()),
            None => {
                let mut of_kind = keys.iter().filter(|k| k.kind == kind);
                match (of_kind.next(), of_kind.next()) {
                    (Some(only), None) => Some(only.key.clone()),
                    _ => None,
                }
            }
        }
    }

    /// Fetch the set (the caller holds `fetching`).
    async fn fetch(&self) {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        match self.download().await {
            Ok(keys) => {
                tracing::info!(target: "queen-http", keys = keys.len(), "JWK set fetched");
                *self.keys.write().await = Arc::new(keys);
            }
            Err(e) => {
                // The URL may carry a query with credentials: it is not logged.
                tracing::warn!(target: "queen-http", error = %e, "the JWK set could not be fetched; the keys held before stay in use");
            }
        }
    }

    async fn download(&self) -> Result<Vec<Key>, String> {
        let mut resp = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|e| format!("request failed: {}", e.without_url()))?;
        if !resp.status().is_success() {
            return Err(format!("the server answered {}", resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("reading the answer failed: {}", e.without_url()))?
        {
            if body.len() + chunk.len() > MAX_SET_BYTES {
                return Err(format!("the JWK set is larger than {MAX_SET_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        parse(&body)
    }
}

/// The usable keys of a JWK set document: RSA keys and Ed25519 keys (`OKP`); other kinds are
/// skipped (this node does not verify them).
fn parse(body: &[u8]) -> Result<Vec<Key>, String> {
    let set: JwkSet =
        serde_json::from_slice(body).map_err(|e| format!("not a JWK set document: {e}"))?;
    let mut out = Vec::new();
    for jwk in set.keys.iter().take(MAX_KEYS) {
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Kind::Rsa,
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Kind::Ed,
            _ => continue,
        };
        if let Ok(key) = DecodingKey::from_jwk(jwk) {
            out.push(Key {
                kid: jwk.common.key_id.clone(),
                kind,
                key,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_keeps_rsa_and_ed25519_keys_and_skips_the_rest() {
        let doc = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r1", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "e1", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty": "EC", "crv": "P-256", "kid": "c1", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
        ]});
        let keys = parse(doc.to_string().as_bytes()).expect("a set");
        let kinds: Vec<(Option<&str>, Kind)> =
            keys.iter().map(|k| (k.kid.as_deref(), k.kind)).collect();
        assert_eq!(kinds, vec![(Some("r1"), Kind::Rsa), (Some("e1"), Kind::Ed)]);
        assert!(parse(b"{\"nope\": 1}").is_err());
    }
}
