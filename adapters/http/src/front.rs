//! What a browser could abuse on the client port, refused before any credential or body is
//! read: a state-changing body that is not JSON (or the binary push type), so a web page cannot
//! send one without a CORS preflight; a browser `Origin` other than the node itself or one the
//! operator allows (`QUEEN_ALLOWED_ORIGINS`), or with no `Origin` a `Sec-Fetch-Site` that says
//! another site's page asked; a `Host` outside the optional allow-list
//! (`QUEEN_ALLOWED_HOSTS`), the defence against DNS rebinding. Also the scrape credential of
//! `/metrics*` (`QUEEN_METRICS_TOKEN`), a bearer that is not a JWT.

use hyper::HeaderMap;
use hyper::header::{CONTENT_TYPE, HOST, ORIGIN};
use subtle::ConstantTimeEq;

use crate::api::ApiError;
use crate::auth::AuthConfigError;

/// The client port's browser and scrape rules. Built once at boot.
#[derive(Clone, Default)]
pub struct FrontRules {
    /// `QUEEN_ALLOWED_ORIGINS`: origins (`scheme://host[:port]`, lowercase) whose pages may
    /// call the API, besides the node's own.
    origins: Vec<String>,
    /// `QUEEN_ALLOWED_HOSTS`: `Host` values accepted (lowercase, `host` or `host:port`);
    /// empty: any.
    hosts: Vec<String>,
    /// `QUEEN_METRICS_TOKEN`: a bearer that reads `/metrics*` without a JWT.
    metrics_token: Option<String>,
}

impl std::fmt::Debug for FrontRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontRules")
            .field("origins", &self.origins)
            .field("hosts", &self.hosts)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

fn list(get: &dyn Fn(&str) -> Option<String>, var: &str) -> Vec<String> {
    get(var)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().trim_end_matches('/').to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

impl FrontRules {
    /// Read `QUEEN_ALLOWED_ORIGINS`, `QUEEN_ALLOWED_HOSTS` and `QUEEN_METRICS_TOKEN` through
    /// `get`.
    ///
    /// # Errors
    /// An origin that is not `http(s)://host[:port]`, a host with a scheme or a path, a
    /// metrics token shorter than 16 bytes (its value is never in the error).
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, AuthConfigError> {
        let origins = list(get, "QUEEN_ALLOWED_ORIGINS");
        for o in &origins {
            if origin_authority(o).is_none() {
                return Err(AuthConfigError {
                    var: "QUEEN_ALLOWED_ORIGINS",
                    problem: format!(
                        "'{o}' is not an origin (http://host[:port] or https://host[:port])"
                    ),
                });
            }
        }
        let hosts = list(get, "QUEEN_ALLOWED_HOSTS");
        for h in &hosts {
            if h.contains(['/', '@', ' ']) {
                return Err(AuthConfigError {
                    var: "QUEEN_ALLOWED_HOSTS",
                    problem: format!("'{h}' is not a host or host:port (no scheme, no path)"),
                });
            }
        }
        let metrics_token = get("QUEEN_METRICS_TOKEN")
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        if metrics_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(AuthConfigError {
                var: "QUEEN_METRICS_TOKEN",
                problem: "is shorter than 16 bytes: a token that short can be guessed".to_owned(),
            });
        }
        Ok(Self {
            origins,
            hosts,
            metrics_token,
        })
    }

    /// Whether a metrics token is set (then `/metrics*` needs a credential even without JWT).
    #[must_use]
    pub(crate) fn metrics_token_set(&self) -> bool {
        self.metrics_token.is_some()
    }

    /// Whether the request's `Authorization: Bearer` is the metrics token.
    #[must_use]
    pub(crate) fn is_metrics_bearer(&self, headers: &HeaderMap) -> bool {
        let Some(want) = &self.metrics_token else {
            return false;
        };
        let given = headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map_or("", |(_, t)| t.trim());
        bool::from(given.as_bytes().ct_eq(want.as_bytes()))
    }

    /// The `Host` and `Origin` rules, then the body type of a state-changing request.
    ///
    /// # Errors
    /// 421 `misdirected_request` for a `Host` outside the allow-list, 403 `forbidden` (reason
    /// `origin_not_allowed`) for a foreign `Origin`, 415 `unsupported_media_type` naming
    /// `content-type` for a body that is neither JSON nor the binary push type.
    pub(crate) fn check(
        &self,
        method: &hyper::Method,
        headers: &HeaderMap,
    ) -> Result<(), ApiError> {
        let host = headers
            .get(HOST)
            .and_then(|v| v.to_str().ok())
            .map(|h| h.trim().to_ascii_lowercase());
        if !self.hosts.is_empty() && !host.as_deref().is_some_and(|h| self.host_allowed(h)) {
            return Err(ApiError::new(
                421,
                "misdirected_request",
                "the Host header is not one this node serves (QUEEN_ALLOWED_HOSTS)",
            ));
        }
        let foreign = match headers.get(ORIGIN) {
            Some(origin) => {
                let origin = origin.to_str().unwrap_or("").trim().to_ascii_lowercase();
                !self.origin_allowed(&origin, host.as_deref())
            }
            // A page's `<img>` or `<script>` sends no Origin, but a browser still says where
            // it comes from; following a link (a navigation) stays allowed.
            None => {
                let fetch = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
                matches!(fetch("sec-fetch-site"), Some("cross-site" | "same-site"))
                    && fetch("sec-fetch-mode") != Some("navigate")
            }
        };
        if foreign {
            return Err(ApiError::new(
                403,
                "forbidden",
                "requests from a web page of another origin are refused (QUEEN_ALLOWED_ORIGINS lists the allowed ones)",
            )
            .with_reason("origin_not_allowed"));
        }
        if matches!(*method, hyper::Method::GET | hyper::Method::HEAD)
            || !crate::error::declares_body(headers)
        {
            return Ok(());
        }
        let kind = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
        if kind.is_some_and(|t| is_json(t) || crate::push_binary::is_binary(t)) {
            return Ok(());
        }
        Err(ApiError::new(
            415,
            "unsupported_media_type",
            format!(
                "content-type must be application/json (or {} on push and transaction) on a request with a body",
                crate::push_binary::CONTENT_TYPE
            ),
        ))
    }

    /// A listed host, exactly, or under a listed `*.domain` (every name below it, with the
    /// same port when the entry has one).
    fn host_allowed(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|allowed| match allowed.strip_prefix("*.") {
                None => allowed == host,
                Some(domain) => host
                    .strip_suffix(domain)
                    .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            })
    }

    /// The node's own origin (its `Host`, whatever the scheme) or a listed one.
    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        if self
            .origins
            .iter()
            .any(|o| o == origin.trim_end_matches('/'))
        {
            return true;
        }
        match (origin_authority(origin), host) {
            (Some((scheme, authority)), Some(host)) => {
                same_authority(authority, host, default_port(scheme))
            }
            _ => false,
        }
    }
}

/// `application/json`, parameters (`; charset=utf-8`) and case aside.
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The scheme and `host[:port]` of an origin `scheme://host[:port]`.
fn origin_authority(origin: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = origin.split_once("://")?;
    let ok = matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', '@', ' ']);
    ok.then_some((scheme, rest))
}

fn default_port(scheme: &str) -> &'static str {
    if scheme == "https" { "443" } else { "80" }
}

/// `a` and `b` name the same host and port, a missing port being the scheme's default.
fn same_authority(a: &str, b: &str, default: &str) -> bool {
    let split = |s: &str| -> (String, String) {
        // `[::1]:6632`, `host:6632`, `host`, `[::1]`.
        match s.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') && !p.is_empty() => (h.to_owned(), p.to_owned()),
            _ => (s.to_owned(), default.to_owned()),
        }
    };
    split(a) == split(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pairs: &[(&str, &str)]) -> FrontRules {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        FrontRules::from_env(&move |k: &str| {
            pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone())
        })
        .expect("valid")
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("a header value"));
        }
        h
    }

    fn status(r: &FrontRules, method: &str, h: &[(&'static str, &str)]) -> u16 {
        let m = hyper::Method::from_bytes(method.as_bytes()).expect("method");
        r.check(&m, &headers(h)).err().map_or(200, |e| e.status)
    }

    #[test]
    fn a_body_must_be_json_or_the_binary_type() {
        let r = FrontRules::default();
        let body = [("host", "n:6632"), ("content-length", "2")];
        assert_eq!(status(&r, "POST", &body), 415, "no content type");
        let json = [
            body[0],
            body[1],
            ("content-type", "application/json; charset=utf-8"),
        ];
        assert_eq!(status(&r, "POST", &json), 200);
        let bin = [
            body[0],
            body[1],
            ("content-type", "application/x-queen-push"),
        ];
        assert_eq!(status(&r, "POST", &bin), 200);
        for t in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            let h = [body[0], body[1], ("content-type", t)];
            assert_eq!(status(&r, "PUT", &h), 415, "{t}");
        }
        let chunked = [
            ("transfer-encoding", "chunked"),
            ("content-type", "text/plain"),
        ];
        assert_eq!(status(&r, "POST", &chunked), 415);
        // No body: nothing to read, nothing refused.
        assert_eq!(status(&r, "DELETE", &[("content-length", "0")]), 200);
        assert_eq!(status(&r, "DELETE", &[]), 200);
        assert_eq!(
            status(
                &r,
                "GET",
                &[("content-type", "text/plain"), ("content-length", "3")]
            ),
            200
        );
    }

    #[test]
    fn an_origin_passes_when_it_is_the_node_itself_or_listed() {
        let r = rules(&[(
            "QUEEN_ALLOWED_ORIGINS",
            "https://ops.example.com, http://127.0.0.1:3000/",
        )]);
        let with = |origin: &str, host: &str| {
            status(
                &r,
                "POST",
                &[("origin", origin), ("host", host), ("content-length", "0")],
            )
        };
        assert_eq!(with("http://127.0.0.1:6632", "127.0.0.1:6632"), 200);
        assert_eq!(with("http://[::1]:6632", "[::1]:6632"), 200);
        assert_eq!(with("http://node.example", "node.example:80"), 200);
        assert_eq!(with("https://ops.example.com", "127.0.0.1:6632"), 200);
        assert_eq!(with("http://127.0.0.1:3000", "127.0.0.1:6632"), 200);
        assert_eq!(with("http://evil.example", "127.0.0.1:6632"), 403);
        assert_eq!(with("null", "127.0.0.1:6632"), 403);
        assert_eq!(with("http://127.0.0.1:6633", "127.0.0.1:6632"), 403);
        // No Origin, but the browser says another site asked (an <img> or <script> GET).
        let site = |site: &str, mode: &str| {
            status(
                &r,
                "GET",
                &[("sec-fetch-site", site), ("sec-fetch-mode", mode)],
            )
        };
        assert_eq!(site("cross-site", "no-cors"), 403);
        assert_eq!(site("same-site", "cors"), 403);
        assert_eq!(site("cross-site", "navigate"), 200);
        assert_eq!(site("same-origin", "cors"), 200);
        assert_eq!(site("none", "navigate"), 200);
    }

    #[test]
    fn the_host_list_is_optional_and_exact() {
        let any = FrontRules::default();
        assert_eq!(
            status(&any, "GET", &[("host", "rebound.example:6632")]),
            200
        );
        let r = rules(&[("QUEEN_ALLOWED_HOSTS", "queen.internal:6632,127.0.0.1:6632")]);
        assert_eq!(status(&r, "GET", &[("host", "queen.internal:6632")]), 200);
        assert_eq!(status(&r, "GET", &[("host", "QUEEN.internal:6632")]), 200);
        assert_eq!(status(&r, "GET", &[("host", "rebound.example:6632")]), 421);
        assert_eq!(status(&r, "GET", &[]), 421);
        let wild = rules(&[("QUEEN_ALLOWED_HOSTS", "*.queen.example:443")]);
        assert_eq!(
            status(&wild, "GET", &[("host", "c1.queen.example:443")]),
            200
        );
        assert_eq!(status(&wild, "GET", &[("host", "queen.example:443")]), 421);
        assert_eq!(
            status(&wild, "GET", &[("host", "c1.queen.example:80")]),
            421
        );
        assert_eq!(
            status(&wild, "GET", &[("host", "evilqueen.example:443")]),
            421
        );
    }

    #[test]
    fn bad_settings_are_named_and_the_token_is_compared_whole() {
        let e = FrontRules::from_env(&|k: &str| {
            (k == "QUEEN_ALLOWED_ORIGINS").then(|| "evil.example".to_owned())
        })
        .expect_err("not an origin");
        assert_eq!(e.var, "QUEEN_ALLOWED_ORIGINS");
        let e = FrontRules::from_env(&|k: &str| {
            (k == "QUEEN_METRICS_TOKEN").then(|| "short".to_owned())
        })
        .expect_err("short");
        assert_eq!(e.var, "QUEEN_METRICS_TOKEN");
        let r = rules(&[("QUEEN_METRICS_TOKEN", "a-scrape-token-of-some-length")]);
        assert!(r.is_metrics_bearer(&headers(&[(
            "authorization",
            "Bearer a-scrape-token-of-some-length"
        )])));
        assert!(!r.is_metrics_bearer(&headers(&[("authorization", "Bearer a-scrape-token")])));
        assert!(!r.is_metrics_bearer(&headers(&[])));
        assert!(!format!("{r:?}").contains("a-scrape-token"));
    }
}
