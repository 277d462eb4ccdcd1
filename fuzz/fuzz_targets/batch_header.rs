//! Arbitrary bytes through the batch-header view (`oncelog_log::batch`):
//! `validate`, `validate_client_batch`, the batch iterator, `records`,
//! `control_record`, and the broker's replay of a batch into producer state.
//! Each input is checked as it is and with its batches' CRCs recomputed, so
//! mutations also reach the checks behind the CRC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncelog_broker::machines::producer_state::ProducerState;
use oncelog_log::batch::{self, BatchHeader, BatchIter, HEADER_LEN};

fn touch(h: &BatchHeader<'_>) {
    let _ = format!("{h:?}");
    let _ = (
        h.base_offset(),
        h.length(),
        h.total_size(),
        h.partition_leader_epoch(),
        h.magic(),
        h.crc(),
        h.compression(),
        h.is_transactional(),
        h.is_control(),
        h.last_offset(),
        h.next_offset(),
        h.base_timestamp(),
        h.max_timestamp(),
        h.producer_epoch(),
        h.last_sequence(),
    );
}

fuzz_target!(|data: &[u8]| {
    check(data);
    check(&oncelog_fuzz::fix_crcs(data));
});

fn check(data: &[u8]) {
    if let Ok(h) = BatchHeader::new(data) {
        touch(&h);
    }
    if let Ok(h) = batch::validate(data) {
        touch(&h);
        let total = h.total_size();
        assert!((HEADER_LEN..=data.len()).contains(&total));
        // The base offset and leader epoch are outside the CRC: patching them
        // keeps the batch valid.
        let mut copy = data[..total].to_vec();
        batch::set_base_offset(&mut copy, !h.base_offset());
        batch::set_partition_leader_epoch(&mut copy, 7);
        let v = batch::validate(&copy).expect("patched batch no longer valid");
        assert_eq!(v.base_offset(), !h.base_offset());
    }
    if let Ok(h) = batch::validate_client_batch(data) {
        assert!(h.records_count() >= 1);
        assert_eq!(h.last_offset_delta(), h.records_count() - 1);
    }
    let mut end = 0;
    for item in BatchIter::new(data) {
        match item {
            Ok((pos, h)) => {
                assert_eq!(pos, end, "batches are not contiguous");
                end = pos + h.total_size();
                assert!(end <= data.len());
                batch::validate(&data[pos..end]).expect("iterated batch does not validate");
            }
            Err(_) => break,
        }
    }
    if let (Some(r), Ok(h)) = (batch::records(data), batch::validate(data)) {
        assert_eq!(r.len() as i64, h.records_count() as i64);
    }
    let _ = batch::control_record(data);
    let mut st = ProducerState::new();
    oncelog_broker::backend::local::topics::replay_batch(&mut st, data);
    let _ = st.first_unstable_offset();
}
