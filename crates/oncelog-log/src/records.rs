//! The records inside one batch, for the few places that need them: the log
//! cleaner (which keeps some records of a batch) and the produce check of
//! compacted topics (every record must have a key).

use std::ops::Range;

use thiserror::Error;

use crate::batch::{self, get_varint, BatchHeader, HEADER_LEN, LOG_OVERHEAD};
use crate::codec::{self, CodecError};

/// One record, as positions in [`BatchRecords::data`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSpan {
    /// The whole record, length varint included.
    pub bytes: Range<usize>,
    pub timestamp_delta: i64,
    pub offset_delta: i64,
    /// `None`: the record has no key.
    pub key: Option<Range<usize>>,
    /// `None`: a null value (a tombstone).
    pub value: Option<Range<usize>>,
}

impl RecordSpan {
    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }

    /// The record's timestamp, given its batch's base timestamp.
    pub fn timestamp(&self, base_timestamp: i64) -> i64 {
        base_timestamp.wrapping_add(self.timestamp_delta)
    }
}

/// A batch's records, decompressed.
#[derive(Debug)]
pub struct BatchRecords {
    pub data: Vec<u8>,
    pub records: Vec<RecordSpan>,
}

impl BatchRecords {
    pub fn key(&self, r: &RecordSpan) -> Option<&[u8]> {
        r.key.clone().map(|k| &self.data[k])
    }
}

#[derive(Debug, Error)]
pub enum RecordsError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("record {index} is malformed")]
    Malformed { index: usize },
    #[error("the batch says {expected} records but holds {found}")]
    Count { expected: i32, found: usize },
}

/// Decodes the records of a whole, valid batch.
pub fn batch_records(b: &[u8]) -> Result<BatchRecords, RecordsError> {
    let h = BatchHeader::new(b).map_err(|_| RecordsError::Malformed { index: 0 })?;
    let end = h.total_size().min(b.len());
    let data = codec::decompress(h.compression(), &b[HEADER_LEN.min(end)..end])?;
    let expected = h.records_count();
    let mut records = Vec::with_capacity(expected.max(0) as usize);
    let mut pos = 0usize;
    while pos < data.len() {
        let index = records.len();
        let bad = || RecordsError::Malformed { index };
        let start = pos;
        let len =
            usize::try_from(get_varint(&data, &mut pos).ok_or_else(bad)?).map_err(|_| bad())?;
        let rec_end = pos
            .checked_add(len)
            .filter(|e| *e <= data.len())
            .ok_or_else(bad)?;
        let body = &data[..rec_end];
        let mut p = pos + 1; // attributes
        let timestamp_delta = get_varint(body, &mut p).ok_or_else(bad)?;
        let offset_delta = get_varint(body, &mut p).ok_or_else(bad)?;
        let field = |p: &mut usize| -> Result<Option<Range<usize>>, RecordsError> {
            let n = get_varint(body, p).ok_or_else(bad)?;
            if n < 0 {
                return Ok(None);
            }
            let n = usize::try_from(n).map_err(|_| bad())?;
            let r = *p..p.checked_add(n).filter(|e| *e <= rec_end).ok_or_else(bad)?;
            *p = r.end;
            Ok(Some(r))
        };
        let key = field(&mut p)?;
        let value = field(&mut p)?;
        records.push(RecordSpan {
            bytes: start..rec_end,
            timestamp_delta,
            offset_delta,
            key,
            value,
        });
        pos = rec_end;
    }
    if records.len() != expected.max(0) as usize {
        return Err(RecordsError::Count {
            expected,
            found: records.len(),
        });
    }
    Ok(BatchRecords { data, records })
}

/// A copy of batch `orig` that holds only `kept` (spans of `recs`), with the
/// same base offset, last offset delta, timestamps, producer fields and
/// codec, so offsets and sequences stay as they were. With nothing kept the
/// batch is empty and uncompressed (it still carries the producer's
/// sequence range). The CRC is computed anew.
pub fn rebuild(
    orig: &[u8],
    recs: &BatchRecords,
    kept: &[&RecordSpan],
) -> Result<Vec<u8>, CodecError> {
    let mut attributes = i16::from_be_bytes([orig[21], orig[22]]);
    let mut plain = Vec::new();
    for r in kept {
        plain.extend_from_slice(&recs.data[r.bytes.clone()]);
    }
    let codec = attributes & batch::ATTR_COMPRESSION_MASK;
    let body = if kept.is_empty() {
        attributes &= !batch::ATTR_COMPRESSION_MASK;
        Vec::new()
    } else {
        codec::compress(codec, &plain)?
    };
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&orig[..HEADER_LEN]);
    out.extend_from_slice(&body);
    let length = (out.len() - LOG_OVERHEAD) as i32;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    out[21..23].copy_from_slice(&attributes.to_be_bytes());
    out[57..61].copy_from_slice(&(kept.len() as i32).to_be_bytes());
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{validate, BatchBuilder};

    fn sample(codec: i16) -> Vec<u8> {
        let plain = BatchBuilder::new(1000)
            .record(0, Some(b"a"), Some(b"1"))
            .record(1, None, Some(b"2"))
            .record(2, Some(b"c"), None)
            .build();
        if codec == 0 {
            return plain;
        }
        let recs = batch_records(&plain).unwrap();
        let all: Vec<&RecordSpan> = recs.records.iter().collect();
        let mut b = plain.clone();
        b[21..23].copy_from_slice(&codec.to_be_bytes());
        rebuild(&b, &recs, &all).unwrap()
    }

    #[test]
    fn records_of_every_codec_decode() {
        for codec in [0, 1, 2, 3, 4] {
            let b = sample(codec);
            validate(&b).unwrap();
            let r = batch_records(&b).unwrap();
            assert_eq!(r.records.len(), 3);
            assert_eq!(r.key(&r.records[0]), Some(&b"a"[..]));
            assert_eq!(r.key(&r.records[1]), None);
            assert!(r.records[2].is_tombstone() && !r.records[0].is_tombstone());
            assert_eq!(r.records[2].offset_delta, 2);
        }
    }

    #[test]
    fn rebuild_keeps_offsets_and_codec() {
        for codec in [0, 1, 2, 3, 4] {
            let mut b = sample(codec);
            batch::set_base_offset(&mut b, 500);
            let r = batch_records(&b).unwrap();
            let out = rebuild(&b, &r, &[&r.records[2]]).unwrap();
            let h = validate(&out).unwrap();
            assert_eq!(
                (h.base_offset(), h.last_offset(), h.records_count()),
                (500, 502, 1)
            );
            assert_eq!(h.compression(), codec);
            let again = batch_records(&out).unwrap();
            assert_eq!(again.records[0].offset_delta, 2);
            let empty = rebuild(&b, &r, &[]).unwrap();
            let h = validate(&empty).unwrap();
            assert_eq!(
                (h.records_count(), h.last_offset(), h.compression()),
                (0, 502, 0)
            );
        }
    }

    #[test]
    fn malformed_records_are_errors() {
        let b = sample(0);
        let mut cut = b.clone();
        cut.truncate(b.len() - 2);
        let len = (cut.len() - LOG_OVERHEAD) as i32;
        cut[8..12].copy_from_slice(&len.to_be_bytes());
        assert!(batch_records(&cut).is_err());
    }
}
