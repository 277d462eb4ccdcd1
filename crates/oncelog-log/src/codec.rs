//! The record-batch compression codecs (attribute bits 0-2), in pure Rust.
//!
//! The broker stores batches as they arrive and never needs these on the
//! produce or fetch path. Two places read records inside a batch: the log
//! cleaner (it keeps some records of a batch and writes them back with the
//! same codec) and the produce check of compacted topics (every record must
//! have a key). Decompression is bounded, so a small batch cannot expand
//! into unbounded memory.

use std::io::{Read, Write};

use thiserror::Error;

pub const NONE: i16 = 0;
pub const GZIP: i16 = 1;
pub const SNAPPY: i16 = 2;
pub const LZ4: i16 = 3;
pub const ZSTD: i16 = 4;

/// The most bytes one batch's records may decompress to.
pub const MAX_DECOMPRESSED: usize = 256 << 20;

/// xerial's snappy framing, which the Java client writes: a 16-byte header,
/// then blocks of (big-endian length, raw snappy data).
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_LEN: usize = 16;

#[derive(Debug, Error)]
pub enum CodecError {
    #[error("unknown compression codec {0}")]
    Unknown(i16),
    #[error("{codec} data is corrupt: {detail}")]
    Corrupt { codec: &'static str, detail: String },
    #[error("records decompress to more than {MAX_DECOMPRESSED} bytes")]
    TooLarge,
}

pub fn name(codec: i16) -> &'static str {
    match codec {
        NONE => "none",
        GZIP => "gzip",
        SNAPPY => "snappy",
        LZ4 => "lz4",
        ZSTD => "zstd",
        _ => "unknown",
    }
}

fn corrupt(codec: i16, e: impl std::fmt::Display) -> CodecError {
    CodecError::Corrupt {
        codec: name(codec),
        detail: e.to_string(),
    }
}

/// Reads all of `r`, failing past [`MAX_DECOMPRESSED`] bytes.
fn read_bounded(codec: i16, r: impl Read) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    r.take(MAX_DECOMPRESSED as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(codec, e))?;
    if out.len() > MAX_DECOMPRESSED {
        return Err(CodecError::TooLarge);
    }
    Ok(out)
}

fn snappy_raw(data: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
    let n = snap::raw::decompress_len(data).map_err(|e| corrupt(SNAPPY, e))?;
    if out.len() + n > MAX_DECOMPRESSED {
        return Err(CodecError::TooLarge);
    }
    let at = out.len();
    out.resize(at + n, 0);
    snap::raw::Decoder::new()
        .decompress(data, &mut out[at..])
        .map_err(|e| corrupt(SNAPPY, e))?;
    Ok(())
}

/// The records section of a batch compressed with `codec`, decompressed.
pub fn decompress(codec: i16, data: &[u8]) -> Result<Vec<u8>, CodecError> {
    match codec {
        NONE => Ok(data.to_vec()),
        GZIP => read_bounded(codec, flate2::read::GzDecoder::new(data)),
        SNAPPY => {
            let mut out = Vec::new();
            if data.starts_with(XERIAL_MAGIC) && data.len() >= XERIAL_HEADER_LEN {
                let mut rest = &data[XERIAL_HEADER_LEN..];
                while !rest.is_empty() {
                    if rest.len() < 4 {
                        return Err(corrupt(codec, "truncated xerial block length"));
                    }
                    let n = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                    let block = rest
                        .get(4..4 + n)
                        .ok_or_else(|| corrupt(codec, "truncated xerial block"))?;
                    snappy_raw(block, &mut out)?;
                    rest = &rest[4 + n..];
                }
            } else {
                snappy_raw(data, &mut out)?;
            }
            Ok(out)
        }
        LZ4 => read_bounded(codec, lz4_flex::frame::FrameDecoder::new(data)),
        ZSTD => {
            let d = ruzstd::decoding::StreamingDecoder::new(data).map_err(|e| corrupt(codec, e))?;
            read_bounded(codec, d)
        }
        other => Err(CodecError::Unknown(other)),
    }
}

/// `data` compressed with `codec`, in the form Kafka's own clients write.
pub fn compress(codec: i16, data: &[u8]) -> Result<Vec<u8>, CodecError> {
    match codec {
        NONE => Ok(data.to_vec()),
        GZIP => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(data).map_err(|e| corrupt(codec, e))?;
            w.finish().map_err(|e| corrupt(codec, e))
        }
        SNAPPY => {
            // xerial framing: header (magic, version 1, compatible version 1)
            // then one block per 32 KiB of input.
            let mut out = Vec::with_capacity(data.len() / 2 + 32);
            out.extend_from_slice(XERIAL_MAGIC);
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(&1u32.to_be_bytes());
            let mut enc = snap::raw::Encoder::new();
            for chunk in data.chunks(32 * 1024) {
                let block = enc.compress_vec(chunk).map_err(|e| corrupt(codec, e))?;
                out.extend_from_slice(&(block.len() as u32).to_be_bytes());
                out.extend_from_slice(&block);
            }
            Ok(out)
        }
        LZ4 => {
            let mut w = lz4_flex::frame::FrameEncoder::new(Vec::new());
            w.write_all(data).map_err(|e| corrupt(codec, e))?;
            w.finish().map_err(|e| corrupt(codec, e))
        }
        ZSTD => Ok(ruzstd::encoding::compress_to_vec(
            data,
            ruzstd::encoding::CompressionLevel::Fastest,
        )),
        other => Err(CodecError::Unknown(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips() {
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_be_bytes())
            .collect();
        for codec in [NONE, GZIP, SNAPPY, LZ4, ZSTD] {
            let c = compress(codec, &data).unwrap();
            assert_eq!(decompress(codec, &c).unwrap(), data, "{}", name(codec));
            assert_eq!(
                decompress(codec, &compress(codec, b"").unwrap()).unwrap(),
                b""
            );
        }
    }

    #[test]
    fn raw_snappy_is_read_too() {
        let raw = snap::raw::Encoder::new()
            .compress_vec(b"hello hello hello")
            .unwrap();
        assert_eq!(decompress(SNAPPY, &raw).unwrap(), b"hello hello hello");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for codec in [GZIP, SNAPPY, LZ4, ZSTD, 5] {
            assert!(decompress(codec, b"\x82SNAPPY\x00garbage-garbage-garbage").is_err());
            assert!(decompress(codec, &[0xff; 3]).is_err());
        }
    }
}
