#!/usr/bin/env python3
"""Time a small write + fdatasync appended to a new file against the same in place in a file
that already holds its blocks: what reusing the raft log's purged files would buy (tried on
2026-12-03 and reverted, see docs/performance.md).

    python3 bench/fsync_in_place.py [DIR]    # DIR on the disk the data directory lives on

Prints, per run, the mean wall time and CPU time of one 16 KiB pwrite + fdatasync, 1500 of
each, alternating appended and in place three times.
"""
import os
import sys
import time


def run(path, mode, n=1500, size=16384):
    if mode == "appended" and os.path.exists(path):
        os.remove(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    buf = os.urandom(size)
    t0, c0 = time.time(), os.times()
    for i in range(n):
        os.pwrite(fd, buf, i * size)
        os.fdatasync(fd)
    t1, c1 = time.time(), os.times()
    os.close(fd)
    cpu = (c1.system - c0.system) + (c1.user - c0.user)
    return (t1 - t0) / n * 1e6, cpu / n * 1e6


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    path = os.path.join(d, "fsync_in_place.tmp")
    try:
        for _ in range(3):
            for mode in ("appended", "in place"):
                wall, cpu = run(path, mode)
                print(f"{mode:9s} {wall:8.1f} us per write + fdatasync, {cpu:6.1f} us CPU")
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
