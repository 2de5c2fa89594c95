#!/usr/bin/env python3
"""Reads the sink's Hive-layout lake with two independent readers and prints one JSON object.

    read_lake.py (--root DIR | --s3 http://127.0.0.1:PORT --bucket B [--key K --secret S
                  --region R]) [--prefix P] [--tenant T] [--queue Q] [--format jsonl|parquet|both]

Layout read (relative to <prefix>, which may be empty):
    tenant=<t>/queue=<q>/dt=<YYYY-MM-DD>/hour=<HH>/w-<k:010>-<tStart>-<tEnd>.<ext>
        ext: jsonl.zst | jsonl.gz | jsonl | parquet
    _queen/tenant=<t>/queue=<q>/windows/<k:010>.json      (manifests; listed, never read as data)

Readers:
  * "duckdb" (1.5.5; over S3 with the httpfs extension file from the duckdb-extension-httpfs wheel,
    LOAD '<file>' + CREATE SECRET path style, no SSL). Files are found with glob().
    Parquet: read_parquet([...], hive_partitioning = true, hive_types_autocast = false).
    JSONL:   read_csv([...]) with one VARCHAR column per line (no quote/escape/delimiter, so the
             line text is kept byte for byte; .zst/.gz are decompressed from the extension), hive
             columns from the path; fields by DuckDB's JSON functions.
  * "pyarrow" (pyarrow.fs for listing and reading, local or S3):
    Parquet: pyarrow.dataset over the explicit list of *.parquet objects with hive partitioning
             (all partition keys typed string). exclude_invalid_files is NOT used: a .parquet
             object that is not valid Parquet must fail the run, not be skipped silently.
    JSONL:   whole object read, decompressed with zstandard (all frames) / gzip, split on \n,
             each line parsed with Python's json module, strictly (types, ts format).

payload_text (the 6th item of each record) is the payload exactly as stored:
  * Parquet: the `payload` string column as is; NULL -> null.
  * JSONL:   the raw JSON text of the `payload` value as it appears in the line (42.00 stays
             42.00, escapes and spaces kept); the literal `null` gives "null"; a missing field
             gives null. DuckDB's JSON type re-serialises numbers (42.00 -> 42.0), so the DuckDB
             reader takes the text after `"payload":` up to the line's final `}` and keeps it only
             when DuckDB parses it to the same JSON value as the `payload` field; otherwise (the
             payload is not the last field) it falls back to DuckDB's normalised text and counts
             the row in duckdb.payload_normalized.
  * Python reader: the raw text is cut out of the line with json.JSONDecoder.raw_decode offsets.

Output (stdout, one JSON object):
  {"duckdb":  {"rows": n, "records": [[tenant, queue, partition, offset, transactionId, payload_text], ...],
               "by_format": {"jsonl": n, "parquet": n}, "ts": [min, max] | null,
               "files": [relkey, ...], "payload_normalized": n},
   "pyarrow": {... same keys, "parquet_schema": {column: "type[ not null]"}, "extra_fields": [...]},
   "hive": {"tenants": [...], "queues": [...], "dts": [...], "hours": ["06", ...]},
   "files": [data object keys relative to prefix], "manifests": {relkey: parsed JSON},
   "other": [keys under prefix that are neither data objects nor manifests]}
Records are sorted; ts strings are RFC 3339 with microseconds and Z (2026-10-03T06:00:00.000001Z).
Exit 1 with a message on stderr when anything cannot be read.
"""

import argparse
import datetime as _dt
import gzip
import io
import json
import os
import re
import sys
from urllib.parse import urlparse

DATA_RE = re.compile(
    r"^tenant=(?P<tenant>[^/]+)/queue=(?P<queue>[^/]+)/dt=(?P<dt>[^/]+)/hour=(?P<hour>[^/]+)/"
    r"w-(?P<k>\d{10})-(?P<t0>[^-/]+)-(?P<t1>[^-/]+)(?:-p-(?P<part>[^/]+)-(?P<first>\d+)-(?P<last>\d+))?"
    r"\.(?P<ext>jsonl\.zst|jsonl\.gz|jsonl|parquet)$"
)
MANIFEST_RE = re.compile(r"^_queen/tenant=[^/]+/queue=[^/]+/windows/\d{10}\.json$")
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
JSONL_EXTS = ("jsonl.zst", "jsonl.gz", "jsonl")
EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def fail(msg):
    print(f"read_lake: {msg}", file=sys.stderr)
    sys.exit(1)


def sort_records(records):
    return sorted(records, key=lambda r: (r[0], r[1], r[2], r[3], r[4], r[5] is None, r[5] or ""))


def fmt_micros(us):
    return (EPOCH + _dt.timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sql_str(s):
    return "'" + s.replace("'", "''") + "'"


class Lake:
    """Where the lake is: a local folder or an S3 bucket, plus the key prefix."""

    def __init__(self, args):
        self.args = args
        self.prefix = (args.prefix or "").strip("/")
        if args.root:
            root = os.path.abspath(args.root)
            self.base = os.path.join(root, self.prefix) if self.prefix else root  # pyarrow path
            self.duck_base = self.base  # duckdb path
        else:
            if not args.bucket:
                fail("--s3 needs --bucket")
            u = urlparse(args.s3 if "://" in args.s3 else "http://" + args.s3)
            self.scheme = u.scheme or "http"
            self.hostport = u.netloc
            self.base = f"{args.bucket}/{self.prefix}" if self.prefix else args.bucket
            self.duck_base = "s3://" + self.base

    def selected(self, m):
        a = self.args
        if a.tenant and m.group("tenant") != a.tenant:
            return False
        if a.queue and m.group("queue") != a.queue:
            return False
        ext = m.group("ext")
        if a.format == "jsonl" and ext == "parquet":
            return False
        if a.format == "parquet" and ext != "parquet":
            return False
        return True


# ---------------------------------------------------------------------------------------------
# pyarrow reader (plus the listing that gives "hive", "files", "manifests", "other")


def pyarrow_fs(lake):
    import pyarrow.fs as pafs

    if lake.args.root:
        return pafs.LocalFileSystem()
    return pafs.S3FileSystem(
        access_key=lake.args.key,
        secret_key=lake.args.secret,
        region=lake.args.region,
        endpoint_override=lake.hostport,
        scheme=lake.scheme,
        force_virtual_addressing=False,
        connect_timeout=5,
        request_timeout=30,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2),
    )


def list_lake(lake, fs):
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(lake.base, recursive=True, allow_not_found=True))
    data, manifests, other = [], [], []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(lake.base) :].lstrip("/")
        m = DATA_RE.match(rel)
        if m:
            data.append((rel, m))
        elif MANIFEST_RE.match(rel):
            manifests.append(rel)
        else:
            other.append(rel)
    data.sort(key=lambda x: x[0])
    return data, sorted(manifests), sorted(other)


def read_bytes(fs, path):
    with fs.open_input_stream(path, compression=None) as f:
        return f.read()


def decompress(raw, ext, where):
    if ext == "jsonl.zst":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True)
        return reader.read()
    if ext == "jsonl.gz":
        return gzip.decompress(raw)
    return raw


def top_level_fields(line, where):
    """The top-level fields of a JSON object line: {key: (value, raw_text)}."""
    dec = json.JSONDecoder()
    ws = " \t\r\n"
    n = len(line)
    i = 0

    def skip(i):
        while i < n and line[i] in ws:
            i += 1
        return i

    i = skip(i)
    if i >= n or line[i] != "{":
        fail(f"{where}: not a JSON object")
    i = skip(i + 1)
    fields = {}
    if i < n and line[i] == "}":
        i += 1
    else:
        while True:
            if i >= n or line[i] != '"':
                fail(f"{where}: expected a key at column {i}")
            key, i = dec.raw_decode(line, i)
            i = skip(i)
            if i >= n or line[i] != ":":
                fail(f"{where}: expected ':' at column {i}")
            i = skip(i + 1)
            try:
                value, end = dec.raw_decode(line, i)
            except json.JSONDecodeError as e:
                fail(f"{where}: bad value for {key!r}: {e}")
            if key in fields:
                fail(f"{where}: duplicate key {key!r}")
            fields[key] = (value, line[i:end])
            i = skip(end)
            if i < n and line[i] == ",":
                i = skip(i + 1)
                continue
            if i < n and line[i] == "}":
                i += 1
                break
            fail(f"{where}: expected ',' or '}}' at column {i}")
    if skip(i) != n:
        fail(f"{where}: content after the object")
    # Cross-check with a plain parse of the whole line.
    whole = json.loads(line)
    if set(whole) != set(fields):
        fail(f"{where}: key mismatch between parsers")
    return fields


def pyarrow_jsonl(lake, fs, files):
    records, ts, extra = [], [], set()
    expected = {"partition", "offset", "transactionId", "ts", "payload"}
    for rel, m in files:
        ext = m.group("ext")
        path = f"{lake.base}/{rel}"
        text = decompress(read_bytes(fs, path), ext, rel)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            fail(f"{rel}: not UTF-8: {e}")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for no, line in enumerate(lines, 1):
            where = f"{rel}:{no}"
            f = top_level_fields(line, where)
            extra.update(set(f) - expected)
            for k in ("partition", "offset", "transactionId", "ts"):
                if k not in f:
                    fail(f"{where}: missing {k!r}")
            part, off, txid, t = (f[k][0] for k in ("partition", "offset", "transactionId", "ts"))
            if not isinstance(part, str):
                fail(f"{where}: partition is not a string")
            if not isinstance(off, int) or isinstance(off, bool):
                fail(f"{where}: offset is not an integer")
            if not isinstance(txid, str):
                fail(f"{where}: transactionId is not a string")
            if not isinstance(t, str) or not TS_RE.match(t):
                fail(f"{where}: ts {t!r} is not RFC 3339 with microseconds and Z")
            payload = f["payload"][1] if "payload" in f else None
            records.append([m.group("tenant"), m.group("queue"), part, off, txid, payload])
            ts.append(t)
    return records, ts, sorted(extra)


def pyarrow_parquet(lake, fs, files):
    import pyarrow as pa
    import pyarrow.dataset as ds

    if not files:
        return [], [], {}
    part = ds.partitioning(
        pa.schema([("tenant", pa.string()), ("queue", pa.string()), ("dt", pa.string()), ("hour", pa.string())]),
        flavor="hive",
    )
    paths = [f"{lake.base}/{rel}" for rel, _ in files]
    dataset = ds.dataset(paths, filesystem=fs, format="parquet", partitioning=part, partition_base_dir=lake.base)
    hive = {"tenant", "queue", "dt", "hour"}
    schema = {
        f.name: str(f.type) + ("" if f.nullable else " not null") for f in dataset.schema if f.name not in hive
    }
    cols = ["tenant", "queue", "partition", "offset", "transaction_id", "ts"]
    has_payload = "payload" in dataset.schema.names
    table = dataset.to_table(columns=cols + (["payload"] if has_payload else []))
    tsv = table.column("ts").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    payloads = table.column("payload").to_pylist() if has_payload else [None] * table.num_rows
    records = []
    for i, row in enumerate(zip(*(table.column(c).to_pylist() for c in cols[:5]))):
        records.append([row[0], row[1], row[2], row[3], row[4], payloads[i]])
    return records, [fmt_micros(us) for us in tsv], schema


def pyarrow_reader(lake):
    fs = pyarrow_fs(lake)
    data, manifests, other = list_lake(lake, fs)
    chosen = [(rel, m) for rel, m in data if lake.selected(m)]
    jsonl = [(rel, m) for rel, m in chosen if m.group("ext") in JSONL_EXTS]
    parquet = [(rel, m) for rel, m in chosen if m.group("ext") == "parquet"]
    jrec, jts, extra = pyarrow_jsonl(lake, fs, jsonl)
    prec, pts, schema = pyarrow_parquet(lake, fs, parquet)
    ts = jts + pts
    records = sort_records(jrec + prec)
    out = {
        "rows": len(records),
        "records": records,
        "by_format": {"jsonl": len(jrec), "parquet": len(prec)},
        "ts": [min(ts), max(ts)] if ts else None,
        "files": [rel for rel, _ in chosen],
        "payload_normalized": 0,
        "parquet_schema": schema,
        "extra_fields": extra,
    }
    hive = {
        "tenants": sorted({m.group("tenant") for _, m in chosen}),
        "queues": sorted({m.group("queue") for _, m in chosen}),
        "dts": sorted({m.group("dt") for _, m in chosen}),
        "hours": sorted({m.group("hour") for _, m in chosen}),
    }
    parsed = {}
    for rel in manifests:
        raw = read_bytes(fs, f"{lake.base}/{rel}")
        try:
            parsed[rel] = json.loads(raw)
        except ValueError as e:
            fail(f"manifest {rel} is not JSON: {e}")
    return out, hive, [rel for rel, _ in data], parsed, other


# ---------------------------------------------------------------------------------------------
# DuckDB reader


def httpfs_extension():
    import duckdb
    import duckdb_extension_httpfs as m

    path = os.path.join(os.path.dirname(m.__file__), "extensions", f"v{duckdb.__version__}", "httpfs.duckdb_extension")
    if not os.path.exists(path):
        found = [
            os.path.join(d, f)
            for d, _, fs in os.walk(os.path.dirname(m.__file__))
            for f in fs
            if f == "httpfs.duckdb_extension"
        ]
        if not found:
            fail(f"no httpfs.duckdb_extension in {os.path.dirname(m.__file__)}")
        path = found[0]
    return path


def duckdb_reader(lake):
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET autoinstall_known_extensions = false")
    if not lake.args.root:
        con.execute(f"LOAD {sql_str(httpfs_extension())}")
        con.execute(
            "CREATE SECRET lake (TYPE s3, KEY_ID {}, SECRET {}, REGION {}, ENDPOINT {}, URL_STYLE 'path', USE_SSL {})".format(
                sql_str(lake.args.key),
                sql_str(lake.args.secret),
                sql_str(lake.args.region),
                sql_str(lake.hostport),
                "true" if lake.scheme == "https" else "false",
            )
        )
        con.execute("SET http_retries = 1")
        con.execute("SET http_timeout = 30")

    a = lake.args
    t = a.tenant or "*"
    q = a.queue or "*"
    pattern = f"{lake.duck_base}/tenant={t}/queue={q}/dt=*/hour=*/w-*"
    files = [r[0] for r in con.execute(f"SELECT file FROM glob({sql_str(pattern)}) ORDER BY file").fetchall()]
    chosen = []
    for f in files:
        rel = f[len(lake.duck_base) :].lstrip("/")
        m = DATA_RE.match(rel)
        if m and lake.selected(m):
            chosen.append((f, rel, m))
    jsonl = [f for f, _, m in chosen if m.group("ext") in JSONL_EXTS]
    parquet = [f for f, _, m in chosen if m.group("ext") == "parquet"]
    ts_fmt = "strftime(ts::TIMESTAMP, '%Y-%m-%dT%H:%M:%S.%fZ')"

    jrec, normalized, read_json_rows = [], 0, 0
    if jsonl:
        lst = "[" + ", ".join(sql_str(f) for f in jsonl) + "]"
        sql = rf"""
        WITH l AS (
          SELECT tenant, queue, line FROM read_csv({lst}, columns = {{'line': 'VARCHAR'}}, header = false,
            delim = chr(1), quote = '', escape = '', auto_detect = false, max_line_size = 268435456,
            hive_partitioning = true, hive_types_autocast = false)
          WHERE line IS NOT NULL
        ), m AS (
          SELECT *, regexp_extract(line, '"payload"\s*:\s*(.*?)\s*\}}\s*$', 1) AS raw,
                 line -> '$.payload' AS norm FROM l
        ), r AS (
          SELECT tenant, queue, line ->> '$.partition' AS partition, (line -> '$.offset')::BIGINT AS "offset",
                 line ->> '$.transactionId' AS txid, (line ->> '$.ts')::TIMESTAMPTZ AS ts,
                 CASE WHEN norm IS NULL THEN NULL WHEN coalesce(try(json(raw)) = norm, false) THEN raw
                      ELSE norm::VARCHAR END AS payload,
                 norm IS NOT NULL AND NOT coalesce(try(json(raw)) = norm, false) AS normalized
          FROM m
        )
        SELECT tenant, queue, partition, "offset", txid, payload, {ts_fmt}, normalized FROM r
        """
        for row in con.execute(sql).fetchall():
            jrec.append(list(row[:6]) + [row[6]])
            normalized += 1 if row[7] else 0
        # The same objects through DuckDB's own JSON reader (read_json with Hive partitioning), as a
        # lake user would query them: it must see the same records.
        rj = con.execute(
            f"""SELECT tenant, queue, partition, "offset", transactionId FROM read_json({lst}, format = 'newline_delimited',
                hive_partitioning = true, hive_types_autocast = false,
                columns = {{'partition': 'VARCHAR', 'offset': 'BIGINT', 'transactionId': 'VARCHAR', 'ts': 'VARCHAR', 'payload': 'JSON'}})"""
        ).fetchall()
        if sorted(tuple(r) for r in rj) != sorted(tuple(r[:5]) for r in jrec):
            fail(f"read_json saw {len(rj)} records, the line reader {len(jrec)}: they differ")
        read_json_rows = len(rj)

    prec = []
    if parquet:
        lst = "[" + ", ".join(sql_str(f) for f in parquet) + "]"
        cols = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({lst}, union_by_name = true)").fetchall()]
        payload = "payload" if "payload" in cols else "NULL::VARCHAR"
        sql = f"""
        SELECT tenant, queue, partition, "offset", transaction_id::VARCHAR, {payload}, {ts_fmt}
        FROM read_parquet({lst}, hive_partitioning = true, hive_types_autocast = false, union_by_name = true)
        """
        prec = [list(r) for r in con.execute(sql).fetchall()]

    ts = [r[6] for r in jrec + prec]
    records = sort_records([r[:6] for r in jrec + prec])
    return {
        "rows": len(records),
        "records": records,
        "by_format": {"jsonl": len(jrec), "parquet": len(prec)},
        "ts": [min(ts), max(ts)] if ts else None,
        "files": [rel for _, rel, _ in chosen],
        "payload_normalized": normalized,
        "read_json_rows": read_json_rows,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--root", help="local folder holding the lake (the bucket's contents)")
    where.add_argument("--s3", help="S3 endpoint, e.g. http://127.0.0.1:5055 (path style)")
    p.add_argument("--bucket")
    p.add_argument("--key", default="testkey")
    p.add_argument("--secret", default="testsecret")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--prefix", default="")
    p.add_argument("--tenant")
    p.add_argument("--queue")
    p.add_argument("--format", choices=["jsonl", "parquet", "both"], default="both")
    args = p.parse_args()
    lake = Lake(args)
    try:
        pa_out, hive, files, manifests, other = pyarrow_reader(lake)
        duck_out = duckdb_reader(lake)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - any reader failure is a failed read
        import traceback

        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
    json.dump(
        {
            "duckdb": duck_out,
            "pyarrow": pa_out,
            "hive": hive,
            "files": files,
            "manifests": manifests,
            "other": other,
        },
        sys.stdout,
        ensure_ascii=False,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
