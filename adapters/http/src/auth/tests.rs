//! Unit tests of the JWT settings and checks (the black-box tests in `tests/blackbox/jwt.rs`
//! drive real nodes with real tokens).

use super::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k: &str| pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone())
}

fn auth(pairs: &[(&str, &str)]) -> Result<Option<Auth>, AuthConfigError> {
    Auth::from_env(&env(pairs))
}

const SECRET: &str = "a-test-secret-of-at-least-thirty-two-bytes";

fn hs(claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("a key"),
    )
    .expect("a token")
}

fn header(token: &str) -> hyper::header::HeaderValue {
    hyper::header::HeaderValue::from_str(&format!("Bearer {token}")).expect("a header")
}

#[test]
fn jwt_is_off_unless_enabled_and_on_without_keys_stops_the_boot() {
    assert!(auth(&[]).expect("ok").is_none());
    assert!(auth(&[("JWT_ENABLED", "false")]).expect("ok").is_none());
    let e = auth(&[("JWT_ENABLED", "true")]).expect_err("no secret");
    assert!(e.to_string().contains("JWT_SECRET"), "{e}");
    let e = auth(&[("JWT_ENABLED", "true"), ("JWT_ALGORITHM", "RS256")]).expect_err("no key");
    assert!(
        e.to_string().contains("JWT_PUBLIC_KEY or JWT_JWKS_URL"),
        "{e}"
    );
    let e = auth(&[("JWT_ENABLED", "true"), ("JWT_ALGORITHM", "none")]).expect_err("bad alg");
    assert_eq!(e.var, "JWT_ALGORITHM");
    let e = auth(&[
        ("JWT_ENABLED", "true"),
        ("JWT_ALGORITHM", "RS256"),
        ("JWT_PUBLIC_KEY", "not a pem"),
    ])
    .expect_err("bad pem");
    assert_eq!(e.var, "JWT_PUBLIC_KEY");
    let e = auth(&[("JWT_ENABLED", "maybe")]).expect_err("bad flag");
    assert_eq!(e.var, "JWT_ENABLED");
    // The secret never appears in the settings' debug form.
    let a = auth(&[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)])
        .expect("ok")
        .expect("on");
    assert!(!format!("{a:?}").contains(SECRET));
}

#[test]
fn skip_paths_match_their_path_and_under_a_trailing_slash_only() {
    let a = auth(&[
        ("JWT_ENABLED", "true"),
        ("JWT_SECRET", SECRET),
        ("JWT_SKIP_PATHS", "/health,/,/public/"),
    ])
    .expect("ok")
    .expect("on");
    assert!(a.skips(&["health"]));
    assert!(a.skips(&[]));
    assert!(a.skips(&["public", "x"]));
    assert!(a.skips(&["public"]));
    assert!(!a.skips(&["health", "x"]));
    assert!(!a.skips(&["api", "v1", "push"]));
    let d = auth(&[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)])
        .expect("ok")
        .expect("on");
    assert!(d.skips(&["health"]) && d.skips(&[]));
    assert!(!d.skips(&["status"]));
    // The metrics name every tenant's queues: they need a credential by default.
    assert!(!d.skips(&["metrics", "prometheus"]) && !d.skips(&["metrics"]));
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

#[test]
fn tokens_are_checked_for_signature_time_issuer_audience_and_role() {
    let a = auth(&[
        ("JWT_ENABLED", "true"),
        ("JWT_SECRET", SECRET),
        ("JWT_ISSUER", "https://idp.example"),
        ("JWT_AUDIENCE", "queen"),
    ])
    .expect("ok")
    .expect("on");
    let now = jsonwebtoken::get_current_timestamp();
    let good = serde_json::json!({"sub": "u1", "role": "read-write", "iss": "https://idp.example", "aud": "queen", "exp": now + 60});
    let reason = |claims: &Value, need: Need| {
        block_on(a.check(Some(&header(&hs(claims))), need))
            .err()
            .map(|e| (e.status, e.reason.unwrap_or("")))
    };
    let p = block_on(a.check(Some(&header(&hs(&good))), Need::Consume)).expect("passes");
    assert_eq!(p.sub.as_deref(), Some("u1"));
    assert_eq!(reason(&good, Need::Admin), Some((403, "role_too_low")));
    let mut expired = good.clone();
    expired["exp"] = (now - 3600).into();
    assert_eq!(reason(&expired, Need::Read), Some((401, "expired")));
    let mut within_skew = good.clone();
    within_skew["exp"] = (now - 5).into();
    assert_eq!(reason(&within_skew, Need::Read), None);
    let mut iss = good.clone();
    iss["iss"] = "https://other".into();
    assert_eq!(reason(&iss, Need::Read), Some((401, "wrong_issuer")));
    let mut aud = good.clone();
    aud["aud"] = "other".into();
    assert_eq!(reason(&aud, Need::Read), Some((401, "wrong_audience")));
    for (claim, want) in [("iss", "wrong_issuer"), ("aud", "wrong_audience")] {
        let mut missing = good.clone();
        missing.as_object_mut().expect("object").remove(claim);
        assert_eq!(
            reason(&missing, Need::Read),
            Some((401, want)),
            "no {claim}"
        );
        let mut null = good.clone();
        null[claim] = Value::Null;
        assert_eq!(
            reason(&null, Need::Read),
            Some((401, want)),
            "{claim}: null"
        );
    }
    let mut no_exp = good.clone();
    no_exp.as_object_mut().expect("object").remove("exp");
    assert_eq!(reason(&no_exp, Need::Read), None, "exp is optional");
    let wrong_key = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &good,
        &jsonwebtoken::EncodingKey::from_secret(b"another-secret-of-at-least-32-bytes!!")
            .expect("a key"),
    )
    .expect("a token");
    let e = block_on(a.check(Some(&header(&wrong_key)), Need::Read)).expect_err("refused");
    assert_eq!((e.status, e.reason), (401, Some("bad_signature")));
    let e = block_on(a.check(None, Need::Read)).expect_err("refused");
    assert_eq!((e.status, e.reason), (401, Some("missing_token")));
    let e = block_on(a.check(Some(&header("not.a.jwt")), Need::Read)).expect_err("refused");
    assert_eq!((e.status, e.reason), (401, Some("malformed")));
    assert!(block_on(a.check(None, Need::Public)).is_ok());
}

#[test]
fn roles_come_from_the_role_claim_and_the_roles_array_even_nested() {
    let a = auth(&[
        ("JWT_ENABLED", "true"),
        ("JWT_SECRET", SECRET),
        ("JWT_ROLES_ARRAY_CLAIM", "realm_access.roles"),
        ("JWT_ROLE_ADMIN", "queen-admin"),
    ])
    .expect("ok")
    .expect("on");
    let p = a.principal(&serde_json::json!({"realm_access": {"roles": ["x", "queen-admin"]}}));
    assert!(p.grants.allow(Need::Admin));
    let p = a.principal(&serde_json::json!({"role": "write-only", "sub": "pub-1"}));
    assert!(p.grants.allow(Need::Write) && !p.grants.allow(Need::Read));
    assert_eq!(p.sub.as_deref(), Some("pub-1"));
    let p = a.principal(&serde_json::json!({"role": "admin"}));
    assert!(
        p.grants.is_empty(),
        "renamed: admin is no longer a role name"
    );
}

#[test]
fn an_hmac_node_refuses_tokens_of_another_family() {
    let a = auth(&[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)])
        .expect("ok")
        .expect("on");
    // A token whose header claims RS256 (the classic confusion: an RSA public key used as an
    // HMAC secret) is refused before any signature is computed.
    let forged = format!(
        "{}.{}.sig",
        base64_url(br#"{"alg":"RS256","typ":"JWT"}"#),
        base64_url(br#"{"role":"admin"}"#)
    );
    let e = block_on(a.check(Some(&header(&forged)), Need::Read)).expect_err("refused");
    assert_eq!((e.status, e.reason), (401, Some("algorithm_not_allowed")));
    let none = format!(
        "{}.{}.",
        base64_url(br#"{"alg":"none","typ":"JWT"}"#),
        base64_url(br#"{"role":"admin"}"#)
    );
    let e = block_on(a.check(Some(&header(&none)), Need::Read)).expect_err("refused");
    assert_eq!(e.status, 401);
}

fn base64_url(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

#[test]
fn a_payload_with_a_repeated_key_is_refused_as_bad_claims() {
    let a = auth(&[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)])
        .expect("ok")
        .expect("on");
    let sign = |payload: &str| {
        use jsonwebtoken::crypto::sign;
        let head = base64_url(br#"{"alg":"HS256","typ":"JWT"}"#);
        let msg = format!("{head}.{}", base64_url(payload.as_bytes()));
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("a key");
        format!(
            "{msg}.{}",
            sign(msg.as_bytes(), &key, Algorithm::HS256).expect("signed")
        )
    };
    for payload in [
        r#"{"role":"read-only","role":"admin"}"#,
        r#"{"role":"admin","x":{"y":1,"y":2}}"#,
    ] {
        let e = block_on(a.check(Some(&header(&sign(payload))), Need::Read)).expect_err(payload);
        assert_eq!((e.status, e.reason), (401, Some("bad_claims")), "{payload}");
    }
    let p = block_on(a.check(Some(&header(&sign(r#"{"role":"admin"}"#))), Need::Admin));
    assert!(p.is_ok(), "the same token without the repeat passes");
}
