#!/usr/bin/env python3
"""A push's latency while readers hammer the status routes of a queue with many partitions
(issue 59, M1; docs/performance.md, "Reads beside writes with 100,000 partitions").

Starts one node from BINARY on loopback in a fresh directory, makes queue `wide` with PARTITIONS
partitions (one message each, batched pushes of 1000) and a consumer group on it, then for
SECONDS runs READERS threads that GET the heaviest routes in turn while the main thread pushes
one item at a time to queue `quiet`, and prints the push latencies (median, p99, worst), the
reads done and the answer sizes. Stops the node it started.

    python3 bench/probes/reads_beside_writes.py BINARY [PARTITIONS] [SECONDS] [READERS]
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROUTES = [
    "/api/v1/consumer-groups/lagging?minLagSeconds=0",
    "/api/v1/resources/queues/wide",
    "/api/v1/resources/overview",
    "/api/v1/consumer-groups",
    "/api/v1/messages?queue=wide&status=pending",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, timeout=300):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def main():
    binary = sys.argv[1]
    partitions = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    seconds = min(float(sys.argv[3]) if len(sys.argv) > 3 else 20, 600)
    readers = min(int(sys.argv[4]) if len(sys.argv) > 4 else 4, 32)
    work = tempfile.mkdtemp(prefix="reads-beside-writes-")
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "PORT": str(port), "HOST": "127.0.0.1",
           "QUEEN_RAFT_DIR": os.path.join(work, "n1"), "RUST_LOG": "warn",
           "QUEEN_RAFT_DISK_HIGH_PCT": "100"}
    log = open(os.path.join(work, "node.log"), "w")
    node = subprocess.Popen([binary], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if call(base, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        started = time.time()
        for chunk in range(0, partitions, 1000):
            items = [{"queue": "wide", "partition": f"p{k:06d}", "transactionId": f"t{k}",
                      "payload": k} for k in range(chunk, min(chunk + 1000, partitions))]
            call(base, "POST", "/api/v1/push", {"items": items})
        call(base, "GET", "/api/v1/pop/queue/wide?batch=1&wait=false&consumerGroup=g1")
        print(f"{partitions} partitions made in {time.time() - started:.1f} s")
        for route in ROUTES:
            t = time.time()
            _, body = call(base, "GET", route)
            print(f"  {route}: {len(body)} bytes in {(time.time() - t) * 1000:.0f} ms")
        stop = threading.Event()
        reads = [0] * readers

        def reader(i):
            while not stop.is_set():
                call(base, "GET", ROUTES[(i + reads[i]) % len(ROUTES)])
                reads[i] += 1

        threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(readers)]
        for t in threads:
            t.start()
        took = []
        t0 = time.time()
        while time.time() - t0 < seconds:
            t = time.time()
            call(base, "POST", "/api/v1/push",
                 {"items": [{"queue": "quiet", "transactionId": f"q{len(took)}", "payload": 1}]})
            took.append(time.time() - t)
        stop.set()
        for t in threads:
            t.join(timeout=300)
        took.sort()
        ms = lambda x: f"{x * 1000:.1f} ms"
        print(f"{len(took)} pushes beside {readers} readers for {seconds:.0f} s: median "
              f"{ms(took[len(took) // 2])}, p99 {ms(took[len(took) * 99 // 100])}, worst "
              f"{ms(took[-1])}; {sum(reads)} reads")
    finally:
        node.terminate()
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
