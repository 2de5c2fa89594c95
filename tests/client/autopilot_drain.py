"""The official client's default consumer loop (queen-mq 2.6.0: autopilot on, nothing tuned)
draining a queue: consume() in queue mode with auto-ack, stopped by its own limit (the number
of messages the queue holds) and an idle timeout, bounded by an outer deadline; then one pop
to see that nothing is left.

Usage: python autopilot_drain.py URL QUEUE COUNT (run by tests/blackbox/autopilot.rs through
run.sh --script). Prints one JSON line: messages delivered, distinct transaction ids, handler
calls, seconds, and what a last pop found.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from queen import Queen


async def main(url: str, queue: str, count: int) -> None:
    client = Queen(url)
    try:
        seen: list[str] = []
        calls = 0

        async def handler(msg_or_msgs):
            nonlocal calls
            calls += 1
            batch = msg_or_msgs if isinstance(msg_or_msgs, list) else [msg_or_msgs]
            seen.extend(m["transactionId"] for m in batch)

        started = time.monotonic()
        await asyncio.wait_for(
            client.queue(queue).limit(count).idle_millis(10_000).consume(handler), 180
        )
        seconds = time.monotonic() - started
        left = await client.queue(queue).wait(False).pop()
        print(
            json.dumps(
                {
                    "delivered": len(seen),
                    "distinct": len(set(seen)),
                    "calls": calls,
                    "seconds": round(seconds, 2),
                    "left": len(left),
                }
            )
        )
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
