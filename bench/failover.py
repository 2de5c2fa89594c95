#!/usr/bin/env python3
"""kill -9 of a serving leader: the time to the first acknowledged write through a surviving
node (and, when a poll sees it first, to a node answering "role": "leader").

    python3 bench/failover.py target/release/queen 5
    python3 bench/failover.py target/release/queen 5 QUEEN_RAFT_ELECTION_MIN_MS=300 QUEEN_RAFT_ELECTION_MAX_MS=600

Each trial starts three nodes on free loopback ports in a temporary directory, waits for a
leader, pushes a few messages, kills the leader with SIGKILL, then alternates pushes between the
two survivors (each bounded to 0.5 s) until one is acknowledged, at most 15 s; every process it
started is killed by PID at the end of the trial. Prints min / median / max over the trials."""
import json, os, shutil, signal, socket, subprocess, sys, tempfile, time, urllib.error, urllib.request

BIN, TRIALS = sys.argv[1], int(sys.argv[2])
EXTRA = dict(a.split("=", 1) for a in sys.argv[3:])

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def req(url, body=None, timeout=1.0):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:
        return 0, str(e).encode()

results = []
for trial in range(TRIALS):
    d = tempfile.mkdtemp(prefix="queen-failover-")
    http = [port() for _ in range(3)]; raft = [port() for _ in range(3)]
    peers = ",".join(f"{i+1}=127.0.0.1:{raft[i]}/127.0.0.1:{http[i]}" for i in range(3))
    procs = []
    for i in range(3):
        env = {"PATH": os.environ["PATH"], "PORT": str(http[i]), "HOST": "127.0.0.1",
               "QUEEN_RAFT_DIR": f"{d}/n{i}", "QUEEN_RAFT_NODE_ID": str(i + 1),
               "QUEEN_RAFT_PEERS": peers, "QUEEN_RAFT_TOKEN": "t", "QUEEN_RAFT_DISK_HIGH_PCT": "100",
               "RUST_LOG": "warn"}
        env.update(EXTRA)
        procs.append(subprocess.Popen([BIN], env=env, stdout=open(f"{d}/n{i}.log", "w"), stderr=subprocess.STDOUT))
    leader = None
    until = time.time() + 30
    while time.time() < until and leader is None:
        for i in range(3):
            s, b = req(f"http://127.0.0.1:{http[i]}/health", timeout=0.5)
            if s == 200 and json.loads(b)["raft"]["role"] == "leader":
                leader = i
        time.sleep(0.05)
    assert leader is not None, "no leader"
    # Warm: a few writes.
    for k in range(20):
        req(f"http://127.0.0.1:{http[leader]}/api/v1/push", {"items": [{"queue": "f", "payload": k}]})
    time.sleep(1.0)
    survivors = [i for i in range(3) if i != leader]
    t0 = time.monotonic()
    procs[leader].send_signal(signal.SIGKILL)
    t_leader = t_write = None
    n = 0
    while time.monotonic() - t0 < 15 and t_write is None:
        via = survivors[n % 2]; n += 1
        if t_leader is None:
            for i in survivors:
                s, b = req(f"http://127.0.0.1:{http[i]}/health", timeout=0.2)
                if s == 200 and json.loads(b)["raft"]["role"] == "leader":
                    t_leader = time.monotonic() - t0
        s, _ = req(f"http://127.0.0.1:{http[via]}/api/v1/push", {"items": [{"queue": "f", "payload": n}]}, timeout=0.5)
        if s == 200:
            t_write = time.monotonic() - t0
        else:
            time.sleep(0.01)
    for p in procs:
        try: p.send_signal(signal.SIGKILL)
        except Exception: pass
        p.wait()
    shutil.rmtree(d, ignore_errors=True)
    results.append((t_leader, t_write))
    print(f"trial {trial+1}: new leader {t_leader and round(t_leader,3)} s, first write {t_write and round(t_write,3)} s", flush=True)
w = sorted(r[1] for r in results if r[1] is not None)
print(f"first write: min {w[0]:.3f} median {w[len(w)//2]:.3f} max {w[-1]:.3f} s over {len(w)}")
