//! Business-key uniqueness: a key committed twice is a doubled record (the
//! seed's doubled revenue), whoever wrote it. The first writer of each key
//! is kept for a window, in bounded memory; a second one is returned with
//! the first, so both can be named.
//!
//! Keys are held as 128-bit hashes (two SipHash-1-3 with fixed keys): 32
//! bytes of index per key plus its writer. When `max_keys` are held the
//! oldest are forgotten first: then keys first written before
//! [`Unique::covered_since`] are no longer checked.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

/// Which part of a record is its business key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// The record's key.
    RecordKey,
    /// A JSON pointer (RFC 6901) into the record's value, e.g. `/order_id`.
    Pointer(String),
}

impl KeySpec {
    /// `record-key`, or a JSON pointer (starting with `/`).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "record-key" => Ok(KeySpec::RecordKey),
            p if p.starts_with('/') => Ok(KeySpec::Pointer(p.to_string())),
            _ => Err(format!(
                "{text:?} is neither record-key nor a JSON pointer such as /order_id"
            )),
        }
    }

    /// The key of a record (`None`: it has none, e.g. the value is not
    /// JSON or lacks the field). A JSON string is its text, any other JSON
    /// value its compact serialisation.
    pub fn key_of(&self, key: Option<&[u8]>, value: Option<&[u8]>) -> Option<Vec<u8>> {
        match self {
            KeySpec::RecordKey => key.map(<[u8]>::to_vec),
            KeySpec::Pointer(p) => {
                let v: serde_json::Value = serde_json::from_slice(value?).ok()?;
                match v.pointer(p)? {
                    serde_json::Value::String(s) => Some(s.as_bytes().to_vec()),
                    serde_json::Value::Null => None,
                    other => Some(other.to_string().into_bytes()),
                }
            }
        }
    }
}

impl KeySpec {
    /// The hash of a record's key ([`hash_key`] of [`KeySpec::key_of`]),
    /// without copying a record key.
    pub fn hash_of(&self, key: Option<&[u8]>, value: Option<&[u8]>) -> Option<u128> {
        match self {
            KeySpec::RecordKey => key.map(hash_key),
            KeySpec::Pointer(_) => self.key_of(key, value).map(|k| hash_key(&k)),
        }
    }
}

/// The index's hasher: its keys are hashes already, so their low 64 bits
/// are taken as they are.
#[derive(Default, Clone, Copy)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // not used by u128 keys; folded in for completeness
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

type Index = HashMap<u128, u64, std::hash::BuildHasherDefault<Prehashed>>;

/// A key's 128-bit hash.
pub fn hash_key(key: &[u8]) -> u128 {
    let half = |salt: u8| {
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new_with_keys(0x6f6e_6365_6c6f_6721, salt as u64);
        key.hash(&mut h);
        h.finish()
    };
    ((half(1) as u128) << 64) | half(2) as u128
}

/// The first writer of each key within a window, in bounded memory.
#[derive(Debug)]
pub struct Unique<W> {
    window_ms: i64,
    max_keys: usize,
    /// (hash, when, writer), oldest first.
    order: VecDeque<(u128, i64, W)>,
    /// hash → its entry's sequence number (`first_seq` + index in `order`).
    index: Index,
    first_seq: u64,
    /// Keys forgotten because the index was full.
    pub evicted: u64,
}

impl<W> Unique<W> {
    pub fn new(window_ms: i64, max_keys: usize) -> Self {
        Self {
            window_ms,
            max_keys: max_keys.max(1),
            order: VecDeque::new(),
            index: Index::default(),
            first_seq: 0,
            evicted: 0,
        }
    }

    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// Changes the bound (the oldest keys go first when it shrinks).
    pub fn set_max_keys(&mut self, max_keys: usize) {
        self.max_keys = max_keys.max(1);
        while self.order.len() > self.max_keys {
            self.pop();
            self.evicted += 1;
        }
    }

    /// Notes `key`'s writer `w` at `now`: the first writer when the key
    /// was already written within the window (which stays the first), else
    /// `None`.
    pub fn insert(&mut self, key: u128, now: i64, w: W) -> Option<&W> {
        self.expire(now);
        if let Some(&seq) = self.index.get(&key) {
            let i = (seq - self.first_seq) as usize;
            return self.order.get(i).map(|e| &e.2);
        }
        while self.order.len() >= self.max_keys {
            self.pop();
            self.evicted += 1;
        }
        self.index
            .insert(key, self.first_seq + self.order.len() as u64);
        self.order.push_back((key, now, w));
        None
    }

    /// Forgets what fell out of the window.
    pub fn expire(&mut self, now: i64) {
        while self
            .order
            .front()
            .is_some_and(|e| e.1 < now.saturating_sub(self.window_ms))
        {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some((key, _, _)) = self.order.pop_front() {
            if self.index.get(&key) == Some(&self.first_seq) {
                self.index.remove(&key);
            }
            self.first_seq += 1;
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Since when every key is checked: the window's start, or later when
    /// the index was full and forgot older keys (`None`: nothing held).
    pub fn covered_since(&self, now: i64) -> i64 {
        let window_start = now.saturating_sub(self.window_ms);
        match self.order.front() {
            Some(e) if self.evicted > 0 => e.1.max(window_start),
            _ => window_start,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_of_a_key_is_returned_with_the_first() {
        let mut u = Unique::new(1_000, 10);
        assert!(u.insert(hash_key(b"o-1"), 0, "v1").is_none());
        assert!(u.insert(hash_key(b"o-2"), 1, "v1").is_none());
        assert_eq!(u.insert(hash_key(b"o-1"), 2, "v2"), Some(&"v1"));
        assert_eq!(u.insert(hash_key(b"o-1"), 3, "v3"), Some(&"v1"));
        assert_eq!(u.len(), 2);
    }

    #[test]
    fn keys_older_than_the_window_are_forgotten() {
        let mut u = Unique::new(100, 10);
        u.insert(hash_key(b"a"), 0, 1);
        assert!(u.insert(hash_key(b"a"), 100, 2).is_some());
        assert!(u.insert(hash_key(b"a"), 101, 3).is_none());
        assert_eq!(u.covered_since(101), 1);
    }

    #[test]
    fn a_full_index_forgets_the_oldest_and_says_what_is_covered() {
        let mut u = Unique::new(1_000_000, 3);
        for (i, k) in [b"a", b"b", b"c", b"d"].iter().enumerate() {
            u.insert(hash_key(*k), i as i64 * 10, i);
        }
        assert_eq!((u.len(), u.evicted), (3, 1));
        assert_eq!(u.covered_since(40), 10);
        assert!(u.insert(hash_key(b"a"), 50, 9).is_none(), "a was forgotten");
        assert!(u.insert(hash_key(b"c"), 50, 9).is_some());
    }

    #[test]
    fn keys_come_from_the_record_key_or_a_json_pointer() {
        let k = KeySpec::parse("record-key").unwrap();
        assert_eq!(k.key_of(Some(b"x"), Some(b"{}")), Some(b"x".to_vec()));
        assert_eq!(k.key_of(None, Some(b"{}")), None);
        let p = KeySpec::parse("/order_id").unwrap();
        assert_eq!(
            p.key_of(None, Some(br#"{"order_id":"o-7","n":1}"#)),
            Some(b"o-7".to_vec())
        );
        assert_eq!(
            p.key_of(None, Some(br#"{"order_id":42}"#)),
            Some(b"42".to_vec())
        );
        assert_eq!(p.key_of(None, Some(br#"{"other":1}"#)), None);
        assert_eq!(p.key_of(None, Some(b"not json")), None);
        let nested = KeySpec::parse("/order/id").unwrap();
        assert_eq!(
            nested.key_of(None, Some(br#"{"order":{"id":"z"}}"#)),
            Some(b"z".to_vec())
        );
        assert!(KeySpec::parse("order_id").is_err());
        assert_ne!(hash_key(b"a"), hash_key(b"b"));
        assert_eq!(k.hash_of(Some(b"x"), None), Some(hash_key(b"x")));
        assert_eq!(
            p.hash_of(None, Some(br#"{"order_id":"o-7"}"#)),
            Some(hash_key(b"o-7"))
        );
    }
}
