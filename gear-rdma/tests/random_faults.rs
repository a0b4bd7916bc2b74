//! Random batches under random faults (fixed seeds): a ticket always
//! finishes before its deadline, every op reported landed holds the remote
//! bytes, and a batch without faults always succeeds.

mod common;

use std::time::{Duration, Instant};

use common::{buffer, client, connect, pattern, snapshot, Shard};
use gear_core::{Error as CoreError, ReadOp, Transport};
use gear_rdma::verbs::CompletionStatus;
use gear_rdma::{InProcessFabric, RdmaConfig};

/// SplitMix64: a small seeded generator, so cases are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_batches_under_random_faults_finish_and_never_return_wrong_bytes() {
    const REMOTE: usize = 1 << 18;
    let statuses = [CompletionStatus::RetryExceeded, CompletionStatus::RemoteAccessError, CompletionStatus::Flushed];
    let (mut failed_batches, mut retried_batches) = (0, 0);
    for seed in 0..60u64 {
        let mut rng = Rng(seed);
        let fabric = InProcessFabric::new();
        let shard = Shard::new(&fabric, 0, REMOTE);
        let config = RdmaConfig {
            queue_pairs: 1 + rng.below(4) as usize,
            chain_len: 1 + rng.below(32) as usize,
            max_read_bytes: 64 + rng.below(512) as u32,
            ..RdmaConfig::default()
        };
        let transport = client(&fabric, config);
        let remote = connect(&transport, &shard);
        let n = 1 + rng.below(300) as usize;
        let mut reads = Vec::with_capacity(n);
        let mut local_end = 0u64;
        for _ in 0..n {
            let len = 1 + rng.below(1024);
            let remote_offset = rng.below(REMOTE as u64 - len);
            reads.push(ReadOp { remote_offset, local_offset: local_end, len });
            local_end += len;
        }
        let local = buffer(local_end as usize, |_| 0);
        let buffer = transport.register_local(local.clone()).unwrap();

        let faulty = seed % 4 != 0;
        if faulty {
            for qp in transport.live_queue_pairs(&remote) {
                match rng.below(4) {
                    0 => {}
                    1 => transport.verbs().limit_next_post(qp, rng.below(8) as usize).unwrap(),
                    _ => {
                        let status = statuses[rng.below(3) as usize];
                        transport.verbs().fail_read_after(qp, rng.below(40) as usize, status).unwrap();
                    }
                }
            }
        }
        let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
        let live_before = transport.live_queue_pairs(&remote).len();
        let failed = match transport.wait(&ticket, Instant::now() + Duration::from_secs(10)) {
            Ok(()) => Vec::new(),
            Err(CoreError::RemoteRead { failed, total_ops, .. }) => {
                assert!(faulty, "seed {seed}: a batch without faults failed");
                assert_eq!(total_ops, n as u64);
                assert!(!failed.is_empty() && failed.windows(2).all(|w| w[0] < w[1]), "seed {seed}: {failed:?}");
                assert!(failed.iter().all(|&i| (i as usize) < n));
                failed_batches += 1;
                failed
            }
            Err(other) => panic!("seed {seed}: {other}"),
        };
        let bytes = snapshot(&local);
        for (i, op) in reads.iter().enumerate() {
            if failed.contains(&(i as u32)) {
                continue;
            }
            for k in 0..op.len as usize {
                assert_eq!(
                    bytes[op.local_offset as usize + k],
                    pattern(0, op.remote_offset as usize + k),
                    "seed {seed}: op {i} byte {k} was reported landed"
                );
            }
        }
        if failed.is_empty() && transport.live_queue_pairs(&remote).len() < live_before {
            // A queue pair failed under this batch, and retries still
            // delivered every op.
            retried_batches += 1;
        }
        transport.release_local(&buffer).unwrap();
    }
    // The faults really happened: some batches lost ops, some recovered.
    eprintln!("{failed_batches} batches lost ops, {retried_batches} recovered from a failed queue pair");
    assert!(failed_batches >= 5 && retried_batches >= 5, "{failed_batches} failed, {retried_batches} recovered");
}
