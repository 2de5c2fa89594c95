#!/usr/bin/env python3
"""How long small appends with fdatasync (a raft log) wait while another file of SIZE MiB is
written beside them (a dedup run being merged), with that file written in one go and fsynced at
its end, or paced: each 8 MiB started on its way to disk as written and the 8 MiB before it
waited for (sync_file_range), as adapters/store/src/writeback.rs does.

    python3 bench/probes/fsync_beside_write.py [DIR] [SIZE_MIB] [ROUNDS]
"""
import ctypes
import os
import sys
import tempfile
import threading
import time

libc = ctypes.CDLL("libc.so.6", use_errno=True)
WAIT_BEFORE, WRITE, WAIT_AFTER = 1, 2, 4
PIECE = 8 << 20


def sync_range(fd, start, length, flags):
    libc.sync_file_range(fd, ctypes.c_longlong(start), ctypes.c_longlong(length), flags)


def big_write(path, size, paced):
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    buf = os.urandom(1 << 20)
    written = started = 0
    while written < size:
        os.write(fd, buf)
        written += len(buf)
        if paced and written - started >= PIECE:
            if started >= PIECE:
                sync_range(fd, started - PIECE, PIECE, WAIT_BEFORE | WRITE | WAIT_AFTER)
            sync_range(fd, started, written - started, WRITE)
            started = written
    os.fdatasync(fd)
    os.close(fd)
    os.unlink(path)


def run(where, size, paced):
    log = os.path.join(where, f"log-{os.getpid()}")
    fd = os.open(log, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    record = os.urandom(36000)
    waits = []
    done = threading.Event()
    writer = threading.Thread(
        target=lambda: (big_write(os.path.join(where, f"big-{os.getpid()}"), size, paced), done.set())
    )
    writer.start()
    deadline = time.monotonic() + 120
    while not done.is_set() and time.monotonic() < deadline:
        t = time.perf_counter()
        os.write(fd, record)
        os.fdatasync(fd)
        waits.append(time.perf_counter() - t)
    writer.join()
    os.close(fd)
    os.unlink(log)
    waits.sort()
    n = len(waits)
    how = "paced" if paced else "in one go"
    print(
        f"{size >> 20} MiB written {how}: {n} appends, p50 {waits[n // 2] * 1e3:.2f} ms, "
        f"p99 {waits[int(n * 0.99)] * 1e3:.2f} ms, worst {waits[-1] * 1e3:.1f} ms"
    )


def main():
    where = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    size = int(sys.argv[2]) << 20 if len(sys.argv) > 2 else 256 << 20
    rounds = min(int(sys.argv[3]) if len(sys.argv) > 3 else 2, 10)
    for _ in range(rounds):
        for paced in (False, True):
            run(where, size, paced)


if __name__ == "__main__":
    main()
