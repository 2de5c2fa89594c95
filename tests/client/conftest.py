"""Fixtures for the official-client suite: one real `queen` node per test session.

The node is the binary named by QUEEN_BIN (default: <repo>/target/debug/queen), started on a
free loopback port with its own Raft directory, polled on GET /health until it answers 200
(bounded), and stopped with SIGTERM by PID at the end (SIGKILL when it does not exit within
30 s). Its stdout/stderr go to a log file that is printed when a test fails.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import base64
import hashlib
import hmac
import json

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
HEALTH_LIMIT_S = 30.0
STOP_LIMIT_S = 30.0
# With QUEEN_SUITE_JWT_SECRET set, the node runs with broker JWT on (HS256 with that secret)
# and every client of the suite carries a read-write token as its `bearer_token`.
JWT_SECRET = os.environ.get("QUEEN_SUITE_JWT_SECRET") or None
# With QUEEN_SUITE_PROXY=1, the node runs the embedded proxy on its client port with a
# bootstrap cluster, and every client of the suite carries that cluster's API key
# (qk_...) as its `bearer_token`: the suite runs through the proxy, under the cluster's tenant.
PROXY = os.environ.get("QUEEN_SUITE_PROXY") == "1"


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def hs256_token(secret: str, claims: dict) -> str:
    """An HS256 JWT (RFC 7519), built with the standard library."""
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64url(json.dumps(claims).encode())
    sig = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64url(sig)}"


def _free_port() -> int:
    """A free port below the kernel's ephemeral range (32768-60999), which an outgoing
    connection can never take between our check and the node's bind."""
    start = random.randrange(20000)
    for n in range(20000):
        port = 12000 + (start + n) % 20000
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 12000 and 32000")


class Node:
    """A running queen process."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.workdir = Path(tempfile.mkdtemp(prefix="queen-client-suite-"))
        self.raft_dir = self.workdir / "raft"
        self.log_path = self.workdir / "queen.log"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.token: str | None = None
        if PROXY:
            self.token = "qk_suite_" + _b64url(os.urandom(32))
        elif JWT_SECRET:
            self.token = hs256_token(
                JWT_SECRET,
                {"sub": "client-suite", "role": "read-write", "exp": int(time.time()) + 3600},
            )

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PORT": str(self.port),
            "HOST": "127.0.0.1",
            "QUEEN_RAFT_DIR": str(self.raft_dir),
            "RUST_LOG": os.environ.get("QUEEN_RUST_LOG", "info"),
            # The test machine's disk is shared with builds: the gate (85% by default) would
            # answer 507 for reasons that have nothing to do with the client suite.
            "QUEEN_RAFT_DISK_HIGH_PCT": "100",
            # Analytics samples every half second, so the admin analytics calls see figures.
            "QUEEN_ANALYTICS_INTERVAL_MS": "500",
        }
        if JWT_SECRET and not PROXY:
            env.update({"JWT_ENABLED": "true", "JWT_ALGORITHM": "HS256", "JWT_SECRET": JWT_SECRET})
        if PROXY:
            env.update(
                {
                    "QUEEN_PROXY_EMBEDDED": "true",
                    "QUEEN_PROXY_DEFAULT_CLUSTER": "suite",
                    "QUEEN_PROXY_BOOTSTRAP_TENANT": "suite",
                    # The suite drives streams and traces too: a plan that includes them.
                    "QUEEN_PROXY_BOOTSTRAP_PLAN": "pro",
                    "QUEEN_PROXY_BOOTSTRAP_API_KEY": self.token,
                }
            )
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(self.binary)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        deadline = time.monotonic() + HEALTH_LIMIT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"queen exited early with status {code}:\n{self.log_text()}")
            try:
                r = httpx.get(f"{self.url}/health", timeout=2.0)
                if r.status_code == 200 and PROXY:
                    # The boot-time bootstrap is applied once the log has a leader: the key
                    # works from then on.
                    r = httpx.get(
                        f"{self.url}/api/v1/resources/queues", headers=self.headers(), timeout=2.0
                    )
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"queen did not answer 200 on /health within {HEALTH_LIMIT_S:.0f} s (last: {last}):\n"
            f"{self.log_text()}"
        )

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        code = proc.poll()
        if code is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                print(f"queen (pid {proc.pid}) ignored SIGTERM for {STOP_LIMIT_S:.0f} s; sending SIGKILL")
                os.kill(proc.pid, signal.SIGKILL)
                code = proc.wait(timeout=STOP_LIMIT_S)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def log_text(self, tail: int = 200) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-tail:])

    def raw(self, method: str, path: str, json: object = None) -> httpx.Response:
        """One plain HTTP request, for diagnostics in failure messages (not used to drive
        the broker: every test drives it through the official client)."""
        return httpx.request(
            method, f"{self.url}{path}", json=json, headers=self.headers(), timeout=10.0
        )

    def describe(self, method: str, path: str, json: object = None) -> str:
        try:
            r = self.raw(method, path, json)
            return f"{method} {path} -> HTTP {r.status_code} {r.text[:300]}"
        except httpx.HTTPError as e:
            return f"{method} {path} -> transport error {e!r}"


def _binary() -> Path:
    binary = Path(os.environ.get("QUEEN_BIN") or REPO / "target" / "debug" / "queen")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.exit(
            f"queen binary not found or not executable at {binary}; "
            "build it with `cargo build -p queen` or point QUEEN_BIN at it",
            returncode=2,
        )
    return binary


@pytest.fixture(scope="session")
def node():
    n = Node(_binary())
    n.start()
    yield n
    code = n.stop()
    if code not in (0, None):
        print(f"queen exited with status {code} after SIGTERM:\n{n.log_text()}")
    shutil.rmtree(n.workdir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        n = item.funcargs.get("node")
        if isinstance(n, Node):
            rep.sections.append(("queen node log (last 200 lines)", n.log_text()))
