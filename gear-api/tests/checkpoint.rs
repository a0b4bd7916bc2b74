//! Checkpoints: round trips of every dtype with equal draws after restore,
//! truncated, bit-flipped, other-version and other-spec files refused, a
//! checkpointing child killed with SIGKILL at many points, and a checkpoint
//! taken while writer processes and a sampler run, every row checked.
//! Children are this test binary re-run in a role; every wait has a
//! deadline.

use gear_api::{latest_checkpoint, AttachOptions, Error, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, RandomSource, TableSpec, WindowSpec, Xoshiro256};
use gear_sampler::{StrategyKind, StrategyParams};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A table of items: two columns, windows of 3 every 2 (the tail too) by
/// default, prioritized, `M = T`.
fn item_table() -> gear_api::TableBuilder {
    let spec =
        TableSpec::new(vec![ColumnSpec::new("x", DType::I32, vec![]), ColumnSpec::new("y", DType::U8, vec![3])], 10, 6)
            .unwrap()
            .with_items_per_trajectory(10)
            .unwrap();
    ReplayTable::builder(spec)
        .item_pattern(gear_api::ItemPattern::Windows { len: 3, stride: 2, tail: true })
        .sampler_kind(StrategyKind::Prioritized, StrategyParams::default())
        .seed(5)
}

#[test]
fn items_round_trip_with_keys_windows_priorities_and_times_sampled() {
    let dir = temp_dir("items");
    let table = item_table().build().unwrap();
    let mut rng = Xoshiro256::seed_from_u64(8);
    let mut trajectories = Vec::new();
    // Nine trajectories through six slots: evictions took items out.
    for i in 0..9 {
        let len = 2 + rng.below(9);
        let mut t = table.writer().begin(None).unwrap();
        let x: Vec<i32> = (0..len as i32).map(|s| i * 100 + s).collect();
        t.append_column("x", len, StepValue::typed(&x)).unwrap();
        t.append_column("y", len, StepValue::bytes(&vec![i as u8; 3 * len as usize])).unwrap();
        if i % 3 == 0 {
            t.add_item(0, len, Some(4.0)).unwrap();
        }
        trajectories.push(t.end().unwrap());
    }
    table.add_items(trajectories[8], &[gear_api::NewItem::new(1, 1).with_priority(0.5)]).unwrap();
    let mut s = table.sampler(SampleConfig::new(16, WindowSpec::first(3))).unwrap();
    let keys = s.sample().unwrap().keys().to_vec();
    table.update_priorities(&keys[..4].iter().map(|&k| (k, 9.0)).collect::<Vec<_>>()).unwrap();
    let path = dir.join("items.gear");
    let report = table.checkpoint(&path).unwrap();
    let restored = item_table().restore(&path).unwrap();
    let mut items = 0;
    for &t in &trajectories {
        let (a, b) = (table.items_of(t).unwrap(), restored.items_of(t).unwrap());
        assert_eq!(a, b, "items of {t}: keys, windows, priorities and times sampled");
        items += a.len() as u64;
    }
    assert_eq!(report.items, items);
    assert!(items > 6, "several items per trajectory");
    let (a, b) = (table.info().unwrap(), restored.info().unwrap());
    assert_eq!((b.size, b.inserts, b.samples), (a.size, a.inserts, a.samples));
    // Seeded alike, both draw the same item rows (the restored table's
    // second sampler, as the original's).
    drop(restored.sampler(SampleConfig::new(1, WindowSpec::first(3))).unwrap());
    let (mut sa, mut sb) = (
        table.sampler(SampleConfig::new(64, WindowSpec::first(3))).unwrap(),
        restored.sampler(SampleConfig::new(64, WindowSpec::first(3))).unwrap(),
    );
    let (ba, bb) = (sa.sample().unwrap(), sb.sample().unwrap());
    assert_eq!(ba.keys(), bb.keys());
    assert_eq!(ba.column("x").unwrap().bytes, bb.column("x").unwrap().bytes);
    assert!(ba.keys().iter().all(|k| k.is_item()));
    // Stale keys stay stale: an evicted trajectory's items are not back.
    assert!(restored.items_of(trajectories[0]).unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn version_1_checkpoints_still_restore() {
    let dir = temp_dir("v1");
    let table = small_table();
    let path = dir.join("v2.gear");
    table.checkpoint(&path).unwrap();
    // A table without items writes what version 1 wrote, but for the
    // version and the end chunk's item count: take them out.
    let bytes = std::fs::read(&path).unwrap();
    let end_at = bytes.len() - (12 + 24 + 4);
    assert_eq!(&bytes[end_at..end_at + 4], &4u32.to_le_bytes(), "the end chunk is last");
    let mut v1 = bytes[..end_at].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let mut end = Vec::new();
    end.extend_from_slice(&4u32.to_le_bytes());
    end.extend_from_slice(&16u64.to_le_bytes());
    end.extend_from_slice(&bytes[end_at + 12..end_at + 12 + 16]);
    let crc = crc32fast::hash(&end);
    v1.extend_from_slice(&end);
    v1.extend_from_slice(&crc.to_le_bytes());
    let old = dir.join("v1.gear");
    std::fs::write(&old, &v1).unwrap();
    let restored = ReplayTable::builder(every_dtype_spec(16)).seed(1).restore(&old).unwrap();
    assert_eq!(restored.info().unwrap().size, table.info().unwrap().size);
    assert_eq!(draws(&restored, 2), draws(&table, 2));
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
