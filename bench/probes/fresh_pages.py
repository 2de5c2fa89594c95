#!/usr/bin/env python3
"""What this machine charges for fresh page-cache pages (docs/performance.md, 2026-12-05 night).

Writes SIZE MiB into a new file in DIR twice per round: once letting the page cache keep every
page, once dropping the pages 256 MiB behind the writer as it goes (posix_fadvise DONTNEED, after
an fdatasync), so that the kernel can hand the same pages out again. Prints the system time of
each. On a virtual machine whose balloon reports free memory to the host, the first costs several
times the second; elsewhere they are close.

    python3 bench/probes/fresh_pages.py [DIR] [SIZE_MIB] [ROUNDS]
"""
import os
import sys
import tempfile
import time

CHUNK = 1 << 20
WINDOW = 256 << 20


def write(path, total, drop):
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    buf = os.urandom(CHUNK)
    before = os.times()
    written = dropped = 0
    while written < total:
        os.write(fd, buf)
        written += CHUNK
        if written % (64 << 20) == 0:
            os.fdatasync(fd)
            if drop and written - dropped > WINDOW:
                os.posix_fadvise(fd, dropped, written - WINDOW - dropped, os.POSIX_FADV_DONTNEED)
                dropped = written - WINDOW
    os.fdatasync(fd)
    after = os.times()
    os.close(fd)
    os.unlink(path)
    return after.system - before.system


def main():
    where = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    size = int(sys.argv[2]) << 20 if len(sys.argv) > 2 else 4000 << 20
    rounds = min(int(sys.argv[3]) if len(sys.argv) > 3 else 2, 10)
    path = os.path.join(where, f"fresh-pages-{os.getpid()}")
    for r in range(rounds):
        for drop in (False, True):
            # Let the pages the last write freed go back to the host, if it takes them.
            time.sleep(15)
            s = write(path, size, drop)
            kept = "dropped behind the writer" if drop else "all kept in the cache"
            print(f"round {r + 1}: {size >> 20} MiB, pages {kept}: {s:.2f} s of system time")


if __name__ == "__main__":
    main()
