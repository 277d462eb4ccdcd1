//! How `oncelog consume` prints a record: value, kv, json, hex or base64.

use std::io::Write;

use bytes::Bytes;
use kafka_protocol::records::Record;
use serde_json::{json, Value};

fn text(b: &Option<Bytes>) -> Value {
    match b {
        Some(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        None => Value::Null,
    }
}

fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(b.len() * 2);
    for x in b {
        out.push(DIGITS[(x >> 4) as usize] as char);
        out.push(DIGITS[(x & 15) as usize] as char);
    }
    out
}

/// Standard base64 (RFC 4648, with padding).
fn base64(b: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = match *chunk {
            [a] => (a as u32) << 16,
            [a, b] => (a as u32) << 16 | (b as u32) << 8,
            [a, b, c] => (a as u32) << 16 | (b as u32) << 8 | c as u32,
            _ => 0,
        };
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub(super) const FORMATS: &[&str] = &["value", "kv", "json", "hex", "base64"];

pub(super) fn write_record(
    out: &mut impl Write,
    format: &str,
    topic: &str,
    p: i32,
    r: &Record,
) -> std::io::Result<()> {
    let value = r.value.as_deref().unwrap_or_default();
    match format {
        "json" => {
            let headers: serde_json::Map<String, Value> = r
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), text(v)))
                .collect();
            let v = json!({"topic": topic, "partition": p, "offset": r.offset, "timestamp": r.timestamp,
                "key": text(&r.key), "value": text(&r.value), "headers": headers});
            writeln!(out, "{v}")?;
        }
        "kv" => {
            if let Some(k) = &r.key {
                out.write_all(k)?;
            }
            out.write_all(b"\t")?;
            out.write_all(value)?;
            out.write_all(b"\n")?;
        }
        "hex" => writeln!(out, "{}", hex(value))?,
        "base64" => writeln!(out, "{}", base64(value))?,
        _ => {
            out.write_all(value)?;
            out.write_all(b"\n")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_base64_encode_values() {
        assert_eq!(hex(b""), "");
        assert_eq!(hex(b"\x00\xffA"), "00ff41");
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
            (b"\xff\xfe\xfd", "//79"),
        ] {
            assert_eq!(base64(raw), enc);
        }
    }

    #[test]
    fn records_print_in_every_format() {
        let mut headers = kafka_protocol::indexmap::IndexMap::new();
        headers.insert(
            kafka_protocol::protocol::StrBytes::from_static_str("n"),
            Some(Bytes::from_static(b"1")),
        );
        let r = Record {
            transactional: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset: 7,
            sequence: -1,
            timestamp: 1_000,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v\x00")),
            headers,
            delete_horizon: false,
        };
        let out = |format: &str| {
            let mut b = Vec::new();
            write_record(&mut b, format, "t", 2, &r).unwrap();
            b
        };
        assert_eq!(out("value"), b"v\x00\n");
        assert_eq!(out("kv"), b"k\tv\x00\n");
        assert_eq!(out("hex"), b"7600\n");
        assert_eq!(out("base64"), b"dgA=\n");
        let json: Value = serde_json::from_slice(&out("json")).unwrap();
        assert_eq!(
            json,
            json!({"topic": "t", "partition": 2, "offset": 7, "timestamp": 1_000,
                "key": "k", "value": "v\u{0}", "headers": {"n": "1"}})
        );
    }
}
