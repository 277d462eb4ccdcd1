//! A request frame (without its length prefix) through the broker's decode
//! path (`oncelog_broker::protocol::decode_request`, what `dispatch` runs
//! before any handler): API/version checks, the request header and the body
//! via kafka-protocol. Produce bodies then go through the same batch checks
//! as the produce handler.
//!
//! kafka-protocol pre-sizes arrays from their declared counts, so a short
//! frame can ask for a huge allocation. The broker binary survives that with
//! its global allocator guard; this target uses the same guard (feature
//! `alloc-guard`, on by default). Without it, expect "memory allocation of N
//! bytes failed" aborts: `cargo fuzz run -s none request_decode --no-default-features`.
#![no_main]

use bytes::Bytes;
use kafka_protocol::messages::RequestKind;
use libfuzzer_sys::fuzz_target;
use oncelog_broker::protocol::{decode_request, supported_range, Decoded};
use oncelog_log::batch;

#[cfg(feature = "alloc-guard")]
#[path = "../../crates/oncelog/src/alloc_guard.rs"]
mod alloc_guard;

#[cfg(feature = "alloc-guard")]
#[global_allocator]
static GLOBAL: alloc_guard::Guard = alloc_guard::Guard;

fuzz_target!(|data: &[u8]| {
    match decode_request(Bytes::copy_from_slice(data)) {
        Ok(Decoded::ApiVersionsFallback { version, .. }) => {
            let (lo, hi) = supported_range(kafka_protocol::messages::ApiKey::ApiVersions).unwrap();
            assert!(!(lo..=hi).contains(&version));
        }
        Ok(Decoded::Request(r)) => {
            let (lo, hi) = supported_range(r.key).expect("decoded an unsupported API");
            assert!((lo..=hi).contains(&r.version));
            assert_eq!(r.header.request_api_key, r.key as i16);
            assert_eq!(r.header.request_api_version, r.version);
            assert_eq!(r.header.correlation_id, r.correlation_id);
            if let RequestKind::Produce(p) = &r.body {
                for t in &p.topic_data {
                    for pd in &t.partition_data {
                        let Some(records) = &pd.records else { continue };
                        if let Ok(h) = batch::validate_client_batch(records) {
                            assert!(h.total_size() <= records.len());
                            let _ = oncelog_broker::backend::local::topics::producer_batch(&h);
                        }
                    }
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
