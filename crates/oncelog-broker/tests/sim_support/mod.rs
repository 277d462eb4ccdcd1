//! What both simulations use: a seeded generator and what a
//! read_committed reader sees of a partition.

use oncelog_broker::machines::producer_state::ProducerState;

/// splitmix64: small, deterministic, good enough for schedules.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// What a read_committed fetch returns of a log whose first `hw` entries
/// are synced: the values below the LSO outside every aborted
/// transaction's range. `data` gives an entry's (producer id, value), or
/// `None` for a marker.
pub fn read_committed<E>(
    entries: &[E],
    state: &ProducerState,
    hw: usize,
    data: impl Fn(&E) -> Option<(i64, u64)>,
) -> Vec<u64> {
    let lso = state.last_stable_offset(hw as i64) as usize;
    let aborted = state.aborted_overlapping(0, lso as i64);
    entries[..lso]
        .iter()
        .enumerate()
        .filter_map(|(o, e)| {
            let (pid, value) = data(e)?;
            let o = o as i64;
            let skipped = aborted
                .iter()
                .any(|a| a.producer_id == pid && a.first_offset <= o && o <= a.last_offset);
            (!skipped).then_some(value)
        })
        .collect()
}
