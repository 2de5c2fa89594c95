use bytes::Bytes;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;
use queen_domain::sink::jsonl::encode_window;
use queen_domain::time::Stamp;

use super::*;

fn records(n: usize) -> Vec<SinkRecord> {
    (0..n)
        .map(|i| SinkRecord {
            partition: format!("cust-{}", i % 3),
            offset: (i / 3) as u64,
            transaction_id: format!("01a1007b-855d-7001-8107-{i:012}"),
            ts: Stamp(1_791_009_457_501_942 + (i as u64 / 10)),
            payload: if i % 7 == 0 {
                Vec::new()
            } else {
                format!("{{\"order\":{i},\"total\":42.00}}").into_bytes()
            },
        })
        .collect()
}

fn sorted(mut rs: Vec<SinkRecord>) -> Vec<SinkRecord> {
    rs.sort_by(|a, b| a.partition.cmp(&b.partition).then(a.offset.cmp(&b.offset)));
    rs
}

#[test]
fn compression_is_deterministic_and_round_trips() {
    let jsonl = encode_window(&mut records(500));
    for c in [Compression::Zstd, Compression::Gzip, Compression::None] {
        let once = compress(&jsonl, c).unwrap();
        assert_eq!(once, compress(&jsonl, c).unwrap(), "{c:?}");
        assert_eq!(decompress(&once, c).unwrap(), jsonl, "{c:?}");
        if c != Compression::None {
            assert!(once.len() < jsonl.len() / 2, "{c:?} compresses");
        }
    }
    let gz = compress(&jsonl, Compression::Gzip).unwrap();
    assert_eq!(
        &gz[..4],
        &[0x1f, 0x8b, 8, 0],
        "gzip, deflate, no flags (no file name)"
    );
    assert_eq!(&gz[4..8], &[0, 0, 0, 0], "mtime 0");
    assert_eq!(gz[9], 255, "OS unknown");
    let zst = compress(&jsonl, Compression::Zstd).unwrap();
    assert_eq!(&zst[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    assert!(decompress(&gz, Compression::Zstd).is_err());
    assert!(decompress(b"not gzip", Compression::Gzip).is_err());
}

#[test]
fn streamed_jsonl_matches_the_whole_text() {
    // Big enough to cross several chunks of the streaming encoder.
    let mut big: Vec<SinkRecord> = records(600);
    for r in &mut big {
        if !r.payload.is_empty() {
            r.payload = format!("\"{}\"", "x".repeat(4000)).into_bytes();
        }
    }
    let rs = sorted(big);
    let whole = encode_window(&mut rs.clone());
    assert!(
        whole.len() > 2 * JSONL_CHUNK,
        "the test crosses chunk boundaries"
    );
    for c in [Compression::Zstd, Compression::Gzip, Compression::None] {
        let streamed = jsonl(&rs, c).unwrap();
        assert_eq!(streamed, jsonl(&rs, c).unwrap(), "{c:?} is deterministic");
        assert_eq!(
            decompress(&streamed, c).unwrap(),
            whole,
            "{c:?} holds the window's text"
        );
    }
    assert_eq!(
        jsonl(&rs, Compression::Gzip).unwrap(),
        compress(&whole, Compression::Gzip).unwrap()
    );
    assert_eq!(jsonl(&rs, Compression::None).unwrap(), whole);
    let zst = jsonl(&rs, Compression::Zstd).unwrap();
    let size = zstd::zstd_safe::get_frame_content_size(&zst).unwrap();
    assert_eq!(
        size,
        Some(whole.len() as u64),
        "the frame names its content size"
    );
}

#[test]
fn extensions() {
    assert_eq!(ext(Format::Jsonl, Compression::Zstd), "jsonl.zst");
    assert_eq!(ext(Format::Jsonl, Compression::Gzip), "jsonl.gz");
    assert_eq!(ext(Format::Jsonl, Compression::None), "jsonl");
    assert_eq!(ext(Format::Parquet, Compression::Zstd), "parquet");
    assert_eq!(ext(Format::Parquet, Compression::None), "parquet");
}

#[test]
fn sha256_is_lowercase_hex() {
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn parquet_is_deterministic() {
    let rs = sorted(records(2_000));
    for codec in [ParquetCodec::Zstd, ParquetCodec::Snappy] {
        let a = parquet(&rs, codec, "orders", "t1").unwrap();
        assert_eq!(a, parquet(&rs, codec, "orders", "t1").unwrap(), "{codec:?}");
        assert_ne!(
            a,
            parquet(&rs, codec, "orders", "t2").unwrap(),
            "the footer names the tenant"
        );
    }
    assert_ne!(
        parquet(&rs, ParquetCodec::Zstd, "orders", "t1").unwrap(),
        parquet(&rs, ParquetCodec::Snappy, "orders", "t1").unwrap()
    );
}

#[test]
fn parquet_round_trips_schema_rows_groups_and_footer() {
    let n = 2 * PARQUET_ROW_GROUP_RECORDS + 17;
    let rs = sorted(records(n));
    let bytes = parquet(
        &rs,
        ParquetCodec::Zstd,
        "orders",
        "00000000-0000-0000-0000-000000000001",
    )
    .unwrap();
    let reader = SerializedFileReader::new(Bytes::from(bytes)).unwrap();
    let meta = reader.metadata();
    assert_eq!(meta.file_metadata().num_rows(), n as i64);
    assert_eq!(meta.num_row_groups(), 3);
    assert_eq!(
        meta.row_group(0).num_rows(),
        PARQUET_ROW_GROUP_RECORDS as i64
    );
    assert_eq!(meta.row_group(2).num_rows(), 17);
    assert_eq!(
        meta.file_metadata().schema(),
        &parse_message_type(PARQUET_SCHEMA).unwrap()
    );
    let mut printed = Vec::new();
    parquet::schema::printer::print_schema(&mut printed, meta.file_metadata().schema());
    let printed = String::from_utf8(printed).unwrap();
    for line in [
        "message queen_record {",
        "REQUIRED BYTE_ARRAY partition (STRING);",
        "REQUIRED INT64 offset;",
        "REQUIRED BYTE_ARRAY transaction_id (STRING);",
        "REQUIRED INT64 ts (TIMESTAMP(MICROS,true));",
        "OPTIONAL BYTE_ARRAY payload (STRING);",
    ] {
        assert!(printed.contains(line), "{line} in {printed}");
    }
    let kv: Vec<(String, Option<String>)> = meta
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .iter()
        .map(|e| (e.key.clone(), e.value.clone()))
        .collect();
    assert!(
        kv.contains(&("queen.queue".into(), Some("orders".into()))),
        "{kv:?}"
    );
    assert!(
        kv.contains(&(
            "queen.tenant".into(),
            Some("00000000-0000-0000-0000-000000000001".into())
        )),
        "{kv:?}"
    );
    assert!(
        meta.file_metadata()
            .created_by()
            .is_some_and(|c| c.starts_with("parquet-rs"))
    );
    // Spot-check rows at both ends and across a row-group boundary.
    let rows: Vec<_> = reader
        .get_row_iter(None)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), n);
    for i in [
        0,
        1,
        PARQUET_ROW_GROUP_RECORDS - 1,
        PARQUET_ROW_GROUP_RECORDS,
        n - 1,
    ] {
        let (row, r) = (&rows[i], &rs[i]);
        assert_eq!(row.get_string(0).unwrap(), &r.partition);
        assert_eq!(row.get_long(1).unwrap(), r.offset as i64);
        assert_eq!(row.get_string(2).unwrap(), &r.transaction_id);
        assert_eq!(row.get_timestamp_micros(3).unwrap(), r.ts.0 as i64);
        if r.payload.is_empty() {
            assert!(row.get_string(4).is_err(), "empty payload is null");
        } else {
            assert_eq!(
                row.get_string(4).unwrap().as_bytes(),
                &r.payload[..],
                "the stored text, byte for byte"
            );
        }
    }
}

#[test]
fn parquet_payload_keeps_line_breaks_and_whitespace_only_is_null() {
    let mut rs = records(2);
    rs[0].payload = b"{\n  \"total\": 42.00\n}".to_vec();
    rs[1].payload = b" \n".to_vec();
    let bytes = parquet(&rs, ParquetCodec::Snappy, "q", "t").unwrap();
    let reader = SerializedFileReader::new(Bytes::from(bytes)).unwrap();
    let rows: Vec<_> = reader
        .get_row_iter(None)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows[0].get_string(4).unwrap(), "{\n  \"total\": 42.00\n}");
    assert!(rows[1].get_string(4).is_err());
}

#[test]
fn parquet_refuses_what_it_cannot_write() {
    let mut rs = records(1);
    rs[0].payload = vec![b'"', 0xff, b'"'];
    assert!(matches!(
        parquet(&rs, ParquetCodec::Zstd, "q", "t"),
        Err(LakeError::Encode { .. })
    ));
    let mut rs = records(1);
    rs[0].offset = u64::MAX;
    assert!(parquet(&rs, ParquetCodec::Zstd, "q", "t").is_err());
    let empty = parquet(&[], ParquetCodec::Zstd, "q", "t").unwrap();
    let reader = SerializedFileReader::new(Bytes::from(empty)).unwrap();
    assert_eq!(reader.metadata().file_metadata().num_rows(), 0);
}
