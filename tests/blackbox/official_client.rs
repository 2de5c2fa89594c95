//! Runs the official Python client suite (tests/client: queen-mq 2.6.0 from PyPI, unchanged, in
//! its own venv) against this build's binary, so `cargo test --workspace` runs every test.
//! Needs python3 with venv; the first run installs the pinned requirements from PyPI.

use std::path::Path;
use std::process::Command;

#[test]
fn the_official_python_client_drives_a_real_node() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/client/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("QUEEN_BIN", env!("CARGO_BIN_EXE_queen"))
        .output()
        .expect("bash runs tests/client/run.sh");
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
}
