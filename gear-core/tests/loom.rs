//! Loom models of the slot protocol (`gear_core::SlotRecord`): every
//! interleaving loom can find of a writer and a reader, under the C++11
//! memory model. Run with
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test -p gear-core --test loom --release
//! ```
//!
//! The trajectory bytes are plain memory in the real table, copied without
//! atomics (a seqlock's reader tolerates torn bytes and throws them away);
//! here they are relaxed atomics, which loom can reason about and which are
//! no stronger than the real copy. What the models prove: a reader that
//! validates a row never returns bytes of another generation (slot reuse:
//! generation bump, release fence, new bytes, then the reader's acquire
//! fence and re-check), and a reader that sees a published length sees the
//! steps before it (publish with release, read with acquire).
#![cfg(loom)]

use gear_core::SlotRecord;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// One step's bytes of the slot, for the model.
struct Slot {
    record: SlotRecord,
    step: [AtomicU64; 2],
}

fn slot() -> Arc<Slot> {
    Arc::new(Slot { record: SlotRecord::default(), step: [AtomicU64::new(0), AtomicU64::new(0)] })
}

#[test]
fn a_validated_read_never_mixes_generations() {
    loom::model(|| {
        let s = slot();
        // Generation 1 holds the value 1 in both words, committed.
        let k1 = s.record.begin_write(0, 7, 1, 1.0).unwrap();
        s.step[0].store(1, Ordering::Relaxed);
        s.step[1].store(1, Ordering::Relaxed);
        s.record.publish_len(k1, 1).unwrap();
        s.record.commit(k1).unwrap();

        let writer = {
            let s = s.clone();
            thread::spawn(move || {
                // Eviction and reuse: free, begin (generation bump and
                // fence), then the new trajectory's bytes.
                s.record.free(k1).unwrap();
                let k2 = s.record.begin_write(0, 8, 2, 1.0).unwrap();
                s.step[0].store(2, Ordering::Relaxed);
                s.step[1].store(2, Ordering::Relaxed);
                s.record.publish_len(k2, 1).unwrap();
            })
        };
        // The reader drew k1 and copies its row.
        // The length itself may already be the next generation's (begin
        // resets it): validation is what makes the row usable.
        if let Some(len) = s.record.read_begin(k1) {
            let a = s.step[0].load(Ordering::Relaxed);
            let b = s.step[1].load(Ordering::Relaxed);
            if s.record.read_validate(k1) {
                assert_eq!((len, a, b), (1, 1, 1), "a validated row holds another generation's bytes");
            }
        }
        writer.join().unwrap();
    });
}

#[test]
fn a_published_length_covers_written_steps() {
    loom::model(|| {
        let s = slot();
        let key = s.record.begin_write(0, 7, 1, 1.0).unwrap();
        let writer = {
            let s = s.clone();
            thread::spawn(move || {
                s.step[0].store(5, Ordering::Relaxed);
                s.record.publish_len(key, 1).unwrap();
                s.step[1].store(6, Ordering::Relaxed);
                s.record.publish_len(key, 2).unwrap();
            })
        };
        if let Some(len) = s.record.read_begin(key) {
            let seen = [s.step[0].load(Ordering::Relaxed), s.step[1].load(Ordering::Relaxed)];
            assert!(s.record.read_validate(key), "nobody reused the slot");
            for (i, want) in [5, 6].into_iter().enumerate().take(len as usize) {
                assert_eq!(seen[i], want, "step {i} published (len {len}) but not visible");
            }
        }
        writer.join().unwrap();
    });
}
