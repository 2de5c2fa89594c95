"""The official Python client, queen-mq 2.6.0 from PyPI (installed unchanged), against a real
queen node.

Every test drives the broker through the client's own API and asserts on the real effect
(a pop afterwards, a second client call), not only on the answer of the call under test.
Plain HTTP (node.raw / node.describe) is used only to double-check "nothing to pop" (the
client's pop() turns every error into [], which would make an emptiness check vacuous) and to
put the broker's own answer into failure messages.

Time discipline: each test body runs under asyncio.wait_for(TEST_LIMIT_S); every pop has a
bounded long-poll timeout; every consume() has a limit, an idle timeout and its own
wait_for.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any, Awaitable, Callable, Dict, List, Optional
from urllib.parse import urlencode

import httpx
import pytest

from queen import Queen

TEST_LIMIT_S = 120.0
CLOSE_LIMIT_S = 40.0
# leaseTime (s) for queues whose "nothing left" check must not be explained by a lease still
# being held: the check waits past it.
SHORT_LEASE_S = 2
# The client's opt-in binary bodies (API.md 4.6): pushes as QPB1 with client-built zstd frames,
# transactions as QTB1, pops answered as QPF1.
BINARY = {"binary_push": True, "push_compression": True, "framed_pop": True}
# The producerSub pops answer: the suite token's sub with broker JWT on, none without.
PRODUCER = "client-suite" if os.environ.get("QUEEN_SUITE_JWT_SECRET") else None
PUSH_BINARY = "application/x-queen-push"
POP_FRAMES = "application/x-queen-pop"


# ----------------------------------------------------------------------------- helpers


def unique(prefix: str) -> str:
    return f"ct-{prefix}-{uuid.uuid4().hex[:10]}"


def run(node, body: Callable[[Queen], Awaitable[Any]], limit: float = TEST_LIMIT_S, **options: Any) -> Any:
    """Run one test body with a fresh client on a fresh event loop, bounded in time. options go
    to the client's constructor (the defaults when none: JSON bodies)."""

    async def main() -> Any:
        if node.token:
            options.setdefault("bearer_token", node.token)
        client = Queen(node.url, **options)
        try:
            return await asyncio.wait_for(body(client), limit)
        finally:
            await asyncio.wait_for(client.close(), CLOSE_LIMIT_S)

    return asyncio.run(main())


async def pop(
    client: Queen,
    queue: str,
    *,
    group: Optional[str] = None,
    batch: int = 10,
    timeout_ms: int = 5000,
) -> List[Dict[str, Any]]:
    """A bounded long-poll pop through the client."""
    b = client.queue(queue).batch(batch).wait(True).timeout_millis(timeout_ms)
    if group:
        b = b.group(group)
    return await b.pop()


def assert_nothing_to_pop(node, queue: str, group: Optional[str] = None) -> None:
    """Plain-HTTP check that a pop (wait=false) finds nothing and that the broker answered
    successfully (the client's pop() would hide an error as [])."""
    params = {"batch": "10", "wait": "false", "timeout": "0"}
    if group:
        params["consumerGroup"] = group
    path = f"/api/v1/pop/queue/{queue}?{urlencode(params)}"
    r = node.raw("GET", path)
    assert r.status_code in (200, 204), f"GET {path} -> HTTP {r.status_code} {r.text[:300]}"
    if r.status_code == 200 and r.content:
        msgs = (r.json() or {}).get("messages") or []
        assert msgs == [], f"expected nothing to pop from {queue} (group {group}), got {msgs}"


def txn_ids(messages: List[Dict[str, Any]]) -> List[str]:
    return [m.get("transactionId") for m in messages]


async def consume_bounded(
    client: Queen,
    queue: str,
    group: str,
    expected: int,
    *,
    idle_ms: int = 4000,
    limit_s: float = 45.0,
) -> List[Dict[str, Any]]:
    """consume() in a group with auto-ack, stopped by the client's own limit/idle options and
    by an outer wait_for; returns every message the handler saw."""
    seen: List[Dict[str, Any]] = []

    async def handler(msg_or_msgs):
        batch = msg_or_msgs if isinstance(msg_or_msgs, list) else [msg_or_msgs]
        seen.extend(batch)

    consumer = (
        client.queue(queue)
        .group(group)
        .limit(expected)
        .idle_millis(idle_ms)
        .timeout_millis(1000)
        .consume(handler)
    )
    await asyncio.wait_for(consumer, limit_s)
    return seen


# ----------------------------------------------------------------------------- 1. create, push, pop, ack


def test_create_push_pop_ack_and_duplicate(node):
    queue = unique("basic")
    lease_s = SHORT_LEASE_S

    async def body(client: Queen):
        created = await client.queue(queue).config({"leaseTime": lease_s, "retryLimit": 2}).create()
        assert isinstance(created, dict) and not created.get("error"), created
        options = created.get("options") or {}
        assert options.get("leaseTime") == lease_s and options.get("retryLimit") == 2, created

        t1, t2 = unique("txn"), unique("txn")
        pushed = await client.queue(queue).push(
            [{"data": {"n": 1}, "transactionId": t1}, {"data": {"n": 2}, "transactionId": t2}]
        )
        assert [r.get("status") for r in pushed] == ["queued", "queued"], pushed

        duplicates: List[Any] = []

        async def on_dup(items, _err):
            duplicates.extend(items)

        again = await client.queue(queue).push([{"data": {"n": 1}, "transactionId": t1}]).on_duplicate(on_dup)
        assert [r.get("status") for r in again] == ["duplicate"], again
        assert [d["transactionId"] for d in duplicates] == [t1], "the client's on_duplicate callback did not fire"
        assert again[0].get("message_id") == pushed[0].get("message_id"), (again, pushed)

        msgs = await pop(client, queue)
        assert txn_ids(msgs) == [t1, t2], msgs
        assert [m.get("data") for m in msgs] == [{"n": 1}, {"n": 2}], msgs
        for m in msgs:
            assert m.get("partitionId") and m.get("leaseId"), m
        # The broker stamps the token's sub; without JWT there is none.
        assert [m.get("producerSub") for m in msgs] == [PRODUCER] * 2, msgs

        for m in msgs:
            res = await client.ack(m, True)
            assert res.get("success") is True, res

        # The acks took effect and the duplicate wrote nothing: nothing left, even once the
        # lease would have run out (an unacked message would be redelivered by then).
        await asyncio.sleep(lease_s + 1.5)
        assert await pop(client, queue, timeout_ms=1000) == []

    run(node, body)
    assert_nothing_to_pop(node, queue)


# ----------------------------------------------------------------------------- 2. consume with a group


@pytest.mark.parametrize("options", [{}, BINARY], ids=["json", "binary"])
def test_consume_with_group_processes_and_acks(node, options):
    queue = unique("consume")
    group = unique("grp")

    async def body(client: Queen):
        await client.queue(queue).config({"leaseTime": SHORT_LEASE_S}).create()
        sent = [unique("txn") for _ in range(5)]
        res = await client.queue(queue).push([{"data": {"i": i}, "transactionId": t} for i, t in enumerate(sent)])
        assert [r.get("status") for r in res] == ["queued"] * 5, res

        seen = await consume_bounded(client, queue, group, expected=5)
        assert sorted(txn_ids(seen)) == sorted(sent), seen
        assert len(seen) == 5, f"a message was handled twice: {txn_ids(seen)}"

        # consume() acked them in the group: the group has nothing left, even once an unacked
        # batch's lease would have run out.
        await asyncio.sleep(SHORT_LEASE_S + 1.5)
        assert await pop(client, queue, group=group, timeout_ms=1000) == []

    run(node, body, **options)
    assert_nothing_to_pop(node, queue, group=group)


# ----------------------------------------------------------------------------- 3. two groups


def test_two_groups_each_see_every_message(node):
    queue = unique("fanout")
    g1, g2 = unique("ga"), unique("gb")

    async def body(client: Queen):
        await client.queue(queue).config({"leaseTime": SHORT_LEASE_S}).create()
        sent = [unique("txn") for _ in range(4)]
        res = await client.queue(queue).push([{"data": {"i": i}, "transactionId": t} for i, t in enumerate(sent)])
        assert [r.get("status") for r in res] == ["queued"] * 4, res

        seen1, seen2 = await asyncio.gather(
            consume_bounded(client, queue, g1, expected=4),
            consume_bounded(client, queue, g2, expected=4),
        )
        assert sorted(txn_ids(seen1)) == sorted(sent), f"group {g1} saw {txn_ids(seen1)}"
        assert sorted(txn_ids(seen2)) == sorted(sent), f"group {g2} saw {txn_ids(seen2)}"

        # Each group acked its own copy; neither has anything left once leases would be over.
        await asyncio.sleep(SHORT_LEASE_S + 1.5)
        assert await pop(client, queue, group=g1, timeout_ms=1000) == []
        assert await pop(client, queue, group=g2, timeout_ms=1000) == []

    run(node, body)
    assert_nothing_to_pop(node, queue, group=g1)
    assert_nothing_to_pop(node, queue, group=g2)


# ----------------------------------------------------------------------------- 4. transaction


async def one_popped(client: Queen, src: str, dst: str, lease_s: int):
    """The start of a transaction test: both queues made, one message pushed to src and popped.
    Returns (its transactionId, a fresh one for the push, the popped messages)."""
    await client.queue(src).config({"leaseTime": lease_s}).create()
    await client.queue(dst).create()
    t_in, t_out = unique("txn"), unique("txn")
    await client.queue(src).push([{"data": {"order": 7}, "transactionId": t_in}])
    msgs = await pop(client, src, batch=1)
    assert txn_ids(msgs) == [t_in], msgs
    return t_in, t_out, msgs


def test_transaction_ack_and_push(node):
    src, dst = unique("tx-src"), unique("tx-dst")
    lease_s = 3

    async def body(client: Queen):
        t_in, t_out, msgs = await one_popped(client, src, dst, lease_s)

        result = await (
            client.transaction()
            .ack(msgs[0])
            .queue(dst)
            .push([{"data": {"derivedFrom": t_in}, "transactionId": t_out}])
            .commit()
        )
        assert result.get("success") is True, result
        assert isinstance(result.get("results"), list) and len(result["results"]) == 2, result

        out = await pop(client, dst)
        assert txn_ids(out) == [t_out], out
        assert out[0].get("data") == {"derivedFrom": t_in}, out
        assert (await client.ack(out[0], True)).get("success") is True

        # The original must not come back, even after its lease would have run out.
        await asyncio.sleep(lease_s + 1.5)
        assert await pop(client, src, timeout_ms=1000) == []

    run(node, body)
    assert_nothing_to_pop(node, src)
    assert_nothing_to_pop(node, dst)


# ----------------------------------------------------------------------------- 5. lease renew


def test_lease_renew_keeps_the_lease(node):
    queue = unique("renew")
    lease_s = 4

    async def body(client: Queen):
        await client.queue(queue).config({"leaseTime": lease_s}).create()
        t = unique("txn")
        await client.queue(queue).push([{"data": {"x": 1}, "transactionId": t}])

        msgs = await pop(client, queue, batch=1)
        popped_at = time.monotonic()  # the broker stamped the lease before this
        assert txn_ids(msgs) == [t], msgs

        # Renew half-way through the original lease: expiry becomes ~ now + leaseTime.
        await asyncio.sleep(lease_s / 2)
        renew_sent = time.monotonic()
        renewed = await client.renew(msgs[0])
        renewed_at = time.monotonic()
        assert renewed.get("success") is True, renewed
        assert renewed.get("newExpiresAt"), renewed
        assert renewed_at - popped_at < lease_s - 0.5, "renew came too late to prove anything (machine too slow)"

        # Past the original expiry (with margin), still inside the renewed one: nothing to pop.
        await asyncio.sleep(max(0.0, popped_at + lease_s + 0.5 - time.monotonic()))
        assert time.monotonic() < renew_sent + lease_s - 0.5, "check came too late to prove anything"
        assert await client.queue(queue).batch(1).wait(False).pop() == []
        assert_nothing_to_pop(node, queue)

        # Control: once the renewed lease runs out, the message is delivered again, so the
        # empty pop above was the lease at work.
        await asyncio.sleep(max(0.0, renewed_at + lease_s + 0.5 - time.monotonic()))
        again = await pop(client, queue, batch=1, timeout_ms=5000)
        assert txn_ids(again) == [t], again
        assert (await client.ack(again[0], True)).get("success") is True

        # A lease that is gone is not renewed.
        stale = await client.renew(msgs[0])
        assert stale.get("success") is False, stale

    run(node, body)


# ----------------------------------------------------------------------------- 6. DLQ


def test_failed_past_retry_limit_lands_in_dlq(node):
    queue = unique("dlq")

    async def body(client: Queen):
        await client.queue(queue).config({"retryLimit": 1, "leaseTime": 30}).create()
        t = unique("txn")
        await client.queue(queue).push([{"data": {"poison": True}, "transactionId": t}])

        for attempt in (1, 2):
            msgs = await pop(client, queue, batch=1)
            assert txn_ids(msgs) == [t], f"delivery {attempt}: {msgs}"
            res = await client.ack(msgs[0], False, {"error": f"boom {attempt}"})
            assert res.get("success") is True, f"nack {attempt}: {res}"

        # Past its retry limit: not delivered again.
        assert await pop(client, queue, batch=1, timeout_ms=1500) == []

        dlq = await client.queue(queue).dlq().limit(10).get()
        found = [m for m in dlq.get("messages") or [] if m.get("transactionId") == t]
        assert found, (
            f"message {t} not found through the client's dlq builder: {dlq}; broker says: "
            + node.describe("GET", f"/api/v1/dlq?{urlencode({'queue': queue, 'limit': 10, 'offset': 0})}")
        )
        assert dlq.get("total", 0) >= 1, dlq

    run(node, body)
    assert_nothing_to_pop(node, queue)


# ----------------------------------------------------------------------------- 7. KV


def test_kv_put_get_put_if_absent(node):
    ns = "client-suite"
    key = unique("key")

    async def body(client: Queen):
        kv = client.kv
        missing = await kv.get(ns, key)
        assert missing.get("found") is False and not missing, missing

        put = await kv.put(ns, key, {"v": 1}, forever=True)
        assert put.get("applied") is True, put
        assert isinstance(put.get("version"), int) and put["version"] >= 1, put

        got = await kv.get(ns, key)
        assert got.get("found") is True and got.get("value") == {"v": 1}, got
        assert got.get("version") == put["version"], (got, put)

        lost = await kv.put_if_absent(ns, key, {"v": 2}, ttl_seconds=60)
        assert lost.get("applied") is False and not lost, lost
        assert lost.get("reason") == "exists", lost
        assert lost.get("value") == {"v": 1}, lost

        still = await kv.get(ns, key)
        assert still.get("value") == {"v": 1} and still.get("version") == put["version"], still

        key2 = key + "-b"
        won = await kv.put_if_absent(ns, key2, "first", ttl_seconds=60)
        assert won.get("applied") is True, won
        assert (await kv.get(ns, key2)).get("value") == "first"

    run(node, body)


# ----------------------------------------------------------------------------- 8. lock


def test_lock_acquire_hold_contend_release(node):
    name = unique("lock")

    async def body(client: Queen):
        lock = client.lock(name, ttl_seconds=20)
        assert await lock.acquire() is True
        assert lock.held and isinstance(lock.token, int) and lock.token > 0
        guard = lock.guard()
        assert guard.get("op") == "check" and guard.get("required") is True, guard

        info = await client.locks.get(name)
        assert info.get("held") is True, info
        assert [h.get("owner") for h in info.get("holders") or []] == [lock.owner], info

        other = await client.locks.acquire(name, ttl_seconds=20, owner="someone-else:1:abcdef")
        assert other.get("acquired") is False, other
        assert other.get("reason") in ("held", "contended"), other

        rival = client.lock(name, ttl_seconds=20, auto_renew=False)
        assert await rival.acquire() is False
        assert not rival.held

        assert await lock.release() is True
        assert not lock.held
        assert (await client.locks.get(name)).get("held") is False

        # Free again: the other owner gets it now, and gives it back.
        taken = await client.locks.acquire(name, ttl_seconds=20, owner="someone-else:1:abcdef")
        assert taken.get("acquired") is True, taken
        released = await client.locks.release(name, token=taken["token"], slot=taken.get("slot"))
        assert released.get("released") is True, released

    run(node, body)


# ----------------------------------------------------------------------------- 9. binary bodies
#
# The same client constructed with BINARY (consume() in a group runs with it too, in test 2).
# Wire records what each request and answer really were, so a test cannot pass on a silent
# JSON fallback.

class Wire:
    """Every exchange of one client: (method, path, request content type, status, answer
    content type). Hooks the client's own httpx client (queen-mq 2.6.0 keeps it at
    Queen._http_client._client); it only observes."""

    def __init__(self, client: Queen) -> None:
        self.seen: List[tuple] = []

        async def on_response(response) -> None:
            req = response.request
            self.seen.append(
                (req.method, req.url.path, req.headers.get("content-type", ""), response.status_code,
                 response.headers.get("content-type", ""))
            )

        client._http_client._client.event_hooks["response"].append(on_response)

    def of(self, method: str, prefix: str) -> List[tuple]:
        return [w for w in self.seen if w[0] == method and w[1].startswith(prefix)]

    def clear(self) -> None:
        self.seen.clear()


def test_binary_push_pop_ack_and_duplicate(node):
    queue = unique("bin-basic")
    lease_s = SHORT_LEASE_S

    async def body(client: Queen):
        wire = Wire(client)
        await client.queue(queue).config({"leaseTime": lease_s}).create()
        t1, t2, t3 = unique("txn"), unique("txn"), unique("txn")
        sent = [
            {"data": {"n": 1, "text": "caf\u00e9 \U0001F600"}, "transactionId": t1},
            {"data": [1, 2.5, None, True], "transactionId": t2},
            {"data": None, "transactionId": t3},
        ]
        pushed = await client.queue(queue).push(sent)
        assert [r.get("status") for r in pushed] == ["queued"] * 3, pushed
        assert [r.get("transaction_id") for r in pushed] == [t1, t2, t3], pushed
        pushes = wire.of("POST", "/api/v1/push")
        assert [(w[2], w[3]) for w in pushes] == [(PUSH_BINARY, 200)], wire.seen
        # The ids are the client's own UUIDv7s, from its frames.
        assert all(uuid.UUID(r["message_id"]).version == 7 for r in pushed), pushed

        again = await client.queue(queue).push([{"data": {"n": 1}, "transactionId": t1}])
        assert [r.get("status") for r in again] == ["duplicate"], again
        assert again[0].get("message_id") == pushed[0].get("message_id"), (again, pushed)

        wire.clear()
        msgs = await pop(client, queue)
        assert [(w[3], w[4]) for w in wire.of("GET", "/api/v1/pop")] == [(200, POP_FRAMES)], wire.seen
        assert txn_ids(msgs) == [t1, t2, t3], msgs
        assert [m.get("data") for m in msgs] == [s["data"] for s in sent], msgs
        assert [m.get("id") for m in msgs] == [r["message_id"] for r in pushed], (msgs, pushed)
        for m in msgs:
            assert m.get("partitionId") and m.get("leaseId") and m.get("createdAt", "").endswith("Z"), m
            assert m.get("deliveryAttempt") == 1, m
        # In frames too, the producer is the broker-stamped token sub.
        assert [m.get("producerSub") for m in msgs] == [PRODUCER] * 3, msgs

        for m in msgs:
            res = await client.ack(m, True)
            assert res.get("success") is True, res

        await asyncio.sleep(lease_s + 1.5)
        assert await pop(client, queue, timeout_ms=1000) == []
        # An empty pop of the client's autopilot carries the echo (its waitMs advice): 200
        # with a body, framed or not, instead of 204.
        assert [w[3] for w in wire.of("GET", "/api/v1/pop")][-1] == 200, wire.seen

    run(node, body, **BINARY)
    assert_nothing_to_pop(node, queue)


def test_binary_push_without_compression_and_json_fallbacks(node):
    """binary_push alone sends QPB1 with flag 4 (one transactionId per item); an item with a
    traceId travels as JSON (the client's rule), and a pop of a message whose traceId is not a
    UUID in its canonical text is answered as JSON (the broker's rule), read as always."""
    queue = unique("bin-plain")
    trace = str(uuid.uuid4())
    upper = str(uuid.uuid4()).upper()
    t1, t2, t3, t4 = (unique("txn") for _ in range(4))

    async def produce(client: Queen):
        wire = Wire(client)
        await client.queue(queue).create()
        res = await client.queue(queue).push([{"data": {"k": 1}, "transactionId": t1}, {"data": "two", "transactionId": t2}])
        assert [r.get("status") for r in res] == ["queued", "queued"], res
        assert [w[2] for w in wire.of("POST", "/api/v1/push")] == [PUSH_BINARY], wire.seen
        # Without push_compression the broker mints the ids.
        wire.clear()
        res = await client.queue(queue).push([{"data": 3, "transactionId": t3, "traceId": trace}])
        res += await client.queue(queue).push([{"data": 4, "transactionId": t4, "traceId": upper}])
        assert [r.get("status") for r in res] == ["queued", "queued"], res
        assert [w[2].split(";")[0] for w in wire.of("POST", "/api/v1/push")] == ["application/json"] * 2, wire.seen

    async def consume(client: Queen):
        wire = Wire(client)
        first = await pop(client, queue, batch=3)
        assert txn_ids(first) == [t1, t2, t3], first
        assert [m.get("data") for m in first] == [{"k": 1}, "two", 3], first
        assert first[2].get("traceId") == trace, first
        assert [w[4] for w in wire.of("GET", "/api/v1/pop")] == [POP_FRAMES], wire.seen
        for m in first:
            assert (await client.ack(m, True)).get("success") is True
        wire.clear()
        second = await pop(client, queue, batch=3)
        assert txn_ids(second) == [t4] and second[0].get("data") == 4, second
        assert second[0].get("traceId") == upper, second
        assert [w[4].split(";")[0] for w in wire.of("GET", "/api/v1/pop")] == ["application/json"], wire.seen
        assert (await client.ack(second[0], True)).get("success") is True

    run(node, produce, binary_push=True)
    run(node, consume, framed_pop=True)
    assert_nothing_to_pop(node, queue)


def test_binary_transaction_push_then_ack(node):
    """A bundle whose push comes before its ack: QTB1 sends the ack in the JSON head and the
    push as frames; the client puts the results back in its own order."""
    src, dst = unique("btx-src"), unique("btx-dst")
    lease_s = 3

    async def body(client: Queen):
        wire = Wire(client)
        t_in, t_out, msgs = await one_popped(client, src, dst, lease_s)
        wire.clear()
        result = await (
            client.transaction()
            .queue(dst)
            .push([{"data": {"derivedFrom": t_in}, "transactionId": t_out}])
            .ack(msgs[0])
            .commit()
        )
        assert [(w[2], w[3]) for w in wire.of("POST", "/api/v1/transaction")] == [(PUSH_BINARY, 200)], wire.seen
        assert result.get("success") is True, result
        results = result.get("results") or []
        assert [(r.get("index"), r.get("type")) for r in results] == [(0, "push"), (1, "ack")], result
        assert results[0].get("transactionId") == t_out and results[0].get("status") == "queued", result
        assert uuid.UUID(results[0]["message_id"]).version == 7, result

        out = await pop(client, dst)
        assert txn_ids(out) == [t_out] and out[0].get("data") == {"derivedFrom": t_in}, out
        assert out[0].get("id") == results[0]["message_id"], (out, result)
        assert (await client.ack(out[0], True)).get("success") is True

        await asyncio.sleep(lease_s + 1.5)
        assert await pop(client, src, timeout_ms=1000) == []

    run(node, body, **BINARY)
    assert_nothing_to_pop(node, src)
    assert_nothing_to_pop(node, dst)


# ----------------------------------------------------------------------------- broker JWT


def test_broker_jwt_refuses_a_request_without_the_bearer_token(node):
    """Runs only with QUEEN_SUITE_JWT_SECRET (the suite's JWT run): the node really checks
    tokens, so every other test of the run passed with the client's `bearer_token`."""
    if not node.token:
        pytest.skip("the node runs without broker JWT in this run")
    queue = unique("jwt")
    body = {"items": [{"queue": queue, "partition": "p", "payload": {"n": 1}}]}
    r = httpx.post(f"{node.url}/api/v1/push", json=body, timeout=10.0)
    assert r.status_code == 401, r.text
    assert r.json().get("code") == "unauthorized", r.text

    async def body_with_token(client: Queen) -> None:
        await client.queue(queue).push([{"data": {"n": 2}}])
        got = await pop(client, queue, batch=5, timeout_ms=2000)
        assert [m["data"] for m in got] == [{"n": 2}], got

    run(node, body_with_token)


# ----------------------------------------------------------------------------- ephemeral queues


def test_ephemeral_push_pop_ack_groups_and_redelivery(node):
    """client.ephemeral (API.md 4.1): push, pop per group (fan-out and competing), failed
    acks redeliver with attempts, stale and unknown ids, long-poll waits."""
    queue = unique("eph/with-slash")

    async def body(client: Queen):
        from queen.errors import EphemeralQueueNotFoundError

        eph = client.ephemeral
        try:
            await eph.depth(queue)
            raise AssertionError("depth of an unknown ephemeral queue must raise")
        except EphemeralQueueNotFoundError:
            pass

        configured = await eph.configure(queue, lease_seconds=1, retry_limit=1)
        assert configured.get("options", {}).get("leaseSeconds") == 1, configured
        big = 10**25
        pushed = await eph.push(queue, [{"n": 1, "big": big}, {"n": 2}, "three"], partition="p1")
        assert pushed == {"pushed": 3}, pushed

        a = await eph.pop(queue, group="a", batch=10)
        assert [m["payload"] for m in a["messages"]] == [{"n": 1, "big": big}, {"n": 2}, "three"], a
        assert all(m["attempts"] == 1 and m["partition"] == "p1" for m in a["messages"]), a
        # Fan-out: another group sees everything; competing: the same group sees nothing more.
        b = await eph.pop(queue, group="b", batch=10, commit_on_delivery=True)
        assert len(b["messages"]) == 3, b
        assert (await eph.pop(queue, group="a", batch=10))["messages"] == []

        first, second, third = a["messages"]
        acked = await eph.ack(queue, [first, {"id": second["id"], "status": "failed"}], group="a")
        assert [r["outcome"] for r in acked["results"]] == ["acked", "redelivered"], acked
        again = await eph.pop(queue, group="a", batch=10)
        assert [(m["payload"], m["attempts"]) for m in again["messages"]] == [({"n": 2}, 2)], again
        done = await eph.ack(queue, again["messages"], group="a")
        assert [r["outcome"] for r in done["results"]] == ["acked"], done
        # The third's lease (1 s) runs out: it comes back with attempts 2.
        late = await eph.pop(queue, group="a", batch=10, wait=True, timeout=4000)
        assert [(m["payload"], m["attempts"]) for m in late["messages"]] == [("three", 2)], late
        done = await eph.ack(queue, late["messages"], group="a")
        assert [r["outcome"] for r in done["results"]] == ["acked"], done
        stale = await eph.ack(
            queue, [{"id": "e:0000000000000001:0:p1"}, {"id": first["id"]}], group="a"
        )
        assert [r["outcome"] for r in stale["results"]] == ["stale", "unknown"], stale

        depth = await eph.depth(queue)
        assert depth["tier"] == "declared" and depth["length"] == 0, depth

        # A waiting pop is answered by a push that comes while it waits.
        async def later():
            await asyncio.sleep(0.5)
            await eph.push(queue, {"late": True})

        waiter = asyncio.ensure_future(later())
        started = time.monotonic()
        got = await eph.pop(queue, wait=True, timeout=8000)
        await waiter
        assert [m["payload"] for m in got["messages"]] == [{"late": True}], got
        assert time.monotonic() - started < 6, "the waiting pop was not woken by the push"

        listed = await eph.queues()
        assert queue in [q["queue"] for q in listed["queues"]], listed
        assert (await eph.reset(queue))["dropped"] >= 0
        assert (await eph.delete(queue))["deleted"] is True
        assert (await eph.delete(queue))["deleted"] is False

    run(node, body)


def test_ephemeral_budgets_reject_then_drain_and_drop_oldest(node):
    """maxLength with the reject policy answers 429 and the client's retry gets through once
    a consumer drains; dropOldest keeps the newest; ttl drops the old."""
    rejecting, feed, aging = unique("eph-reject"), unique("eph-feed"), unique("eph-ttl")

    async def body(client: Queen):
        eph = client.ephemeral
        await eph.configure(rejecting, max_length=2, policy="reject")
        await eph.push(rejecting, [1, 2])
        r = node.raw("POST", "/api/v1/ephemeral/push", json={"queue": rejecting, "messages": [{"payload": 3}]})
        assert r.status_code == 429 and r.headers.get("retry-after"), (r.status_code, r.text)
        assert r.json().get("code") == "queue_full", r.text

        async def drain():
            await asyncio.sleep(1.0)
            return await eph.pop(rejecting, batch=10, commit_on_delivery=True)

        drainer = asyncio.ensure_future(drain())
        # The client retries the 429 (honouring Retry-After) until the drain made room.
        assert await eph.push(rejecting, [3]) == {"pushed": 1}
        assert len((await drainer)["messages"]) == 2
        left = await eph.pop(rejecting, batch=10, commit_on_delivery=True)
        assert [m["payload"] for m in left["messages"]] == [3], left

        await eph.configure(feed, max_length=3, policy="dropOldest")
        for i in range(6):
            await eph.push(feed, [i])
        kept = await eph.pop(feed, batch=10, commit_on_delivery=True)
        assert [m["payload"] for m in kept["messages"]] == [3, 4, 5], kept

        await eph.configure(aging, ttl_seconds=1)
        await eph.push(aging, ["old"])
        await asyncio.sleep(1.5)
        await eph.push(aging, ["new"])
        fresh = await eph.pop(aging, batch=10, commit_on_delivery=True)
        assert [m["payload"] for m in fresh["messages"]] == ["new"], fresh
        d = await eph.depth(aging)
        assert d["drops"]["ttl"] == 1, d

    run(node, body)


# ----------------------------------------------------------------------------- traces


def test_traces_recorded_by_a_consumer_read_back_by_message_and_name(node):
    queue = unique("traced")
    group = unique("grp")
    name = unique("order-flow")

    async def body(client: Queen):
        await client.queue(queue).config({"leaseTime": SHORT_LEASE_S}).create()
        sent = [unique("txn") for _ in range(3)]
        await client.queue(queue).push([{"data": {"i": i}, "transactionId": t} for i, t in enumerate(sent)])
        answers: List[Dict[str, Any]] = []
        seen: List[Dict[str, Any]] = []

        async def handler(msg_or_msgs):
            for m in msg_or_msgs if isinstance(msg_or_msgs, list) else [msg_or_msgs]:
                seen.append(m)
                answers.append(await m["trace"]({"traceName": [name, "audit"], "data": {"step": "seen", "big": 12345678901234567890123}}))
                answers.append(await m["trace"]({"eventType": "done", "data": {"step": "handled"}}))

        # One message per pop: queen-mq 2.6.0 binds every message's trace() of a batch to the
        # batch's last message (a closure made in a loop), so batches would file them all there.
        consumer = (
            client.queue(queue).group(group).batch(1).limit(3).idle_millis(3000).timeout_millis(1000).consume(handler)
        )
        await asyncio.wait_for(consumer, 45)
        assert len(seen) == 3, seen
        assert all(a.get("success") is True and a.get("traceId") for a in answers), answers

        m = seen[0]
        mine = await client.admin.get_traces_for_message(m["partitionId"], m["transactionId"])
        traces = mine.get("traces")
        assert [t["eventType"] for t in traces] == ["info", "done"], mine
        assert traces[0]["traceNames"] == [name, "audit"] and traces[0]["consumerGroup"] == group, traces
        assert traces[0]["transactionId"] == m["transactionId"], traces
        # The consumer's object comes back as written (a 23-digit number stays exact).
        assert traces[0]["data"] == {"step": "seen", "big": 12345678901234567890123}, traces

        named = await client.admin.get_traces_by_name(name, limit=2)
        assert named["total"] == 3 and len(named["traces"]) == 2, named
        assert {t["transactionId"] for t in named["traces"]} <= set(sent), named
        stamps = [t["createdAt"] for t in named["traces"]]
        assert stamps == sorted(stamps, reverse=True), f"newest first: {stamps}"

        names = await client.admin.get_trace_names(search=name[:12])
        assert [n["traceName"] for n in names["trace_names"]] == [name], names

    run(node, body)
    # A trace without its data, or with data that is not an object, is refused naming the field.
    r = node.raw("POST", "/api/v1/traces", json={"transactionId": "t", "partitionId": "1", "data": [1]})
    assert r.status_code == 400 and "data" in r.text, r.text
    r = node.raw("POST", "/api/v1/traces", json={"transactionId": "t", "partitionId": "1"})
    assert r.status_code == 400 and "data" in r.text, r.text


# ----------------------------------------------------------------------------- streams


def test_streams_windowed_aggregation_end_to_end(node):
    from queen.streams import Stream
    from queen.streams.runtime.register import StreamsConfigHashMismatch

    src, dst = unique("st-src"), unique("st-dst")
    query = unique("per-second")
    amounts = list(range(1, 41))

    async def body(client: Queen):
        await client.queue(src).create()
        await client.queue(dst).create()
        # Two source partitions, each message worth its amount.
        items = [
            {"data": {"amount": a}, "transactionId": unique("txn"), "partition": f"p{a % 2}"}
            for a in amounts
        ]
        for i in range(0, len(items), 10):
            chunk = items[i : i + 10]
            for p in ("p0", "p1"):
                mine = [dict(it) for it in chunk if it["partition"] == p]
                for it in mine:
                    it.pop("partition")
                if mine:
                    await client.queue(src).partition(p).push(mine)

        stream = (
            Stream.from_(client.queue(src))
            .window_tumbling(seconds=1, idle_flush_ms=300)
            .aggregate({"count": lambda m: 1, "sum": lambda m: m["amount"]})
            .to(client.queue(dst))
        )
        runner = await stream.run(query, url=node.url, batch_size=7, max_wait_millis=500, bearer_token=node.token)
        windows: List[Dict[str, Any]] = []
        try:
            deadline = asyncio.get_running_loop().time() + 40
            while sum(w.get("count", 0) for w in windows) < len(amounts):
                assert asyncio.get_running_loop().time() < deadline, (windows, runner.metrics())
                got = await pop(client, dst, group="check", batch=100, timeout_ms=1000)
                for m in got:
                    await client.ack(m, True, {"group": "check"})
                windows.extend(m["data"] for m in got)
        finally:
            await runner.stop()
        assert runner.metrics()["errorsTotal"] == 0, runner.metrics()
        # Every message counted once, in exactly one closed window of its partition.
        assert sum(w["count"] for w in windows) == len(amounts), windows
        assert sum(w["sum"] for w in windows) == sum(amounts), windows
        # The source group acknowledged everything through the cycles.
        assert await pop(client, src, group=f"streams.{query}", timeout_ms=500) == []

        # The same name with another operator chain is refused, unless reset.
        other = Stream.from_(client.queue(src)).map(lambda m: m).to(client.queue(dst))
        try:
            r = await other.run(query, url=node.url, bearer_token=node.token)
            await r.stop()
            raise AssertionError("a changed operator chain was accepted without reset")
        except StreamsConfigHashMismatch:
            pass
        r = await other.run(query, url=node.url, reset=True, bearer_token=node.token)
        await r.stop()

    run(node, body, limit=90)


# ----------------------------------------------------------------------------- admin: messages and analytics


def test_admin_browses_deletes_and_retries_messages_and_reads_analytics(node):
    queue = unique("admin-msgs")
    group = unique("grp")

    async def body(client: Queen):
        await client.queue(queue).config({"retryLimit": 0, "leaseTime": SHORT_LEASE_S}).create()
        sent = [unique("txn") for _ in range(3)]
        await client.queue(queue).push([{"data": {"i": i}, "transactionId": t} for i, t in enumerate(sent)])
        # Deleting and retrying messages needs the admin level: under the suite's JWT run the
        # admin calls carry an admin token (the suite's own is read-write).
        admin_client = client
        from conftest import JWT_SECRET, PROXY, hs256_token

        # Through the proxy the suite's key has every scope, admin included.
        if node.token and not PROXY:
            claims = {"sub": "client-suite-admin", "role": "admin", "exp": int(time.time()) + 3600}
            admin_client = Queen(node.url, bearer_token=hs256_token(JWT_SECRET, claims))
        admin = admin_client.admin

        listed = await admin.list_messages(queue=queue)
        assert [m["transactionId"] for m in listed["messages"]] == sent, listed
        pid = listed["messages"][0]["partitionId"]
        one = await admin.get_message(pid, sent[1])
        assert one["payload"] == {"i": 1} and one["status"] == "pending", one

        # The second message is deleted: the group never gets it.
        deleted = await admin.delete_message(pid, sent[1])
        assert deleted.get("success") is True, deleted
        # The group fails the first (retryLimit 0: a dead letter) and completes the third.
        first = await pop(client, queue, group=group, batch=1, timeout_ms=1000)
        assert txn_ids(first) == [sent[0]], first
        await client.ack(first[0], False, {"group": group})
        second = await pop(client, queue, group=group, batch=10, timeout_ms=1000)
        assert txn_ids(second) == [sent[2]], second
        await client.ack(second[0], True, {"group": group})
        dead = await admin.list_messages(queue=queue, status="dead_letter", consumerGroup=group)
        assert [m["transactionId"] for m in dead["messages"]] == [sent[0]], dead

        # retry_message names no group: the dead letter's own is used, and it comes back.
        retried = await admin.retry_message(pid, sent[0])
        assert retried.get("success") is True, retried
        again = await pop(client, queue, group=group, batch=10, timeout_ms=1000)
        assert [m["data"] for m in again] == [{"i": 0}], again
        assert again[0]["transactionId"].startswith(sent[0] + "#retry"), again

        # Analytics: the node samples every half second (conftest); the queue shows its pushes.
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            a = await admin.get_analytics(queue=queue)
            series = (a.get("queues") or [{}])[0].get("series") or []
            if sum(b.get("pushed", 0) for b in series) >= 1 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.5)
        assert a["queues"][0]["queue"] == queue, a
        if PROXY:
            # Node-wide metrics are the operator's: a cluster's key never reads them.
            for path in ("/api/v1/analytics/system-metrics", "/api/v1/analytics/worker-metrics"):
                r = node.raw("GET", path)
                assert r.status_code == 404 and r.json().get("code") == "route_blocked", r.text
        else:
            system = await admin.get_system_metrics()
            assert system["series"] and system["series"][-1]["rssBytes"] > 0, system
            worker = await admin.get_worker_metrics()
            assert sum(b.get("requests", 0) for b in worker["series"]) > 0, worker
        if admin_client is not client:
            await asyncio.wait_for(admin_client.close(), CLOSE_LIMIT_S)

    run(node, body)
