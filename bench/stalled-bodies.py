#!/usr/bin/env python3
"""Stalled request bodies against one node on loopback: N connections that each declare 64 MiB,
send 63 MiB and stop. Prints the node's RSS before, while they stall, and 40 s later (past the
default 30 s body deadline).

    python3 bench/stalled-bodies.py PORT PID [N]

PORT is the node's client port, PID its process id (for /proc/PID/status). Loopback only;
every connection is closed when the script ends.
"""
import socket
import sys
import time

port, pid = int(sys.argv[1]), int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
declared, sent_each = 64 << 20, 63 << 20


def rss_mib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


print("rss before", rss_mib(), "MiB")
conns = []
chunk = b" " * 65536
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    s.sendall(f"POST /api/v1/push HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n".encode())
    sent = 0
    try:
        while sent < sent_each:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # refused at once (503 busy) and closed by the node
    conns.append((s, sent))
print("connections that sent their 63 MiB:", sum(1 for _, x in conns if x >= sent_each), "of", n)
peak = rss_mib()
print("rss with", n, "stalled:", peak, "MiB")
for _ in range(40):
    time.sleep(1)
    peak = max(peak, rss_mib())
print("rss 40 s later:", rss_mib(), "MiB; peak", peak, "MiB")
for s, _ in conns:
    s.close()
