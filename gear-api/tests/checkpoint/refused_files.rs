//! Files a restore refuses: truncated, bit-flipped, other-version and
//! other-spec files, and hand-edited records no table can hold (with
//! every checksum recomputed).

use super::{draws, every_dtype_spec, refused, small_table, temp_dir};
use gear_api::ReplayTable;
use gear_core::{RandomSource, Xoshiro256};

#[test]
fn truncated_bit_flipped_other_version_and_other_spec_checkpoints_are_refused() {
    let dir = temp_dir("refused");
    let good = dir.join("good.gear");
    small_table().checkpoint(&good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let bad = dir.join("bad.gear");
    let mut cuts: Vec<usize> = vec![0, 3, 15, 16, 20, 27, bytes.len() / 2, bytes.len() - 20, bytes.len() - 1];
    cuts.extend((1..20).map(|i| bytes.len() * i / 20));
    for cut in cuts {
        std::fs::write(&bad, &bytes[..cut]).unwrap();
        let msg = refused(&bad);
        assert!(msg.contains("truncated"), "cut at {cut}: {msg}");
    }
    let mut rng = Xoshiro256::seed_from_u64(17);
    for i in 0..60 {
        let at = if i < 20 { 16 + i } else { rng.below(bytes.len() as u64) as usize };
        let mut flipped = bytes.clone();
        flipped[at] ^= 1 << rng.below(8);
        std::fs::write(&bad, &flipped).unwrap();
        let msg = refused(&bad);
        let named = ["corrupted", "truncated", "GEARCKPT", "format version"].iter().any(|w| msg.contains(w));
        assert!(named, "bit flip at byte {at}: {msg}");
    }
    let mut other_version = bytes.clone();
    other_version[8] = 3;
    std::fs::write(&bad, &other_version).unwrap();
    let msg = refused(&bad);
    assert!(msg.contains("format version 3"), "{msg}");
    let mut appended = bytes.clone();
    appended.push(0);
    std::fs::write(&bad, &appended).unwrap();
    assert!(refused(&bad).contains("follow the end chunk"));
    let other_spec = ReplayTable::builder(every_dtype_spec(17)).restore(&good).unwrap_err().to_string();
    assert!(other_spec.contains("spec mismatch"), "{other_spec}");
    // The good file still restores.
    ReplayTable::builder(every_dtype_spec(16)).restore(&good).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- hand-edited files ------------------------------------------------

/// A checkpoint taken apart: its preamble, header payload, trajectory
/// records (the 40-byte fixed part and the column bytes) and strategy
/// payloads. [`Parts::assemble`] puts it back with every checksum
/// recomputed, so what a restore refuses is the edit, not a checksum.
#[derive(Clone)]
struct Parts {
    preamble: Vec<u8>,
    header: Vec<u8>,
    records: Vec<([u8; 40], Vec<u8>)>,
    strategies: Vec<Vec<u8>>,
    end: Vec<u8>,
}

fn chunk(out: &mut Vec<u8>, tag: u32, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

impl Parts {
    fn parse(bytes: &[u8], row_bytes: u64) -> Parts {
        let mut parts =
            Parts { preamble: bytes[..16].to_vec(), header: vec![], records: vec![], strategies: vec![], end: vec![] };
        let mut at = 16;
        while at < bytes.len() {
            let tag = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            let len = u64_at(bytes, at + 4) as usize;
            let payload = &bytes[at + 12..at + 12 + len];
            match tag {
                1 => parts.header = payload.to_vec(),
                2 => {
                    let mut r = 0;
                    while r < payload.len() {
                        let fixed: [u8; 40] = payload[r..r + 40].try_into().unwrap();
                        let n = (u64_at(&fixed, 8) * row_bytes) as usize;
                        parts.records.push((fixed, payload[r + 40..r + 40 + n].to_vec()));
                        r += 40 + n;
                    }
                }
                3 => parts.strategies.push(payload.to_vec()),
                4 => parts.end = payload.to_vec(),
                other => panic!("unknown chunk {other}"),
            }
            at += 12 + len + 4;
        }
        parts
    }

    fn assemble(&self) -> Vec<u8> {
        let mut out = self.preamble.clone();
        chunk(&mut out, 1, &self.header);
        let mut data = Vec::new();
        for (fixed, bytes) in &self.records {
            data.extend_from_slice(fixed);
            data.extend_from_slice(bytes);
        }
        chunk(&mut out, 2, &data);
        for s in &self.strategies {
            chunk(&mut out, 3, s);
        }
        chunk(&mut out, 4, &self.end);
        out
    }

    /// Byte offset of counter `i` in the header (0 seed, 1 time, 2 inserts,
    /// 3 samples, 4 evictions, 5 retired, 6 reclaimed, 7 next sequence,
    /// 8 bytes written, 9 trajectories in the snapshot).
    fn counter(&self, i: usize) -> usize {
        4 + u32::from_le_bytes(self.header[..4].try_into().unwrap()) as usize + 8 * i
    }

    fn next_seq(&self) -> u64 {
        u64_at(&self.header, self.counter(7))
    }
}

// Record fields: slot u32 at 0, generation u32 at 4, length at 8,
// priority at 16, times sampled at 24, insert sequence at 32.
fn seq_of(r: &[u8; 40]) -> u64 {
    u64_at(r, 32)
}

fn set_generation(r: &mut [u8; 40], g: u32) {
    r[4..8].copy_from_slice(&g.to_le_bytes());
}

#[test]
fn records_no_table_can_hold_are_refused_even_with_checksums_recomputed() {
    let dir = temp_dir("edited");
    let good = dir.join("good.gear");
    let table = small_table();
    draws(&table, 3);
    table.checkpoint(&good).unwrap();
    let parts = Parts::parse(&std::fs::read(&good).unwrap(), table.spec().step_bytes());
    assert_eq!(parts.records.len(), 16);
    assert!(parts.records.iter().any(|(r, _)| u64_at(r, 24) > 0), "some trajectory was sampled");
    let bad = dir.join("bad.gear");
    // Taken apart and put back unchanged, the file restores: the edits
    // below are what is refused.
    std::fs::write(&bad, parts.assemble()).unwrap();
    let restored = ReplayTable::builder(every_dtype_spec(16)).seed(1).restore(&bad).unwrap();
    assert_eq!(restored.info().unwrap().size, 16);
    drop(restored);

    type Edit = Box<dyn Fn(&mut Parts)>;
    let next = parts.next_seq();
    let cases: Vec<(&str, Edit, String)> = vec![
        (
            "a duplicate insert sequence",
            Box::new(|p| {
                let first = seq_of(&p.records[0].0);
                set_u64(&mut p.records[1].0, 32, first)
            }),
            format!("two trajectories have insert sequence {}", seq_of(&parts.records[0].0)),
        ),
        (
            "insert sequence 2^64-1",
            Box::new(|p| set_u64(&mut p.records[3].0, 32, u64::MAX)),
            format!("insert sequence {}", u64::MAX),
        ),
        ("insert sequence 0", Box::new(|p| set_u64(&mut p.records[0].0, 32, 0)), "insert sequence 0".into()),
        (
            "the next insert sequence, not yet handed out",
            Box::new(move |p| set_u64(&mut p.records[0].0, 32, next)),
            format!("insert sequence {next}; the table had handed out 1 to {}", next - 1),
        ),
        (
            "a generation beyond its sequence",
            Box::new(|p| {
                let s = seq_of(&p.records[2].0) as u32;
                set_generation(&mut p.records[2].0, s + 1)
            }),
            "impossible for insert sequence".into(),
        ),
        ("generation 0 (2^32 reuses)", Box::new(|p| set_generation(&mut p.records[0].0, 0)), "generation 0".into()),
        (
            "generations adding up to more reuses than inserts",
            Box::new(|p| {
                for (r, _) in &mut p.records {
                    let s = seq_of(r) as u32;
                    set_generation(r, s);
                }
            }),
            "generations add up to".into(),
        ),
        (
            "an empty trajectory",
            Box::new(|p| {
                set_u64(&mut p.records[0].0, 8, 0);
                p.records[0].1.clear();
            }),
            "holds 0 steps".into(),
        ),
        ("more steps than T", Box::new(|p| set_u64(&mut p.records[0].0, 8, 13)), "holds 13 steps".into()),
        (
            "a slot beyond the capacity",
            Box::new(|p| p.records[0].0[0..4].copy_from_slice(&16u32.to_le_bytes())),
            "beyond the capacity".into(),
        ),
        (
            "a slot twice",
            Box::new(|p| {
                let slot = p.records[0].0[0..4].to_vec();
                p.records[1].0[0..4].copy_from_slice(&slot)
            }),
            "appears twice".into(),
        ),
        ("a NaN priority", Box::new(|p| set_u64(&mut p.records[0].0, 16, f64::NAN.to_bits())), "priority".into()),
        (
            "sampled more often than the table sampled rows",
            Box::new(|p| set_u64(&mut p.records[0].0, 24, 1 << 40)),
            "sampled".into(),
        ),
        (
            "header: next insert sequence 0",
            Box::new(|p| {
                let at = p.counter(7);
                set_u64(&mut p.header, at, 0)
            }),
            "next insert sequence is 0".into(),
        ),
        (
            "header: more inserts than sequences",
            Box::new(move |p| {
                let at = p.counter(2);
                set_u64(&mut p.header, at, next)
            }),
            "inserts but only".into(),
        ),
        (
            "header: fewer inserts than trajectories in the file",
            Box::new(|p| {
                let at = p.counter(2);
                set_u64(&mut p.header, at, 3)
            }),
            "counts 3 inserts".into(),
        ),
        (
            "header: a snapshot larger than the table",
            Box::new(|p| {
                let at = p.counter(9);
                set_u64(&mut p.header, at, 17)
            }),
            "snapshot holds 17".into(),
        ),
        ("a strategy of unknown role", Box::new(|p| p.strategies[1][0] = 2), "unknown role 2".into()),
        ("two samplers' states", Box::new(|p| p.strategies[1][0] = 0), "a second role 0".into()),
    ];
    for (what, edit, expected) in cases {
        let mut edited = parts.clone();
        edit(&mut edited);
        std::fs::write(&bad, edited.assemble()).unwrap();
        let msg = refused(&bad);
        assert!(msg.contains("corrupted") && msg.contains(&expected), "{what}: {msg}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
