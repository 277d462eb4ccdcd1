//! Where a partition's leader and a coordinator are placed among the live
//! brokers: rendezvous hashing, computed alike by every broker from the same
//! live list (Metadata and FindCoordinator in both modes; local mode has
//! one broker).

/// The broker that Metadata names for `(topic id, partition)` among `live`
/// broker ids: rendezvous hashing, so every broker computes the same answer
/// from the same live list and a broker's loss moves only its partitions.
pub fn preferred_broker(topic_id: &uuid::Uuid, partition: i32, live: &[i32]) -> Option<i32> {
    live.iter()
        .copied()
        .max_by_key(|b| rendezvous_weight(topic_id.as_bytes(), partition, *b))
}

/// The live broker rendezvous hashing picks for `key` (a transactional id).
pub fn rendezvous(key: &[u8], live: &[i32]) -> Option<i32> {
    live.iter()
        .copied()
        .max_by_key(|b| rendezvous_weight(key, -1, *b))
}

fn rendezvous_weight(key: &[u8], partition: i32, broker: i32) -> u64 {
    // FNV-1a over the key, the partition and the broker, then a final mix:
    // stable across builds and machines (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key
        .iter()
        .chain(partition.to_be_bytes().iter())
        .chain(broker.to_be_bytes().iter())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_broker_is_stable_and_moves_only_the_lost_brokers_partitions() {
        let t = uuid::Uuid::from_u128(42);
        let all = [1, 2, 3];
        let before: Vec<i32> = (0..300)
            .map(|p| preferred_broker(&t, p, &all).unwrap())
            .collect();
        for b in all {
            let n = before.iter().filter(|x| **x == b).count();
            assert!((60..=140).contains(&n), "broker {b} got {n} of 300");
        }
        let after: Vec<i32> = (0..300)
            .map(|p| preferred_broker(&t, p, &[1, 3]).unwrap())
            .collect();
        for (b, a) in before.iter().zip(&after) {
            if *b != 2 {
                assert_eq!(b, a, "a partition of a live broker moved");
            }
        }
        assert_eq!(preferred_broker(&t, 0, &[]), None);
    }
}
