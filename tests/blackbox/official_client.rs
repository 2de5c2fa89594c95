//! Runs the official Python client suite (tests/client: queen-mq 2.6.0 from PyPI, unchanged, in
//! its own venv) against this build's binary, so `cargo test --workspace` runs every test.
//! Needs python3 with venv; the first run installs the pinned requirements from PyPI.

use std::path::Path;
use std::process::Command;

#[test]
fn the_official_python_client_drives_a_real_node() {
    let stdout = suite(None);
    assert!(
        stdout.contains("1 skipped"),
        "only the JWT test is skipped without JWT:\n{stdout}"
    );
}

/// The same suite against a node with broker JWT on (HS256): every client carries a
/// read-write token as its `bearer_token`, and a request without one is refused.
#[test]
fn the_official_python_client_passes_with_a_bearer_token() {
    let stdout = suite(Some("client-suite-jwt-secret-of-32-bytes-or-more"));
    assert!(
        !stdout.contains("skipped"),
        "the JWT test must run in this run:\n{stdout}"
    );
}

/// The same suite through the embedded proxy on the node's client port: every client carries
/// the bootstrap cluster's API key (`qk_...`) as its `bearer_token`, so the whole suite runs
/// under that cluster's tenant; a request without the key is refused, and the node-wide
/// metrics are the operator's (404 `route_blocked`).
#[test]
fn the_official_python_client_passes_through_the_embedded_proxy() {
    let stdout = suite_with(None, true);
    assert!(
        !stdout.contains("skipped"),
        "the credential test must run in this run:\n{stdout}"
    );
}

/// The runs share tests/client/.venv, which the first run on a fresh machine creates: they
/// take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn suite(jwt_secret: Option<&str>) -> String {
    suite_with(jwt_secret, false)
}

fn suite_with(jwt_secret: Option<&str>, proxy: bool) -> String {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/client/run.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .env("QUEEN_BIN", env!("CARGO_BIN_EXE_queen"))
        .env_remove("QUEEN_SUITE_JWT_SECRET")
        .env_remove("QUEEN_SUITE_PROXY");
    if proxy {
        cmd.env("QUEEN_SUITE_PROXY", "1");
    }
    if let Some(s) = jwt_secret {
        cmd.env("QUEEN_SUITE_JWT_SECRET", s);
    }
    let out = cmd.output().expect("bash runs tests/client/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "the official client suite failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("passed"), "pytest ran no test:\n{stdout}");
    stdout.into_owned()
}
