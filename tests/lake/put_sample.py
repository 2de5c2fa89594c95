#!/usr/bin/env python3
"""Writes a tiny hand-made lake in the sink's layout, for the harness self-test
(tests/blackbox/lake_harness.rs), and optionally uploads it to an S3 bucket with boto3.

    put_sample.py --out DIR [--prefix P] [--s3 http://127.0.0.1:PORT --bucket B
                  [--key K --secret S --region R]]

Writes under DIR/<prefix>/:
  tenant=<T>/queue=orders/dt=2026-10-03/hour=06/w-0000000001-<t0>-<t1>.jsonl.zst   (3 lines)
  tenant=<T>/queue=orders/dt=2026-10-03/hour=07/w-0000000002-<t0>-<t1>.parquet     (3 rows, pyarrow)
  _queen/tenant=<T>/queue=orders/windows/0000000001.json                           (a manifest)
then uploads every file under DIR as key <relative path> (so keys start with <prefix>/).
Prints {"keys": [...]} on stdout.
"""

import argparse
import datetime as dt
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

TENANT = "0f8e2c1a-1111-4a4a-9b9b-123456789abc"
QUEUE = "orders"

# Lines written exactly as below: payloads are raw JSON text and must come back byte for byte.
JSONL_LINES = [
    '{"partition":"p0","offset":0,"transactionId":"tx-0","ts":"2026-10-03T06:00:00.000001Z","payload":{"amount": 42.00, "note":"caf\\u00e9"}}',
    '{"partition":"p0","offset":1,"transactionId":"tx-1","ts":"2026-10-03T06:00:01.500000Z","payload":42.00}',
    '{"partition":"p1","offset":0,"transactionId":"tx-2","ts":"2026-10-03T06:59:59.999999Z","payload":"text"}',
]
PARQUET_ROWS = [
    ("p0", 2, "tx-3", dt.datetime(2026, 10, 3, 7, 0, 0, 1, tzinfo=dt.timezone.utc), '{"amount":1.10}'),
    ("p0", 3, "tx-4", dt.datetime(2026, 10, 3, 7, 30, 0, tzinfo=dt.timezone.utc), None),
    ("p1", 1, "tx-5", dt.datetime(2026, 10, 3, 7, 59, 59, 999999, tzinfo=dt.timezone.utc), "[1, 2.50]"),
]


def write(out, prefix):
    base = os.path.join(out, prefix) if prefix else out
    part = f"tenant={TENANT}/queue={QUEUE}/dt=2026-10-03"
    paths = []

    d = os.path.join(base, part, "hour=06")
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "w-0000000001-1791007200000-1791010799999.jsonl.zst")
    data = ("\n".join(JSONL_LINES) + "\n").encode()
    # Two zstd frames, as a streaming writer may produce.
    c = zstandard.ZstdCompressor()
    with open(p, "wb") as f:
        f.write(c.compress(data[:100]) + c.compress(data[100:]))
    paths.append(p)

    d = os.path.join(base, part, "hour=07")
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "w-0000000002-1791010800000-1791014399999.parquet")
    schema = pa.schema(
        [
            pa.field("partition", pa.string(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("transaction_id", pa.string(), nullable=False),
            pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("payload", pa.string(), nullable=True),
        ]
    )
    cols = list(zip(*PARQUET_ROWS))
    table = pa.table([pa.array(c, type=f.type) for c, f in zip(cols, schema)], schema=schema)
    pq.write_table(table, p, compression="zstd")
    paths.append(p)

    d = os.path.join(base, "_queen", f"tenant={TENANT}", f"queue={QUEUE}", "windows")
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "0000000001.json")
    with open(p, "w") as f:
        json.dump({"window": 1, "objects": 1, "rows": 3}, f)
    paths.append(p)
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", default="lake")
    ap.add_argument("--s3")
    ap.add_argument("--bucket")
    ap.add_argument("--key", default="testkey")
    ap.add_argument("--secret", default="testsecret")
    ap.add_argument("--region", default="us-east-1")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    paths = write(out, a.prefix.strip("/"))
    keys = sorted(os.path.relpath(p, out) for p in paths)
    if a.s3:
        import boto3
        from botocore.config import Config

        s3 = boto3.client(
            "s3",
            endpoint_url=a.s3,
            aws_access_key_id=a.key,
            aws_secret_access_key=a.secret,
            region_name=a.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30),
        )
        for k in keys:
            s3.upload_file(os.path.join(out, k), a.bucket, k)
    print(json.dumps({"keys": keys}))


if __name__ == "__main__":
    main()
