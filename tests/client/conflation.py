"""Conflation (contract 2.0.8) through the official client (queen-mq 2.6.0) against one node:
a conflating group's pop() and consume() get each partition's newest message only, and never
the ones behind it; another group gets every message; a group registered the other way gets a
conflict (a warning, not an error) and keeps its policy; the client's own checks
(ConflationUnsupportedError, which an older broker raises) never fire; the broker's 400s
(no group, commit_on_delivery()) are raised by pop(); depth reports `effectivePending`.

Usage: python conflation.py URL (run by tests/blackbox/conflation.rs through run.sh --script).
Prints "conflation ok" when every check held; exits non-zero otherwise.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any, Dict, List

from queen import ConflationUnsupportedError, Queen

PARTS = ["a", "b", "c"]
PER_PART = 5


def txn(m: Dict[str, Any]) -> str:
    return m["transactionId"]


async def push_round(c: Queen, q: str, tag: str) -> None:
    """PER_PART messages into each partition, transactionIds `<tag>-<partition>-<n>`."""
    for p in PARTS:
        items = [{"data": {"p": p, "n": n}, "transactionId": f"{tag}-{p}-{n}"} for n in range(PER_PART)]
        res = await c.queue(q).partition(p).push(items)
        assert [r.get("status") for r in res] == ["queued"] * PER_PART, res


def newest(tag: str) -> List[str]:
    return sorted(f"{tag}-{p}-{PER_PART - 1}" for p in PARTS)


async def drain(c: Queen, q: str, group: str, *, conflation: bool, rounds: int = 12) -> List[Dict[str, Any]]:
    """pop() until an empty answer (bounded), acking every message in `group`."""
    got: List[Dict[str, Any]] = []
    for _ in range(rounds):
        b = c.queue(q).group(group).batch(10).partitions(len(PARTS)).wait(False)
        if conflation:
            b = b.conflation()
        msgs = await b.pop()
        if not msgs:
            return got
        got.extend(msgs)
        res = await c.ack(msgs, True, {"group": group})
        assert res.get("success") is not False, res
    raise AssertionError(f"{group} still had messages after {rounds} pops: {[txn(m) for m in got]}")


async def main(url: str) -> None:
    c = Queen(url)
    try:
        q = f"conflation-{uuid.uuid4().hex[:8]}"
        await c.queue(q).config({"leaseTime": 30}).create()
        await push_round(c, q, "r1")

        # pop(): the newest of each partition, nothing behind it, and an empty answer passes
        # the client's check (200 with the echo, not 204).
        got = await drain(c, q, "latest", conflation=True)
        assert sorted(txn(m) for m in got) == newest("r1"), [txn(m) for m in got]
        waited = await c.queue(q).group("latest").conflation().wait(True).timeout_millis(500).pop()
        assert waited == [], waited

        # A second round through consume(): again only the newest of each partition.
        await push_round(c, q, "r2")
        seen: List[Dict[str, Any]] = []

        async def handler(msg_or_msgs):
            seen.extend(msg_or_msgs if isinstance(msg_or_msgs, list) else [msg_or_msgs])

        consumer = (
            c.queue(q).group("latest").conflation().batch(10).partitions(len(PARTS))
            .limit(len(PARTS)).idle_millis(3000).timeout_millis(1000).consume(handler)
        )
        await asyncio.wait_for(consumer, 60)
        assert sorted(txn(m) for m in seen) == newest("r2"), [txn(m) for m in seen]
        assert await drain(c, q, "latest", conflation=True) == []

        # Another group of the queue gets every message, in order per partition.
        every = await drain(c, q, "every", conflation=False)
        for p in PARTS:
            mine = [txn(m) for m in every if m["partition"] == p]
            assert mine == [f"{r}-{p}-{n}" for r in ("r1", "r2") for n in range(PER_PART)], mine

        # A group registered without conflation keeps its policy: a conflating pop is answered
        # with a conflict (the client warns once) and delivers every message.
        await push_round(c, q, "r3")
        plain_first = await c.queue(q).group("plain").partition("a").batch(1).wait(False).pop()
        await c.ack(plain_first, True, {"group": "plain"})
        rest = await drain(c, q, "plain", conflation=True)
        assert len(plain_first) + len(rest) == 3 * len(PARTS) * PER_PART, len(rest)

        # Depth: the conflating group owes one delivery per partition with something pending.
        await push_round(c, q, "r4")
        depth = await c.admin.get_queue_depth(q, group="latest")
        assert depth["conflation"] is True, depth
        assert depth["pending"] == 2 * len(PARTS) * PER_PART, depth  # rounds r3 and r4
        assert depth["effectivePending"] == depth["partitionsPending"] == len(PARTS), depth
        plain = await c.admin.get_queue_depth(q, group="every")
        assert plain["conflation"] is False and plain["effectivePending"] == plain["pending"], plain

        # The broker's refusals of a conflating pop are raised, not read as "no messages".
        for builder, word in [
            (c.queue(q).conflation().wait(False), "consumerGroup"),
            (c.queue(q).group("latest").conflation().commit_on_delivery().wait(False), "autoAck"),
        ]:
            try:
                await builder.pop()
            except ConflationUnsupportedError:
                raise
            except Exception as e:  # the client raises the HTTP 400 as it came
                assert getattr(getattr(e, "response", None), "status_code", None) == 400, e
                assert word in (e.response.text or ""), e.response.text
            else:
                raise AssertionError(f"a conflating pop without {word} was not refused")
        print("conflation ok")
    finally:
        await c.close()


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1]), 180))
