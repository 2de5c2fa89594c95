#!/usr/bin/env python3
"""One tenant flooding new partitions through the embedded proxy, another pushing one item at a
time: prints the calm tenant's push latency (p50, p99, worst) while the flood runs, and the
flood's cost per new partition at the start and at the end. Issue 59 (H1): the plan's partition
cap used to recount the queue's partitions for each new partition, holding the node's state
while it counted.

    python3 bench/proxy-flood.py --bin target/release/queen [--partitions 25000] [--seconds 10]
        [--flooders 4] [--batch 200]

Starts one node on loopback (a temporary data directory, the proxy on its own port, shadow
mode as by default), two clusters on the dev plan with a key each, seeds the flooding tenant's
queue with --partitions partitions on the data port, then runs the flood (--flooders
connections, each pushing --batch items, each item a new partition) and the calm tenant's
one-item pushes for --seconds. Every phase
is bounded in time; the node is stopped by its pid at the end.
"""
import argparse
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

CP = "cp-token-for-the-proxy-flood-bench-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key(seed):
    return "qk_bench_" + seed * 43


class Client:
    """One keep-alive connection to a port."""

    def __init__(self, port, timeout=120):
        self.port, self.timeout = port, timeout
        self.conn = None

    def call(self, method, path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        h = {"content-type": "application/json"}
        h.update(headers or {})
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=h)
                r = self.conn.getresponse()
                text = r.read()
                return r.status, text
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise RuntimeError("unreachable")


def spread(queue, prefix, start, n):
    return {"items": [{"queue": queue, "partition": f"{prefix}{i}", "payload": i} for i in range(start, start + n)]}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, len(xs) * p // 100)] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--partitions", type=int, default=25000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--flooders", type=int, default=4, help="connections flooding at once")
    args = ap.parse_args()

    data = tempfile.mkdtemp(prefix="proxy-flood-")
    port, proxy_port = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "QUEEN_RAFT_DIR": data,
        "RUST_LOG": "warn",
        "QUEEN_RAFT_DISK_HIGH_PCT": "100",
        "QUEEN_PROXY_EMBEDDED": "true",
        "QUEEN_PROXY_PORT": str(proxy_port),
        "QUEEN_PROXY_CP_TOKEN": CP,
        "QUEEN_PROXY_INVAL_POLL_MS": "200",
        "QUEEN_TENANCY_HEADER": "true",
        "QUEEN_KV_TRUSTED_PROXY": "1",
    }
    log = open(os.path.join(data, "node.log"), "wb")
    node = subprocess.Popen([args.bin], env=env, stdout=log, stderr=log)
    try:
        run(args, port, proxy_port)
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
        shutil.rmtree(data, ignore_errors=True)


def until(limit, check):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            if check():
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def run(args, port, proxy_port):
    cp = Client(proxy_port)
    cph = {"x-queen-cp-token": CP}
    if not until(60, lambda: cp.call("GET", "/api/cp/clusters", headers=cph)[0] == 200):
        sys.exit("the node's control plane never answered")
    tenants = {}
    for slug, seed in (("flood", "F"), ("calm", "C")):
        s, text = cp.call("POST", "/api/cp/clusters", {"tenant_slug": slug, "slug": slug, "plan": "dev"}, cph)
        cid = json.loads(text)["id"]
        h = hashlib.sha256(key(seed).encode()).hexdigest()
        cp.call("POST", "/api/cp/keys", {"cluster_id": cid, "name": "all", "key_hash": h,
                                         "scopes": ["produce", "consume", "admin", "read"]}, cph)
        _, row = cp.call("GET", f"/api/cp/clusters/{slug}", headers=cph)
        tenants[slug] = json.loads(row)["broker_tenant_uuid"]
    auth = {s: {"authorization": f"Bearer {key(c)}", "host": f"{s}.queen.test"} for s, c in (("flood", "F"), ("calm", "C"))}
    px = Client(proxy_port)
    for s in ("flood", "calm"):
        if not until(10, lambda: px.call("POST", "/api/v1/push", {"items": [{"queue": "warm", "payload": 0}]}, auth[s])[0] == 200):
            sys.exit(f"the {s} key never pushed")
    data = Client(port)
    t = time.monotonic()
    for start in range(0, args.partitions, 1000):
        n = min(1000, args.partitions - start)
        s, text = data.call("POST", "/api/v1/push", spread("wide", "seed-", start, n), {"x-queen-tenant": tenants["flood"]})
        if s != 200:
            sys.exit(f"seeding: {s} {text[:200]!r}")
    print(f"seeded {args.partitions} partitions on the data port in {time.monotonic() - t:.1f} s")

    stop = threading.Event()
    flood = []  # (seconds, items)

    def flooding(k):
        c = Client(proxy_port)
        start = k * 1_000_000
        while not stop.is_set() and start < k * 1_000_000 + 1000 * args.batch:
            t = time.monotonic()
            try:
                s, text = c.call("POST", "/api/v1/push", spread("wide", "flood-", start, args.batch), auth["flood"])
            except OSError as e:
                print(f"flood push: {e}")
                return
            if s != 200:
                print(f"flood push: {s} {text[:200]!r}")
                return
            flood.append(time.monotonic() - t)
            start += args.batch

    threads = [threading.Thread(target=flooding, args=(k,)) for k in range(args.flooders)]
    for th in threads:
        th.start()
    calm, n = [], 0
    calm_client = Client(proxy_port)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end and n < 100_000:
        n += 1
        t = time.monotonic()
        try:
            s, _ = calm_client.call("POST", "/api/v1/push", {"items": [{"queue": "calm", "payload": n}]}, auth["calm"])
        except OSError as e:
            calm.append(time.monotonic() - t)
            print(f"calm push: {e} after {calm[-1]:.0f} s")
            break
        calm.append(time.monotonic() - t)
        if s != 200:
            print(f"calm push answered {s}")
    stop.set()
    for th in threads:
        th.join(600)
    ms = lambda x: f"{x * 1000:.1f} ms"
    print(f"calm tenant: {len(calm)} one-item pushes in {args.seconds:.0f} s: p50 {ms(pct(calm, 50))}, "
          f"p99 {ms(pct(calm, 99))}, worst {ms(max(calm))}")
    if flood:
        per = lambda x: f"{x / args.batch * 1e6:.0f} us"
        print(f"flooding tenant: {len(flood)} pushes of {args.batch} new partitions on {args.flooders} connections "
              f"({args.partitions} to {args.partitions + len(flood) * args.batch} partitions); "
              f"per new partition: first push {per(flood[0])}, last {per(flood[-1])}, worst {per(max(flood))}")
    else:
        print("flooding tenant: no push finished within the period")


if __name__ == "__main__":
    main()
