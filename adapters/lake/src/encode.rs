//! Deterministic encoders of a window's objects: the same records give the same bytes on every
//! node and every run (the exactly-once argument rests on it), so nothing here reads a clock,
//! a random number or the machine's settings.

use std::io::{Read, Write};
use std::sync::Arc;

use parquet::basic::{Compression as ParquetCompression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use queen_domain::sink::jsonl::SinkRecord;
use sha2::{Digest, Sha256};

use crate::error::LakeError;

/// The Parquet schema of every data object.
pub const PARQUET_SCHEMA: &str = "message queen_record {
  required binary partition (STRING);
  required int64 offset;
  required binary transaction_id (STRING);
  required int64 ts (TIMESTAMP(MICROS,true));
  optional binary payload (STRING);
}";

/// The generation of these encoders. Raise it whenever the same records could come out as
/// other bytes (a codec setting, the way text is fed in, a new field): intents and manifests
/// name it in `writer`, so a window intended by one generation is never rebuilt by another.
/// 2: JSONL is compressed as it is written, and zstd frames name their content size.
pub const ENCODING: u32 = 2;

/// Records per Parquet row group.
pub const PARQUET_ROW_GROUP_RECORDS: usize = 100_000;

/// zstd level of JSONL objects.
const ZSTD_LEVEL: i32 = 3;
/// gzip (deflate) level of JSONL objects.
const GZIP_LEVEL: u32 = 6;
/// The gzip header's OS byte: 255, "unknown", whatever machine writes it.
const GZIP_OS_UNKNOWN: u8 = 255;

/// File format of the data objects (`QUEEN_S3_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON record per line.
    Jsonl,
    /// Parquet, schema [`PARQUET_SCHEMA`].
    Parquet,
}

impl Format {
    /// The manifest's `format` field.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Parquet => "parquet",
        }
    }
}

/// Compression of JSONL objects (`QUEEN_S3_COMPRESSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// zstd, level 3 (the default).
    Zstd,
    /// gzip, level 6, header with mtime 0 and no file name (for readers without zstd).
    Gzip,
    /// Plain text.
    None,
}

impl Compression {
    /// The manifest's `compression` field for JSONL.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
            Compression::Gzip => "gzip",
            Compression::None => "none",
        }
    }
}

/// Codec inside Parquet objects (`QUEEN_S3_PARQUET_CODEC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParquetCodec {
    /// zstd, level 3.
    Zstd,
    /// Snappy.
    Snappy,
}

impl ParquetCodec {
    /// The manifest's `compression` field for Parquet.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ParquetCodec::Zstd => "zstd",
            ParquetCodec::Snappy => "snappy",
        }
    }
}

/// The extension of a data object: `jsonl.zst`, `jsonl.gz`, `jsonl` or `parquet` (Parquet
/// names its codec inside the file, so `compression` does not apply to it).
#[must_use]
pub fn ext(format: Format, compression: Compression) -> &'static str {
    match (format, compression) {
        (Format::Parquet, _) => "parquet",
        (Format::Jsonl, Compression::Zstd) => "jsonl.zst",
        (Format::Jsonl, Compression::Gzip) => "jsonl.gz",
        (Format::Jsonl, Compression::None) => "jsonl",
    }
}

/// Hex sha256 of `bytes`, as manifests carry it.
#[must_use]
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 0x0f)]));
    }
    out
}

/// Compress a window's JSONL text (from `queen_domain::sink::jsonl::encode_window`).
///
/// # Errors
/// [`LakeError::Encode`] if the codec fails (it does not on an in-memory buffer in practice).
pub fn compress(jsonl: &[u8], compression: Compression) -> Result<Vec<u8>, LakeError> {
    match compression {
        Compression::None => Ok(jsonl.to_vec()),
        Compression::Zstd => {
            zstd::bulk::compress(jsonl, ZSTD_LEVEL).map_err(|e| LakeError::encode("zstd", e))
        }
        Compression::Gzip => {
            let mut encoder = flate2::GzBuilder::new()
                .mtime(0)
                .operating_system(GZIP_OS_UNKNOWN)
                .write(
                    Vec::with_capacity(jsonl.len() / 4 + 64),
                    flate2::Compression::new(GZIP_LEVEL),
                );
            encoder
                .write_all(jsonl)
                .map_err(|e| LakeError::encode("gzip", e))?;
            encoder.finish().map_err(|e| LakeError::encode("gzip", e))
        }
    }
}

/// Bytes of JSONL text gathered before they go to the compressor.
const JSONL_CHUNK: usize = 1 << 20;

/// A window's records as one JSONL object, compressed as it is written: the uncompressed text
/// is never whole in memory (at most [`JSONL_CHUNK`] of it). Gives the same bytes as
/// [`compress`] of the whole text for `None` and `Gzip`; for `Zstd` the frame also names its
/// content size, as a one-shot compression of the whole text would.
///
/// # Errors
/// [`LakeError::Encode`] if the codec fails.
pub fn jsonl(records: &[SinkRecord], compression: Compression) -> Result<Vec<u8>, LakeError> {
    let mut line = Vec::with_capacity(JSONL_CHUNK + 4096);
    // The exact text length first (one pass of formatting, no copy kept): zstd writes it in
    // the frame header, so the frame does not depend on how the text was fed in.
    let mut total = 0_u64;
    for r in records {
        line.clear();
        queen_domain::sink::jsonl::write_line(&mut line, r);
        total += line.len() as u64;
    }
    let estimate = usize::try_from(total).unwrap_or(usize::MAX);
    match compression {
        Compression::None => {
            let mut out = Vec::with_capacity(estimate);
            for r in records {
                queen_domain::sink::jsonl::write_line(&mut out, r);
            }
            Ok(out)
        }
        Compression::Zstd => {
            let fail = |e| LakeError::encode("zstd", e);
            let mut encoder = zstd::stream::write::Encoder::new(
                Vec::with_capacity(estimate / 4 + 64),
                ZSTD_LEVEL,
            )
            .map_err(fail)?;
            encoder.include_contentsize(true).map_err(fail)?;
            encoder.set_pledged_src_size(Some(total)).map_err(fail)?;
            feed(records, &mut line, &mut encoder).map_err(fail)?;
            encoder.finish().map_err(fail)
        }
        Compression::Gzip => {
            let fail = |e| LakeError::encode("gzip", e);
            let mut encoder = flate2::GzBuilder::new()
                .mtime(0)
                .operating_system(GZIP_OS_UNKNOWN)
                .write(
                    Vec::with_capacity(estimate / 4 + 64),
                    flate2::Compression::new(GZIP_LEVEL),
                );
            feed(records, &mut line, &mut encoder).map_err(fail)?;
            encoder.finish().map_err(fail)
        }
    }
}

/// Write the records' lines to `out` in chunks of about [`JSONL_CHUNK`].
fn feed(records: &[SinkRecord], chunk: &mut Vec<u8>, out: &mut impl Write) -> std::io::Result<()> {
    chunk.clear();
    for r in records {
        queen_domain::sink::jsonl::write_line(chunk, r);
        if chunk.len() >= JSONL_CHUNK {
            out.write_all(chunk)?;
            chunk.clear();
        }
    }
    out.write_all(chunk)
}

/// Undo [`compress`] (any number of concatenated zstd frames or gzip members).
///
/// # Errors
/// [`LakeError::Decode`] when the bytes are not of that compression.
pub fn decompress(bytes: &[u8], compression: Compression) -> Result<Vec<u8>, LakeError> {
    match compression {
        Compression::None => Ok(bytes.to_vec()),
        Compression::Zstd => {
            zstd::stream::decode_all(bytes).map_err(|e| LakeError::decode("zstd", e))
        }
        Compression::Gzip => {
            let mut out = Vec::with_capacity(bytes.len() * 4);
            flate2::read::MultiGzDecoder::new(bytes)
                .read_to_end(&mut out)
                .map_err(|e| LakeError::decode("gzip", e))?;
            Ok(out)
        }
    }
}

/// Whether a payload is written as null: empty or only whitespace, as in the JSONL line.
fn payload_is_null(payload: &[u8]) -> bool {
    payload.iter().all(u8::is_ascii_whitespace)
}

fn to_i64(value: u64, what: &'static str) -> Result<i64, LakeError> {
    i64::try_from(value)
        .map_err(|_| LakeError::encode("parquet", format!("{what} {value} does not fit in int64")))
}

/// A window's records as one Parquet file, schema [`PARQUET_SCHEMA`].
///
/// `records` must already be in the window's order (partition, then offset). The payload
/// column holds the stored JSON text byte for byte (no line-break rewriting: Parquet has no
/// lines), null when it is empty or only whitespace. A row group closes every
/// [`PARQUET_ROW_GROUP_RECORDS`] records; the footer carries `queen.queue` and `queen.tenant`
/// and parquet-rs's constant `created_by`.
///
/// # Errors
/// [`LakeError::Encode`] for an offset or stamp above `i64::MAX`, a payload that is not UTF-8
/// (the column is a STRING; the sink hands undecryptable payloads over as a JSON string), or
/// a writer failure.
pub fn parquet(
    records: &[SinkRecord],
    codec: ParquetCodec,
    queue: &str,
    tenant: &str,
) -> Result<Vec<u8>, LakeError> {
    let fail = |e: parquet::errors::ParquetError| LakeError::encode("parquet", e);
    let schema = Arc::new(parse_message_type(PARQUET_SCHEMA).map_err(fail)?);
    let compression = match codec {
        ParquetCodec::Zstd => {
            ParquetCompression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL).map_err(fail)?)
        }
        ParquetCodec::Snappy => ParquetCompression::SNAPPY,
    };
    let properties = WriterProperties::builder()
        .set_compression(compression)
        .set_key_value_metadata(Some(vec![
            KeyValue::new("queen.queue".to_owned(), queue.to_owned()),
            KeyValue::new("queen.tenant".to_owned(), tenant.to_owned()),
        ]))
        .build();
    let estimate = records
        .iter()
        .map(|r| r.payload.len() + r.partition.len() + 64)
        .sum::<usize>()
        / 2;
    let mut writer =
        SerializedFileWriter::new(Vec::with_capacity(estimate), schema, Arc::new(properties))
            .map_err(fail)?;
    for group in records.chunks(PARQUET_ROW_GROUP_RECORDS) {
        let partitions: Vec<ByteArray> = group
            .iter()
            .map(|r| ByteArray::from(r.partition.as_str()))
            .collect();
        let offsets = group
            .iter()
            .map(|r| to_i64(r.offset, "offset"))
            .collect::<Result<Vec<_>, _>>()?;
        let transactions: Vec<ByteArray> = group
            .iter()
            .map(|r| ByteArray::from(r.transaction_id.as_str()))
            .collect();
        let stamps = group
            .iter()
            .map(|r| to_i64(r.ts.0, "ts"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut payloads = Vec::with_capacity(group.len());
        let mut defined = Vec::with_capacity(group.len());
        for r in group {
            if payload_is_null(&r.payload) {
                defined.push(0_i16);
            } else {
                std::str::from_utf8(&r.payload).map_err(|_| {
                    LakeError::encode(
                        "parquet",
                        format!(
                            "payload of {} offset {} is not UTF-8",
                            r.partition, r.offset
                        ),
                    )
                })?;
                payloads.push(ByteArray::from(r.payload.clone()));
                defined.push(1_i16);
            }
        }
        let mut row_group = writer.next_row_group().map_err(fail)?;
        let mut column = 0_usize;
        while let Some(mut writer) = row_group.next_column().map_err(fail)? {
            match column {
                0 => writer
                    .typed::<ByteArrayType>()
                    .write_batch(&partitions, None, None),
                1 => writer
                    .typed::<Int64Type>()
                    .write_batch(&offsets, None, None),
                2 => writer
                    .typed::<ByteArrayType>()
                    .write_batch(&transactions, None, None),
                3 => writer.typed::<Int64Type>().write_batch(&stamps, None, None),
                _ => writer
                    .typed::<ByteArrayType>()
                    .write_batch(&payloads, Some(&defined), None),
            }
            .map_err(fail)?;
            writer.close().map_err(fail)?;
            column += 1;
        }
        row_group.close().map_err(fail)?;
    }
    writer.into_inner().map_err(fail)
}

#[cfg(test)]
mod tests;
