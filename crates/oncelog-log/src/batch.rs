//! A zero-allocation view of a Kafka record batch (magic 2) header.
//!
//! The broker never decodes individual records on the produce or fetch path:
//! everything it needs (offsets, timestamps, producer identity, the
//! transactional and control bits, the CRC) lives in the fixed 61-byte header.
//!
//! Layout (big-endian), offsets in bytes from the start of the batch:
//!
//! ```text
//!  0 base_offset i64          8 length i32 (bytes after this field)
//! 12 partition_leader_epoch   16 magic i8 (= 2)     17 crc u32 (CRC-32C of 21..end)
//! 21 attributes i16          23 last_offset_delta i32
//! 27 base_timestamp i64      35 max_timestamp i64
//! 43 producer_id i64         51 producer_epoch i16  53 base_sequence i32
//! 57 records_count i32       61 records...
//! ```
//!
//! The CRC does not cover the base offset, the length, or the partition leader
//! epoch, so the broker may patch those without recomputing it.

use thiserror::Error;

/// Size of the fixed batch header.
pub const HEADER_LEN: usize = 61;
/// Bytes before the `length` field's coverage starts (base offset + length).
pub const LOG_OVERHEAD: usize = 12;
/// Smallest legal value of the `length` field (header minus the overhead).
pub const MIN_LENGTH_FIELD: i32 = (HEADER_LEN - LOG_OVERHEAD) as i32;

const OFF_BASE_OFFSET: usize = 0;
const OFF_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_BASE_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORDS_COUNT: usize = 57;

/// Attribute bits.
pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
pub const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
pub const ATTR_CONTROL: i16 = 0x20;

/// Why a byte range is not a valid record batch.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum BatchError {
    #[error("batch truncated: {have} bytes available, {need} needed")]
    Truncated { have: usize, need: usize },
    #[error("invalid batch length field {0}")]
    BadLength(i32),
    #[error("unsupported magic {0} (only magic 2 is accepted)")]
    BadMagic(i8),
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("inconsistent record count {count} with last offset delta {delta}")]
    BadOffsetDelta { count: i32, delta: i32 },
    #[error("unknown compression codec {0}")]
    BadCompression(i16),
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// A read-only view of a batch header. Holds at least [`HEADER_LEN`] bytes.
#[derive(Clone, Copy)]
pub struct BatchHeader<'a> {
    buf: &'a [u8],
}

impl std::fmt::Debug for BatchHeader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchHeader")
            .field("base_offset", &self.base_offset())
            .field("length", &self.length())
            .field("last_offset_delta", &self.last_offset_delta())
            .field("records", &self.records_count())
            .field("producer_id", &self.producer_id())
            .field("attributes", &self.attributes())
            .finish()
    }
}

impl<'a> BatchHeader<'a> {
    /// Views the first [`HEADER_LEN`] bytes of `buf` as a header; checks only the size.
    pub fn new(buf: &'a [u8]) -> Result<Self, BatchError> {
        if buf.len() < HEADER_LEN {
            return Err(BatchError::Truncated {
                have: buf.len(),
                need: HEADER_LEN,
            });
        }
        Ok(Self { buf })
    }

    pub fn base_offset(&self) -> i64 {
        be_i64(self.buf, OFF_BASE_OFFSET)
    }
    pub fn length(&self) -> i32 {
        be_i32(self.buf, OFF_LENGTH)
    }
    /// The whole batch size in bytes, including base offset and length fields.
    pub fn total_size(&self) -> usize {
        LOG_OVERHEAD + self.length().max(0) as usize
    }
    pub fn partition_leader_epoch(&self) -> i32 {
        be_i32(self.buf, OFF_LEADER_EPOCH)
    }
    pub fn magic(&self) -> i8 {
        self.buf[OFF_MAGIC] as i8
    }
    pub fn crc(&self) -> u32 {
        be_i32(self.buf, OFF_CRC) as u32
    }
    pub fn attributes(&self) -> i16 {
        be_i16(self.buf, OFF_ATTRIBUTES)
    }
    pub fn compression(&self) -> i16 {
        self.attributes() & ATTR_COMPRESSION_MASK
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & ATTR_CONTROL != 0
    }
    pub fn last_offset_delta(&self) -> i32 {
        be_i32(self.buf, OFF_LAST_OFFSET_DELTA)
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset()
            .wrapping_add(self.last_offset_delta() as i64)
    }
    /// The offset right after this batch.
    pub fn next_offset(&self) -> i64 {
        self.last_offset().wrapping_add(1)
    }
    pub fn base_timestamp(&self) -> i64 {
        be_i64(self.buf, OFF_BASE_TIMESTAMP)
    }
    pub fn max_timestamp(&self) -> i64 {
        be_i64(self.buf, OFF_MAX_TIMESTAMP)
    }
    pub fn producer_id(&self) -> i64 {
        be_i64(self.buf, OFF_PRODUCER_ID)
    }
    pub fn producer_epoch(&self) -> i16 {
        be_i16(self.buf, OFF_PRODUCER_EPOCH)
    }
    pub fn base_sequence(&self) -> i32 {
        be_i32(self.buf, OFF_BASE_SEQUENCE)
    }
    /// Last sequence of the batch, wrapping at `i32::MAX` as Kafka does.
    pub fn last_sequence(&self) -> i32 {
        let base = self.base_sequence();
        if base < 0 {
            return -1;
        }
        let last = base as i64 + self.last_offset_delta() as i64;
        if last > i32::MAX as i64 {
            (last - i32::MAX as i64 - 1) as i32
        } else {
            last as i32
        }
    }
    pub fn records_count(&self) -> i32 {
        be_i32(self.buf, OFF_RECORDS_COUNT)
    }
}

/// Checks everything the header alone can prove about one whole batch in
/// `buf` (which must be exactly the batch): length, magic, CRC-32C, the
/// records count against the last offset delta, and the codec.
pub fn validate(buf: &[u8]) -> Result<BatchHeader<'_>, BatchError> {
    let h = BatchHeader::new(buf)?;
    let len = h.length();
    if len < MIN_LENGTH_FIELD {
        return Err(BatchError::BadLength(len));
    }
    let total = LOG_OVERHEAD as u64 + len as u64;
    if (buf.len() as u64) < total {
        return Err(BatchError::Truncated {
            have: buf.len(),
            need: total as usize,
        });
    }
    if h.magic() != 2 {
        return Err(BatchError::BadMagic(h.magic()));
    }
    let computed = crc32c::crc32c(&buf[OFF_ATTRIBUTES..total as usize]);
    if computed != h.crc() {
        return Err(BatchError::BadCrc {
            stored: h.crc(),
            computed,
        });
    }
    let count = h.records_count();
    let delta = h.last_offset_delta();
    // Compaction may leave empty batches (count 0) that keep their offsets.
    if count < 0 || delta < 0 || (count > 0 && delta < count - 1) {
        return Err(BatchError::BadOffsetDelta { count, delta });
    }
    if h.compression() > 4 {
        return Err(BatchError::BadCompression(h.compression()));
    }
    Ok(h)
}

/// Stricter checks for a batch written by a client: it must not be empty
/// and its offsets must be dense (`last_offset_delta == records_count - 1`).
pub fn validate_client_batch(buf: &[u8]) -> Result<BatchHeader<'_>, BatchError> {
    let h = validate(buf)?;
    let (count, delta) = (h.records_count(), h.last_offset_delta());
    if count < 1 || delta != count - 1 {
        return Err(BatchError::BadOffsetDelta { count, delta });
    }
    Ok(h)
}

/// Overwrites the base offset (not covered by the CRC).
pub fn set_base_offset(buf: &mut [u8], offset: i64) {
    buf[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&offset.to_be_bytes());
}

/// Stamps a whole batch with the broker's time (`message.timestamp.type=
/// LogAppendTime`): the timestamp-type bit and the max timestamp change,
/// so the CRC is computed anew.
pub fn set_log_append_time(buf: &mut [u8], now_ms: i64) {
    let attrs = be_i16(buf, OFF_ATTRIBUTES) | ATTR_TIMESTAMP_TYPE;
    buf[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
    buf[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
    let end = BatchHeader { buf }.total_size().min(buf.len());
    let crc = crc32c::crc32c(&buf[OFF_ATTRIBUTES..end]);
    buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Overwrites the partition leader epoch (not covered by the CRC).
pub fn set_partition_leader_epoch(buf: &mut [u8], epoch: i32) {
    buf[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Splits a buffer holding consecutive batches into whole batches, each
/// validated. Stops with an error at the first invalid or partial batch.
pub struct BatchIter<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> BatchIter<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    /// Byte position of the next batch to be returned.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl<'a> Iterator for BatchIter<'a> {
    /// (position of the batch within the buffer, its header view)
    type Item = Result<(usize, BatchHeader<'a>), BatchError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        match validate(rest) {
            Ok(h) => {
                let at = self.pos;
                self.pos += h.total_size();
                Some(Ok((at, BatchHeader { buf: rest })))
            }
            Err(e) => {
                self.pos = self.buf.len();
                Some(Err(e))
            }
        }
    }
}

/// Reads a zigzag varint at `pos`, moving `pos` past it.
pub(crate) fn get_varint(b: &[u8], pos: &mut usize) -> Option<i64> {
    let mut v: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
    Some(((v >> 1) as i64) ^ -((v & 1) as i64))
}

/// A record's key and value.
pub type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// The (key, value) of every record in an uncompressed batch, for internal
/// logs (never used on the produce or fetch path). `None` if the batch is
/// compressed or malformed.
pub fn records(b: &[u8]) -> Option<Vec<KeyValue<'_>>> {
    let h = BatchHeader::new(b).ok()?;
    if h.compression() != 0 {
        return None;
    }
    let end = h.total_size().min(b.len());
    let mut pos = HEADER_LEN;
    let mut out = Vec::new();
    for _ in 0..h.records_count() {
        let len = usize::try_from(get_varint(b, &mut pos)?).ok()?;
        let rec_end = pos.checked_add(len)?;
        if rec_end > end {
            return None;
        }
        let mut p = pos + 1;
        get_varint(b, &mut p)?; // timestamp delta
        get_varint(b, &mut p)?; // offset delta
        let field = |p: &mut usize| -> Option<Option<&[u8]>> {
            let n = get_varint(b, p)?;
            if n < 0 {
                return Some(None);
            }
            let n = usize::try_from(n).ok()?;
            let s = b.get(*p..p.checked_add(n)?)?;
            *p += n;
            Some(Some(s))
        };
        let key = field(&mut p)?;
        let value = field(&mut p)?;
        out.push((key, value));
        pos = rec_end;
    }
    Some(out)
}

/// Control record types.
pub const CONTROL_ABORT: i16 = 0;
pub const CONTROL_COMMIT: i16 = 1;

/// For a whole control batch: its record's (type, coordinator epoch).
/// Types 0 = ABORT and 1 = COMMIT are transaction markers; others (KRaft's)
/// are returned as they are, for the caller to ignore. The value's
/// coordinator epoch is -1 when the record has none.
pub fn control_record(b: &[u8]) -> Option<(i16, i32)> {
    let h = BatchHeader::new(b).ok()?;
    if !h.is_control() || h.records_count() < 1 {
        return None;
    }
    let mut pos = HEADER_LEN;
    let _len = get_varint(b, &mut pos)?;
    pos += 1; // attributes
    let _ts = get_varint(b, &mut pos)?;
    let _od = get_varint(b, &mut pos)?;
    let klen = usize::try_from(get_varint(b, &mut pos)?).ok()?;
    let key = b.get(pos..pos.checked_add(klen)?)?;
    pos += klen;
    if key.len() < 4 {
        return None;
    }
    let ty = i16::from_be_bytes([key[2], key[3]]);
    let vlen = get_varint(b, &mut pos)?;
    let mut coordinator_epoch = -1;
    if vlen >= 6 {
        let v = b.get(pos..pos + 6)?;
        coordinator_epoch = i32::from_be_bytes([v[2], v[3], v[4], v[5]]);
    }
    Some((ty, coordinator_epoch))
}

/// Builds a transaction marker: a control batch holding one record whose
/// key is (version 0, type) and value (version 0, coordinator epoch).
pub fn build_marker(
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp: i64,
) -> Vec<u8> {
    let ty = if commit {
        CONTROL_COMMIT
    } else {
        CONTROL_ABORT
    };
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&ty.to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    let mut b = BatchBuilder::new(timestamp).record(0, Some(&key), Some(&value));
    b.attributes = ATTR_TRANSACTIONAL | ATTR_CONTROL;
    b.producer_id = producer_id;
    b.producer_epoch = producer_epoch;
    b.base_sequence = -1;
    b.build()
}

/// Builds batches for tests and internal records. Not used on the hot path.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    pub base_offset: i64,
    pub attributes: i16,
    pub base_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    records: Vec<u8>,
    count: i32,
    max_ts_delta: i64,
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

impl BatchBuilder {
    pub fn new(base_timestamp: i64) -> Self {
        Self {
            base_offset: 0,
            attributes: 0,
            base_timestamp,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            records: Vec::new(),
            count: 0,
            max_ts_delta: 0,
        }
    }

    /// Appends one record (no headers) with the given timestamp delta.
    pub fn record(mut self, ts_delta: i64, key: Option<&[u8]>, value: Option<&[u8]>) -> Self {
        let mut body = Vec::new();
        body.push(0u8); // record attributes
        put_varint(&mut body, ts_delta);
        put_varint(&mut body, self.count as i64);
        match key {
            Some(k) => {
                put_varint(&mut body, k.len() as i64);
                body.extend_from_slice(k);
            }
            None => put_varint(&mut body, -1),
        }
        match value {
            Some(v) => {
                put_varint(&mut body, v.len() as i64);
                body.extend_from_slice(v);
            }
            None => put_varint(&mut body, -1),
        }
        put_varint(&mut body, 0); // headers
        put_varint(&mut self.records, body.len() as i64);
        self.records.extend_from_slice(&body);
        self.count += 1;
        self.max_ts_delta = self.max_ts_delta.max(ts_delta);
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN + self.records.len());
        b.extend_from_slice(&self.base_offset.to_be_bytes());
        let length = (HEADER_LEN - LOG_OVERHEAD + self.records.len()) as i32;
        b.extend_from_slice(&length.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes());
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&self.attributes.to_be_bytes());
        b.extend_from_slice(&(self.count - 1).max(0).to_be_bytes());
        b.extend_from_slice(&self.base_timestamp.to_be_bytes());
        b.extend_from_slice(&(self.base_timestamp + self.max_ts_delta).to_be_bytes());
        b.extend_from_slice(&self.producer_id.to_be_bytes());
        b.extend_from_slice(&self.producer_epoch.to_be_bytes());
        b.extend_from_slice(&self.base_sequence.to_be_bytes());
        b.extend_from_slice(&self.count.to_be_bytes());
        b.extend_from_slice(&self.records);
        let crc = crc32c::crc32c(&b[OFF_ATTRIBUTES..]);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn built_batch_validates() {
        let b = BatchBuilder::new(1000)
            .record(0, Some(b"k"), Some(b"v"))
            .record(5, None, Some(b"w"))
            .build();
        let h = validate_client_batch(&b).unwrap();
        assert_eq!(h.records_count(), 2);
        assert_eq!(h.last_offset_delta(), 1);
        assert_eq!(h.max_timestamp(), 1005);
        assert_eq!(h.total_size(), b.len());
    }

    #[test]
    fn flipped_byte_fails_crc() {
        let mut b = BatchBuilder::new(1).record(0, None, Some(b"hello")).build();
        let n = b.len();
        b[n - 3] ^= 0x40;
        assert!(matches!(validate(&b), Err(BatchError::BadCrc { .. })));
    }

    #[test]
    fn truncated_batch_is_reported() {
        let b = BatchBuilder::new(1).record(0, None, Some(b"hello")).build();
        assert!(matches!(
            validate(&b[..b.len() - 1]),
            Err(BatchError::Truncated { .. })
        ));
        assert!(matches!(
            validate(&b[..20]),
            Err(BatchError::Truncated { .. })
        ));
    }

    #[test]
    fn sequence_wraps_at_i32_max() {
        let mut bb = BatchBuilder::new(1);
        bb.producer_id = 7;
        bb.producer_epoch = 0;
        bb.base_sequence = i32::MAX - 1;
        let b = bb
            .record(0, None, None)
            .record(0, None, None)
            .record(0, None, None)
            .build();
        assert_eq!(BatchHeader::new(&b).unwrap().last_sequence(), 0);
    }

    #[test]
    fn records_decode() {
        let b = BatchBuilder::new(5)
            .record(0, Some(b"k1"), Some(b"v1"))
            .record(1, None, Some(b""))
            .record(2, Some(b"k3"), None)
            .build();
        let r = records(&b).unwrap();
        assert_eq!(
            r,
            vec![
                (Some(&b"k1"[..]), Some(&b"v1"[..])),
                (None, Some(&b""[..])),
                (Some(&b"k3"[..]), None)
            ]
        );
        assert!(records(&b[..b.len() - 2]).is_none());
    }

    #[test]
    fn marker_round_trips() {
        let m = build_marker(42, 3, true, 7, 1000);
        let h = validate(&m).unwrap();
        assert!(h.is_control() && h.is_transactional());
        assert_eq!(
            (h.producer_id(), h.producer_epoch(), h.base_sequence()),
            (42, 3, -1)
        );
        assert_eq!(control_record(&m), Some((CONTROL_COMMIT, 7)));
        let a = build_marker(42, 4, false, 8, 1000);
        assert_eq!(control_record(&a), Some((CONTROL_ABORT, 8)));
        assert_eq!(control_record(&a[..a.len() - 3]), None);
    }

    proptest! {
        #[test]
        fn header_fields_round_trip(
            base in any::<i64>(),
            epoch in any::<i32>(),
            pid in any::<i64>(),
            pepoch in any::<i16>(),
            seq in 0..i32::MAX,
            ts in any::<i32>(),
            attrs in 0i16..0x40,
            n in 1usize..20,
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bb = BatchBuilder::new(ts as i64);
            bb.producer_id = pid;
            bb.producer_epoch = pepoch;
            bb.base_sequence = seq;
            bb.attributes = attrs & !ATTR_COMPRESSION_MASK;
            for i in 0..n {
                bb = bb.record(i as i64, Some(&payload), None);
            }
            let mut b = bb.build();
            set_base_offset(&mut b, base);
            set_partition_leader_epoch(&mut b, epoch);
            // Patching the base offset and the leader epoch keeps the CRC valid.
            let h = validate_client_batch(&b).unwrap();
            prop_assert_eq!(h.base_offset(), base);
            prop_assert_eq!(h.partition_leader_epoch(), epoch);
            prop_assert_eq!(h.producer_id(), pid);
            prop_assert_eq!(h.producer_epoch(), pepoch);
            prop_assert_eq!(h.base_sequence(), seq);
            prop_assert_eq!(h.records_count(), n as i32);
            prop_assert_eq!(h.last_offset(), base.wrapping_add(n as i64 - 1));
            prop_assert_eq!(h.base_timestamp(), ts as i64);
            prop_assert_eq!(h.is_transactional(), attrs & ATTR_TRANSACTIONAL != 0);
            prop_assert_eq!(h.is_control(), attrs & ATTR_CONTROL != 0);
            prop_assert_eq!(h.total_size(), b.len());
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            for item in BatchIter::new(&data) {
                let _ = item;
            }
        }
    }
}
