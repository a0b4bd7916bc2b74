//! Checkpoints: round trips of every dtype with equal draws after restore,
//! truncated, bit-flipped, other-version and other-spec files refused,
//! hand-edited records no table can hold refused (checksums recomputed),
//! targets that are not regular files refused, a checkpointing child
//! killed with SIGKILL at many points (the previous checkpoint loads, the
//! temporary files of dead writers are removed, a stopped writer's kept),
//! and a checkpoint taken while writer processes and a sampler run, every
//! row checked. Children are this test binary re-run in a role; every wait
//! has a deadline.

use gear_api::{latest_checkpoint, AttachOptions, Error, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, RandomSource, TableSpec, WindowSpec, Xoshiro256};
use gear_sampler::{StrategyKind, StrategyParams};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/not_regular.rs"]
mod not_regular;
use not_regular::{make_fifo, null_device};

const ROLE: &str = "GEAR_CKPT_CHILD_ROLE";
const ARG: &str = "GEAR_CKPT_CHILD_ARG";

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gear-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One column of every dtype, with shapes of zero, one and two dimensions.
fn every_dtype_spec(capacity: u64) -> TableSpec {
    let columns = DType::ALL
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let shape = match i % 3 {
                0 => vec![],
                1 => vec![3],
                _ => vec![2, 2],
            };
            ColumnSpec::new(format!("c{i}"), d, shape)
        })
        .collect();
    TableSpec::new(columns, 12, capacity).unwrap()
}

/// Writes `n` trajectories of random length and random bytes (bools as 0
/// or 1), some with priorities.
fn fill_random(table: &ReplayTable, n: usize, seed: u64) {
    let spec = table.spec().clone();
    let mut rng = Xoshiro256::seed_from_u64(seed);
    let writer = table.writer();
    for i in 0..n {
        let priority = (i % 3 != 0).then(|| 0.1 + rng.below(100) as f64);
        let mut traj = writer.begin(priority).unwrap();
        let len = 1 + rng.below(spec.max_len());
        for (c, col) in spec.columns().iter().enumerate() {
            let bytes: Vec<u8> = (0..col.step_bytes().unwrap() * len)
                .map(|_| if col.dtype() == DType::Bool { rng.below(2) as u8 } else { rng.below(256) as u8 })
                .collect();
            traj.append_column(c, len, StepValue::bytes(&bytes)).unwrap();
        }
        traj.end().unwrap();
    }
}

/// One batch as drawn: keys, lengths, and each column's bytes.
type Drawn = (Vec<gear_core::SlotKey>, Vec<u64>, Vec<Vec<u8>>);

/// The keys, lengths and bytes of `batches` batches from a fresh sampler.
fn draws(table: &ReplayTable, batches: usize) -> Vec<Drawn> {
    let mut sampler = table.sampler(SampleConfig::new(32, WindowSpec::whole(12))).unwrap();
    (0..batches)
        .map(|_| {
            let b = sampler.sample().unwrap();
            let cols = (0..table.spec().columns().len()).map(|c| b.column_at(c).bytes.to_vec()).collect();
            (b.keys().to_vec(), b.lengths().to_vec(), cols)
        })
        .collect()
}

#[test]
fn every_dtype_round_trips_and_draws_after_restore_equal_draws_before() {
    let dir = temp_dir("roundtrip");
    let strategies = [
        (StrategyKind::Uniform, StrategyKind::Fifo),
        (StrategyKind::Prioritized, StrategyKind::MinHeap),
        (StrategyKind::MaxHeap, StrategyKind::Lifo),
    ];
    for (sampler_kind, remover_kind) in strategies {
        let build = || {
            ReplayTable::builder(every_dtype_spec(48))
                .sampler_kind(sampler_kind, StrategyParams::default())
                .remover_kind(remover_kind)
                .seed(11)
        };
        let table = build().build().unwrap();
        // Three times the capacity: evictions reorder the strategies.
        fill_random(&table, 150, 3);
        let keys = draws(&table, 2)[0].0.clone();
        table.update_priorities(&keys.iter().map(|&k| (k, 7.5)).collect::<Vec<_>>()).unwrap();
        let path = dir.join(format!("{}.gear", sampler_kind.name()));
        let report = table.checkpoint(&path).unwrap();
        assert_eq!((report.trajectories, report.dropped), (48, 0));
        let before = draws(&table, 4);
        let restored = build().restore(&path).unwrap();
        // The restored table made no sampler yet: align the sampler count.
        draws(&restored, 2);
        assert_eq!(draws(&restored, 4), before, "{sampler_kind:?}: same seed, same rows");
        let (a, b) = (table.info().unwrap(), restored.info().unwrap());
        assert_eq!((b.size, b.evictions), (a.size, a.evictions));
        // Counters restored at the checkpoint (the original sampled since).
        assert_eq!(b.inserts, a.inserts);
        // Both go on alike: the next insert without a priority gets the
        // same one, and the next draws match again.
        fill_random(&table, 5, 99);
        fill_random(&restored, 5, 99);
        assert_eq!(draws(&restored, 2), draws(&table, 2), "{sampler_kind:?}: after more inserts");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn small_table() -> ReplayTable {
    let table = ReplayTable::builder(every_dtype_spec(16)).seed(1).build().unwrap();
    fill_random(&table, 20, 5);
    table
}

fn refused(path: &Path) -> String {
    match ReplayTable::builder(every_dtype_spec(16)).restore(path) {
        Ok(_) => panic!("{} was restored", path.display()),
        Err(e @ Error::Checkpoint { .. }) => e.to_string(),
        Err(e) => panic!("expected a checkpoint error, got {e}"),
    }
}

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
    other_version[8] = 2;
    std::fs::write(&bad, &other_version).unwrap();
    let msg = refused(&bad);
    assert!(msg.contains("format version 2"), "{msg}");
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

// ---- targets ------------------------------------------------------------

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn checkpoint_targets_that_are_not_regular_files_are_refused_and_left_alone() {
    use std::os::unix::fs::FileTypeExt;
    let dir = temp_dir("targets");
    let table = small_table();
    let expect_refused = |path: &Path, word: &str| {
        let msg = match table.checkpoint(path) {
            Ok(r) => panic!("{} was replaced by a checkpoint of {} bytes", path.display(), r.file_bytes),
            Err(e @ Error::Checkpoint { .. }) => e.to_string(),
            Err(e) => panic!("expected a checkpoint error, got {e}"),
        };
        assert!(msg.contains(word) && msg.contains(&path.display().to_string()), "{msg}");
    };
    // The device node a new user reaches for to mean "don't keep it".
    if let Some(null) = null_device(&dir) {
        expect_refused(&null, "is a character device, not a regular file");
        assert!(std::fs::symlink_metadata(&null).unwrap().file_type().is_char_device(), "still a device");
    }
    let sub = dir.join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    expect_refused(&sub, "is a directory");
    assert!(sub.is_dir());
    let fifo = dir.join("a-fifo");
    make_fifo(&fifo);
    expect_refused(&fifo, "is a FIFO");
    let socket = dir.join("a-socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    expect_refused(&socket, "is a socket");
    let file = dir.join("kept.gear");
    std::fs::write(&file, b"someone else's bytes").unwrap();
    let link = dir.join("link.gear");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    expect_refused(&link, "is a symbolic link");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&file).unwrap(), b"someone else's bytes");
    let dangling = dir.join("dangling.gear");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    expect_refused(&dangling, "is a symbolic link");
    // Named directly, the regular file is replaced; no temporary file is
    // left by any of the above.
    table.checkpoint(&file).unwrap();
    assert_eq!(
        names_in(&dir),
        ["a-directory", "a-fifo", "a-socket", "dangling.gear", "kept.gear", "link.gear", "null-device"]
            .iter()
            .filter(|n| **n != "null-device" || dir.join(n).exists())
            .map(|n| n.to_string())
            .collect::<Vec<_>>(),
        "only the targets themselves"
    );
    // Restores read regular files only (a FIFO would block, a device would
    // never end), through symbolic links.
    for (source, word) in [(fifo.clone(), "is a FIFO"), (PathBuf::from("/dev/zero"), "is a character device")] {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(refused(&source)));
        let msg = rx.recv_timeout(Duration::from_secs(20)).expect("a restore from a FIFO or a device returns");
        assert!(msg.contains(word), "{msg}");
    }
    ReplayTable::builder(every_dtype_spec(16)).restore(&link).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stale_temporary_files_are_removed_and_live_ones_kept() {
    use gear_api::table::checkpoint::{files::ReplacingFile, remove_stale_temporaries};
    let dir = temp_dir("stale");
    let table = small_table();
    table.checkpoint_into(&dir, 3).unwrap();
    // Left by dead writers: this scheme's names and the names of writers
    // from before it (no number).
    for name in ["checkpoint-0000000002.gear.tmp.4242.0", "checkpoint-0000000002.gear.tmp.4242"] {
        std::fs::write(dir.join(name), b"partial").unwrap();
    }
    // Not temporary files of numbered checkpoints: kept.
    let others = ["notes.txt.tmp.1.0", "checkpoint-x.gear.tmp.1.0", "checkpoint-0000000003.gear.tmp.x"];
    for name in others {
        std::fs::write(dir.join(name), b"keep").unwrap();
    }
    // A FIFO under a temporary name is not a file a writer left: kept,
    // and looking at it does not block.
    make_fifo(&dir.join("checkpoint-0000000004.gear.tmp.7.0"));
    // A live writer's temporary file, from this process (the lock is per
    // open file, so even the writer's own process does not take it).
    let live = ReplacingFile::create(&dir.join("checkpoint-0000000005.gear")).unwrap();
    assert_eq!(remove_stale_temporaries(&dir).unwrap(), 2);
    let names = names_in(&dir);
    assert!(names.contains(&live.path().file_name().unwrap().to_str().unwrap().to_owned()), "{names:?}");
    for name in others {
        assert!(names.contains(&name.to_owned()), "{name} kept: {names:?}");
    }
    assert!(names.contains(&"checkpoint-0000000004.gear.tmp.7.0".to_owned()));
    assert!(!names.iter().any(|n| n.starts_with("checkpoint-0000000002.gear.tmp.")), "{names:?}");
    // Dropped without a commit, the writer removes its own file.
    let path = live.path().to_owned();
    drop(live);
    assert!(!path.exists());
    // `checkpoint(path)` removes stale files of its own target only.
    for name in ["one.gear.tmp.99.0", "two.gear.tmp.99.0"] {
        std::fs::write(dir.join(name), b"partial").unwrap();
    }
    table.checkpoint(dir.join("one.gear")).unwrap();
    let names = names_in(&dir);
    assert!(!names.contains(&"one.gear.tmp.99.0".to_owned()) && names.contains(&"two.gear.tmp.99.0".to_owned()));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- processes -------------------------------------------------------

const OBS: usize = 256;

fn pattern_spec(capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![ColumnSpec::new("id", DType::I64, vec![]), ColumnSpec::new("obs", DType::U8, vec![OBS as u64])],
        16,
        capacity,
    )
    .unwrap()
}

fn obs_byte(id: i64, step: u64, i: usize) -> u8 {
    (id as u64).wrapping_mul(0x9e37).wrapping_add(step * 13).wrapping_add(i as u64) as u8
}

/// A trajectory whose every byte says which trajectory and step it is.
fn write_pattern(writer: &gear_api::Writer, id: i64, len: u64) {
    let mut traj = writer.begin(None).unwrap();
    for s in 0..len {
        let obs: Vec<u8> = (0..OBS).map(|i| obs_byte(id, s, i)).collect();
        traj.append_step(&[StepValue::typed(&[id]), StepValue::typed(&obs)]).unwrap();
    }
    traj.end().unwrap();
}

/// Reads every stored trajectory once (a FIFO sampler over the whole
/// table) and checks each row's bytes against its pattern. Returns the
/// rows checked.
fn check_every_row(table: &ReplayTable) -> u64 {
    let size = table.info().unwrap().size;
    assert!(size > 0);
    let mut sampler = table.sampler(SampleConfig::new(size as usize, WindowSpec::first(16))).unwrap();
    let b = sampler.sample().unwrap();
    let ids: &[i64] = b.column("id").unwrap().as_slice().unwrap();
    let obs: &[u8] = b.column("obs").unwrap().as_slice().unwrap();
    let mut keys = b.keys().to_vec();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len() as u64, size, "a FIFO batch of the table's size reads every row once");
    for (r, &len) in b.lengths().iter().enumerate() {
        let id = ids[r * 16];
        for s in 0..16 {
            let real = s < len as usize;
            assert_eq!(ids[r * 16 + s], if real { id } else { 0 }, "row {r} step {s}");
            for i in 0..OBS {
                let want = if real { obs_byte(id, s as u64, i) } else { 0 };
                assert_eq!(obs[(r * 16 + s) * OBS + i], want, "row {r} (id {id}) step {s} byte {i}");
            }
        }
    }
    size
}

fn restore_fifo(path: &Path, capacity: u64) -> gear_api::Result<ReplayTable> {
    ReplayTable::builder(pattern_spec(capacity))
        .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
        .restore(path)
}

/// Entry point of every child; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let arg = std::env::var(ARG).unwrap();
    match role.as_str() {
        // Checkpoints a growing table into directory `arg` again and again
        // (keeping 2) until killed; says "first" after the first one.
        "checkpointer" => {
            let table = ReplayTable::builder(pattern_spec(4096)).build().unwrap();
            let writer = table.writer();
            let mut id = 0;
            for _ in 0..2000 {
                id += 1;
                write_pattern(&writer, id, 1 + (id as u64 % 16));
            }
            let mut first = true;
            loop {
                table.checkpoint_into(&arg, 2).unwrap();
                if std::mem::take(&mut first) {
                    println!("first");
                }
                for _ in 0..50 {
                    id += 1;
                    write_pattern(&writer, id, 1 + (id as u64 % 16));
                }
            }
        }
        // Writes pattern trajectories into shared table `arg` for 1.5 s.
        "writer" => {
            let table = ReplayTable::attach(&arg, AttachOptions::default()).unwrap();
            let writer = table.writer().with_timeout(Duration::from_secs(10));
            let base = (std::process::id() as i64) << 32;
            let deadline = Instant::now() + Duration::from_millis(1500);
            let mut n = 0;
            while Instant::now() < deadline {
                n += 1;
                write_pattern(&writer, base | n, 1 + (n as u64 % 16));
            }
            println!("wrote {n}");
        }
        other => panic!("unknown role {other}"),
    }
}

/// A child process that is killed when dropped, so a failing test leaves
/// no child running.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(role: &str, arg: &str) -> ChildGuard {
    ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(ARG, arg)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

/// Waits (30 s at most) for a line holding `word` on the child's
/// stdout.
fn wait_line(child: &mut Child, word: &'static str) {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.contains(word) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("child never said {word}"));
}

#[test]
fn sigkill_while_checkpointing_leaves_the_previous_checkpoint_loadable() {
    let dir = temp_dir("sigkill");
    let arg = dir.to_str().unwrap().to_owned();
    let mut rng = Xoshiro256::seed_from_u64(23);
    let mut saw_partial = false;
    for round in 0..8 {
        let mut child = spawn("checkpointer", &arg);
        wait_line(&mut child.0, "first");
        std::thread::sleep(Duration::from_micros(rng.below(60_000)));
        drop(child);
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        saw_partial |= names.iter().any(|n| n.contains(".tmp."));
        let latest = latest_checkpoint(&dir).unwrap().expect("a checkpoint survives");
        assert!(!latest.to_str().unwrap().contains(".tmp."), "a partial file is never taken");
        for name in names.iter().filter(|n| !n.contains(".tmp.")) {
            let table = restore_fifo(&dir.join(name), 4096)
                .unwrap_or_else(|e| panic!("round {round}: {name} does not restore: {e}"));
            check_every_row(&table);
        }
        // Restoring the directory reads its newest checkpoint.
        restore_fifo(&dir, 4096).unwrap();
    }
    eprintln!("partial files left by killed children seen: {saw_partial}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A table large enough (69 MB of slots) for the restore to fault its
/// pages in from a second thread, written past its capacity so that the
/// file's order (oldest insert first) starts mid-table and wraps: every
/// row restores intact while that thread populates the pages around it.
#[test]
fn a_large_table_restores_every_row_while_its_pages_are_faulted_in_ahead() {
    let dir = temp_dir("large");
    let capacity = 16384;
    let table = ReplayTable::builder(pattern_spec(capacity))
        .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
        .build()
        .unwrap();
    let writer = table.writer();
    for id in 1..=(capacity as i64 * 3 / 2) {
        write_pattern(&writer, id, 1 + (id as u64 * 7) % 16);
    }
    let path = dir.join("large.gear");
    let report = table.checkpoint(&path).unwrap();
    assert_eq!(report.trajectories, capacity);
    let restored = restore_fifo(&path, capacity).unwrap();
    assert_eq!(check_every_row(&restored), capacity);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The temporary files in `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    names_in(dir).into_iter().filter(|n| n.contains(".tmp.")).collect()
}

/// Waits (10 s at most) until a temporary file is in `dir`.
fn wait_for_temporary(dir: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !temporaries(dir).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

#[test]
fn killed_checkpoint_writers_leave_no_temporary_files_behind() {
    use gear_api::table::checkpoint::remove_stale_temporaries;
    let dir = temp_dir("killed");
    let arg = dir.to_str().unwrap().to_owned();
    let mut rng = Xoshiro256::seed_from_u64(41);
    let mut kills_mid_write = 0;
    for round in 0..12 {
        let mut child = spawn("checkpointer", &arg);
        wait_line(&mut child.0, "first");
        // At a random moment, most often while a checkpoint is written.
        if rng.below(4) != 0 {
            wait_for_temporary(&dir);
        }
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        drop(child);
        // Each writer removed what the writers killed before it left: at
        // most the last one's file is here.
        let temps = temporaries(&dir);
        assert!(temps.len() <= 1, "round {round}: {temps:?}");
        kills_mid_write += temps.len();
        let numbered = names_in(&dir).len() - temps.len();
        assert!(numbered <= 3, "round {round}: {numbered} checkpoints kept with --keep 2");
        restore_fifo(&dir, 4096).unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    eprintln!("{kills_mid_write} of 12 kills landed while a checkpoint was being written");
    assert!(kills_mid_write > 0, "no kill landed during a write: nothing was tested");
    let left = temporaries(&dir).len();
    assert_eq!(remove_stale_temporaries(&dir).unwrap(), left);
    assert!(temporaries(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stopped_checkpoint_writer_keeps_its_temporary_file() {
    use gear_api::table::checkpoint::remove_stale_temporaries;
    let dir = temp_dir("stopped");
    let mut child = spawn("checkpointer", dir.to_str().unwrap());
    wait_line(&mut child.0, "first");
    let pid = child.0.id() as libc::pid_t;
    let mut rng = Xoshiro256::seed_from_u64(43);
    let mut caught = 0;
    for _ in 0..200 {
        if caught == 5 {
            break;
        }
        if !wait_for_temporary(&dir) {
            continue;
        }
        // SAFETY: kill() and waitpid() on a child this test started and
        // has not reaped (it is reaped by the guard's drop).
        unsafe {
            assert_eq!(libc::kill(pid, libc::SIGSTOP), 0);
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, libc::WUNTRACED), pid);
        }
        // The writer is stopped, its process alive: its file stays.
        let temps = temporaries(&dir);
        if !temps.is_empty() {
            assert_eq!(remove_stale_temporaries(&dir).unwrap(), 0, "{temps:?}");
            assert_eq!(temporaries(&dir), temps);
            caught += 1;
        }
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        std::thread::sleep(Duration::from_micros(rng.below(5000)));
    }
    assert!(caught > 0, "the writer was never stopped mid-write");
    // Resumed each time, it finished those checkpoints (an error would
    // have ended it).
    assert!(child.0.try_wait().unwrap().is_none(), "the checkpointer died");
    drop(child);
    let left = temporaries(&dir).len();
    assert_eq!(remove_stale_temporaries(&dir).unwrap(), left);
    assert!(temporaries(&dir).is_empty());
    check_every_row(&restore_fifo(&dir, 4096).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn checkpoint_taken_while_writer_processes_and_a_sampler_run_restores_every_row() {
    let dir = temp_dir("live");
    let name = format!("gear-ckpt-live-{}", std::process::id());
    let capacity = 512;
    let table = ReplayTable::builder(pattern_spec(capacity)).shared_memory(&name).build().unwrap();
    let mut writers: Vec<ChildGuard> = (0..2).map(|_| spawn("writer", &name)).collect();
    let sampling = table.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let sampler = std::thread::spawn(move || {
        let config = SampleConfig::new(16, WindowSpec::last(8)).timeout(Some(Duration::from_secs(10)));
        let mut s = sampling.sampler(config).unwrap();
        let mut rows = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            rows += s.sample().unwrap().rows();
        }
        rows
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while table.info().unwrap().size < capacity && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut reports = Vec::new();
    for i in 0..3 {
        reports.push(table.checkpoint(dir.join(format!("live-{i}.gear"))).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    for w in &mut writers {
        assert!(w.0.wait().unwrap().success());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(sampler.join().unwrap() > 0);
    for r in &reports {
        eprintln!(
            "checkpoint of {} trajectories ({} dropped, evicted during the copy): pause {:?}, total {:?}",
            r.trajectories, r.dropped, r.pause, r.elapsed
        );
        let restored = restore_fifo(&r.path, capacity).unwrap();
        assert_eq!(restored.info().unwrap().size, r.trajectories);
        if r.trajectories > 0 {
            assert_eq!(check_every_row(&restored), r.trajectories);
        }
    }
    // Writers that lap the table during a copy cost it the oldest
    // trajectories, never all of them (the copy turns to the newest).
    assert!(reports.iter().any(|r| r.trajectories > 0), "no checkpoint kept a trajectory");
    std::fs::remove_dir_all(&dir).unwrap();
}
