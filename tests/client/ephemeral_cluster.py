"""The official client's ephemeral API (queen-mq 2.6.0) against three nodes of one cluster:
push through node 1, pop through node 2, ack through node 3, each client given one node.

Usage: python ephemeral_cluster.py URL1 URL2 URL3 (run by tests/blackbox/ephemeral.rs through
run.sh --script). Prints "ephemeral cluster ok" when every check held; exits non-zero
otherwise.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

from queen import Queen


async def main(urls: list[str]) -> None:
    c1, c2, c3 = (Queen(u) for u in urls)
    try:
        q = f"eph-cluster-{uuid.uuid4().hex[:8]}"
        await c1.ephemeral.configure(q, lease_seconds=30)
        parts = [f"p{i}" for i in range(9)]
        for i, p in enumerate(parts):
            r = await c1.ephemeral.push(q, [{"i": i, "n": 0}, {"i": i, "n": 1}], partition=p)
            assert r == {"pushed": 2}, r

        popped = []
        for p in parts:
            got = await c2.ephemeral.pop(q, partition=p, batch=10, group="workers")
            assert [m["payload"]["n"] for m in got["messages"]] == [0, 1], (p, got)
            popped.extend(got["messages"])
        # Fan-out through another node, without naming partitions: every member's share
        # (still held: the workers' leases keep it).
        seen = []
        for _ in range(20):
            got = await c3.ephemeral.pop(q, batch=50, group="audit", commit_on_delivery=True)
            seen.extend(got["messages"])
            if len(seen) >= 18:
                break
        assert len(seen) == 18, seen

        acked = await c3.ephemeral.ack(q, popped, group="workers")
        outcomes = [r["outcome"] for r in acked["results"]]
        assert outcomes == ["acked"] * len(popped), acked

        depth = await c2.ephemeral.depth(q)
        assert depth["tier"] == "declared", depth
        listed = await c3.ephemeral.queues()
        assert q in [x["queue"] for x in listed["queues"]], listed
        assert (await c1.ephemeral.delete(q))["deleted"] is True
        print("ephemeral cluster ok")
    finally:
        for c in (c1, c2, c3):
            await c.close()


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1:4]), 120))
