//! Fuzzing of corrupted table files: a real shared table is built and
//! filled, bytes of its header, control block (lock word, counters, policy,
//! leases), free list, change log or slot records are flipped at random,
//! and then a second handle attaches, samples, writes, updates priorities
//! and reads counters, as does the creator's own handle. Every call must
//! return (a result or an error) within its deadline, with no panic and no
//! signal. Cases run in child processes (this test binary re-run), several
//! cases per child, and the parent fails on any child that crashes, panics
//! or outlives its deadline, naming the seed that reproduces it.
//!
//! Tables with items get cases of their own that flip bytes of the item
//! records: every sampled row must then still read its item's own
//! trajectory (an item names its slot by its index, never by a stored
//! field), or the call must fail.
//!
//! `GEAR_FUZZ_CASES` sets the number of cases (default 240 here, and 120
//! of item records; `cargo xtask soak` runs thousands).

mod common;

use gear_api::{AttachOptions, ReplayTable, SampleConfig, StepValue};
use gear_core::{ControlBlock, RandomSource, RegionLayout, SlotKey, TableSpec, WindowSpec, Xoshiro256};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "GEAR_FUZZ_CHILD";
const FIRST: &str = "GEAR_FUZZ_FIRST";
const COUNT: &str = "GEAR_FUZZ_COUNT";
const SEED: &str = "GEAR_FUZZ_SEED";
const ITEMS: &str = "GEAR_FUZZ_ITEMS";

/// Items per trajectory in the item cases.
const ITEMS_PER_TRAJECTORY: u64 = 4;

/// The deadline every call in a case is given.
const CALL_TIMEOUT: Duration = Duration::from_millis(300);
/// How much longer than its deadline a call may take before it counts as
/// hung (scheduling noise on a loaded 2-core machine).
const SLACK: Duration = Duration::from_secs(3);

fn spec() -> TableSpec {
    common::spec3(6, 12)
}

fn item_spec() -> TableSpec {
    spec().with_items_per_trajectory(ITEMS_PER_TRAJECTORY).unwrap()
}

/// The obs bytes of trajectory `n`'s steps (0 is never written: padding).
static MARKS: [[u8; 6]; 16] = {
    let mut m = [[0u8; 6]; 16];
    let mut i = 0;
    while i < 16 {
        m[i] = [i as u8 + 1; 6];
        i += 1;
    }
    m
};

fn step() -> [StepValue<'static>; 3] {
    marked_step(2)
}

fn marked_step(n: usize) -> [StepValue<'static>; 3] {
    [StepValue::typed(&MARKS[n]), StepValue::typed(&[4i32]), StepValue::typed(&[1.0f32, 2.0])]
}

/// Runs `f`, failing the child (exit 3) if it took far longer than
/// `deadline`: a call that ignores its deadline is a hang.
fn timed<T>(case: u64, what: &str, deadline: Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    if t.elapsed() > deadline + SLACK {
        println!("HUNG case {case}: {what} took {:?} with a deadline of {deadline:?}", t.elapsed());
        std::process::exit(3);
    }
    out
}

/// Where an item case flips bytes: the item records (the slot records,
/// which the item cases leave alone, say which trajectory each slot holds).
fn item_areas(rl: &RegionLayout) -> Vec<(&'static str, u64, u64)> {
    vec![("item records", rl.items_offset, 32 * spec().capacity() * ITEMS_PER_TRAJECTORY)]
}

/// Where a case flips bytes: (offset, length) of one area of the file.
fn areas(rl: &RegionLayout) -> Vec<(&'static str, u64, u64)> {
    let ctl = rl.control_offset;
    let leases = std::mem::offset_of!(ControlBlock, leases) as u64;
    vec![
        ("header", 0, 64 + rl.spec_bytes),
        ("control block", ctl, leases),
        ("lease generations", ctl + leases, 64),
        // Entries that name no wait, or a live process's wait with any
        // reason: info() must read them without trusting them.
        ("wait list", ctl + std::mem::offset_of!(ControlBlock, waits) as u64, 16 * 64),
        ("free list", rl.free_offset, 4 * spec().capacity()),
        ("change log", rl.log_offset, 32 * 64),
        ("slot records", rl.slots_offset, 64 * spec().capacity()),
    ]
}

/// Calls made and calls refused with an error, over a child's cases.
#[derive(Default)]
struct Tally {
    calls: u64,
    errors: u64,
    /// Item cases whose attached handle, rebuilt from the corrupted
    /// records, holds other items than the creator's (the corruption
    /// reached the items).
    diverged: u64,
}

impl Tally {
    fn note<T, E>(&mut self, r: &Result<T, E>) {
        self.calls += 1;
        self.errors += u64::from(r.is_err());
    }
}

fn one_case(case: u64, seed: u64, items: bool, tally: &mut Tally) {
    let mut rng = Xoshiro256::seed_from_u64(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let name = format!("gear-fuzz-{}-{case}", std::process::id());
    let builder = if items {
        ReplayTable::builder(item_spec())
            .item_pattern(gear_api::ItemPattern::Windows { len: 2, stride: 2, tail: true })
            .sampler_kind(gear_sampler::StrategyKind::Prioritized, gear_sampler::StrategyParams::default())
    } else {
        ReplayTable::builder(spec())
    };
    let table = builder.shared_memory(&name).build().unwrap();
    // Which trajectory's marks each slot holds.
    let mut marks = vec![0u8; spec().capacity() as usize];
    for (i, mark) in MARKS.iter().enumerate().take(6) {
        let mut t = table.writer().begin(Some(1.0 + i as f64)).unwrap();
        for _ in 0..1 + rng.below(6) {
            t.append_step(&marked_step(i)).unwrap();
        }
        marks[t.key().slot as usize] = mark[0];
        t.end().unwrap();
    }
    let (obs, act, rew) = (vec![5u8; 3 * 6], vec![6i32; 3], vec![7f32; 3 * 2]);
    table
        .writer()
        .insert_batch(3, 1, &[StepValue::typed(&obs), StepValue::typed(&act), StepValue::typed(&rew)], None)
        .unwrap();
    let open = table.writer().begin(None).unwrap(); // one slot left being written
    let rl = RegionLayout::for_spec(table.spec()).unwrap();
    let areas = if items { item_areas(&rl) } else { areas(&rl) };
    let (_area, start, len) = areas[rng.below(areas.len() as u64) as usize];
    let file = std::fs::OpenOptions::new().read(true).write(true).open(format!("/dev/shm/{name}")).unwrap();
    for _ in 0..1 + rng.below(8) {
        let at = start + rng.below(len);
        let mut b = [0u8];
        file.read_exact_at(&mut b, at).unwrap();
        b[0] ^= 1 + rng.below(255) as u8;
        file.write_all_at(&b, at).unwrap();
    }

    let call = CALL_TIMEOUT;
    let attach_timeout = AttachOptions { timeout: Some(call), ..AttachOptions::default() };
    let attached = timed(case, "attach", call, || ReplayTable::attach(&name, attach_timeout));
    tally.note(&attached);
    if let (true, Ok(a)) = (items, &attached) {
        let masses = (a.selection_mass(), table.selection_mass());
        if let (Ok(x), Ok(y)) = masses {
            tally.diverged += u64::from(x != y);
        }
    }
    for (who, t) in [("attached", attached.as_ref().ok()), ("creator", Some(&table))] {
        let Some(t) = t else { continue };
        let config = SampleConfig::new(4, WindowSpec::last(3)).timeout(Some(call));
        let sampled = timed(case, "sample", call * 2, || {
            t.sampler(config).and_then(|mut s| {
                s.sample().map(|b| {
                    if items {
                        check_item_rows(case, b, &marks);
                    }
                    b.keys().to_vec()
                })
            })
        });
        tally.note(&sampled);
        let keys: Vec<SlotKey> = sampled.unwrap_or_default();
        let wrote = timed(case, "write", call * 3, || {
            let w = t.writer().with_timeout(call);
            w.begin(None).and_then(|mut traj| {
                traj.append_step(&step())?;
                traj.end()
            })
        });
        tally.note(&wrote);
        let updates: Vec<(SlotKey, f64)> = keys.iter().map(|&k| (k, 2.0)).collect();
        tally.note(&timed(case, "update_priorities", call, || t.update_priorities(&updates)));
        tally.note(&timed(case, "info", call, || t.info()));
        tally.note(&timed(case, "reclaim_dead", call, || t.reclaim_dead()));
        let _ = who;
    }
    drop(open);
    drop(attached);
    drop(table);
    let _ = std::fs::remove_file(format!("/dev/shm/{name}"));
}

/// Every row of an item batch reads its item's trajectory: the one its
/// slot held when the case wrote it (slots the case did not mark, those of
/// the batch insert and of writes after the corruption, are checked for
/// one trajectory per row only). A row mixing trajectories or reading
/// another slot's exits the child.
fn check_item_rows(case: u64, b: &gear_api::SampledBatch, marks: &[u8]) {
    let obs = b.column("obs").unwrap().bytes;
    for (r, key) in b.keys().iter().enumerate() {
        let slot = (u64::from(key.slot) / ITEMS_PER_TRAJECTORY) as usize;
        let row = &obs[r * 3 * 6..(r + 1) * 3 * 6];
        let n = (b.lengths()[r] as usize).min(3);
        // `WindowSpec::last(3)`: padding first, then the item's steps.
        let (padding, data) = row.split_at((3 - n) * 6);
        let want = marks.get(slot).copied().unwrap_or(0);
        let first = data.first().copied().unwrap_or(0);
        let ok = key.is_item()
            && padding.iter().all(|&x| x == 0)
            && data.iter().all(|&x| x == first)
            && (want == 0 || n == 0 || first == want);
        if !ok {
            println!("CROSSED case {case}: row {r} of {key} (slot {slot}, mark {want}) reads {row:?}");
            std::process::exit(4);
        }
    }
}

/// Entry point of the child processes; does nothing in a normal run.
#[test]
fn child_entry() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap().parse::<u64>().unwrap();
    let (first, count, seed) = (var(FIRST), var(COUNT), var(SEED));
    let items = std::env::var(ITEMS).is_ok();
    let mut tally = Tally::default();
    for case in first..first + count {
        one_case(case, seed, items, &mut tally);
    }
    println!(
        "cases {first}..{} passed: {} calls, {} errors, {} diverged",
        first + count,
        tally.calls,
        tally.errors,
        tally.diverged
    );
}

#[test]
fn corrupted_table_files_never_hang_panic_or_signal() {
    let cases: u64 = std::env::var("GEAR_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(240);
    fuzz(cases, false);
}

#[test]
fn corrupted_item_records_never_hang_panic_or_cross_trajectories() {
    let cases: u64 = std::env::var("GEAR_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(240);
    fuzz(cases / 2, true);
}

/// Runs `cases` cases in child processes (item tables with `items`).
fn fuzz(cases: u64, items: bool) {
    let seed: u64 = std::env::var("GEAR_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x6ea2);
    const PER_CHILD: u64 = 40;
    let (mut first, mut calls, mut errors, mut diverged) = (0, 0, 0, 0);
    while first < cases {
        let count = PER_CHILD.min(cases - first);
        let mut command = Command::new(std::env::current_exe().unwrap());
        if items {
            command.env(ITEMS, "1");
        }
        let mut c = command
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(ROLE, "1")
            .env(FIRST, first.to_string())
            .env(COUNT, count.to_string())
            .env(SEED, seed.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Every call of every case at its deadline plus slack, and then some.
        let deadline = Duration::from_secs(20) + (CALL_TIMEOUT * 12 + SLACK) * count as u32;
        let start = Instant::now();
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break Some(s);
            }
            if start.elapsed() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        c.stderr.take().unwrap().read_to_string(&mut out).unwrap();
        let repro = format!("GEAR_FUZZ_SEED={seed}, cases {first}..{}", first + count);
        match status {
            None => panic!("fuzz child hung past {deadline:?} ({repro}):\n{out}"),
            Some(s) if !s.success() => panic!("fuzz child failed: {s} ({repro}):\n{out}"),
            Some(_) => {
                let line = out.lines().find(|l| l.contains("passed:")).unwrap_or_else(|| panic!("{out}"));
                let n = |word: &str| -> u64 {
                    line.split(", ")
                        .find_map(|p| p.strip_suffix(word))
                        .and_then(|v| v.trim().rsplit(' ').next()?.parse().ok())
                        .unwrap_or(0)
                };
                errors += n(" errors");
                calls += n(" calls");
                diverged += n(" diverged");
            }
        }
        first += count;
    }
    eprintln!(
        "{cases} corrupted tables: {calls} calls, {errors} refused with an error, {diverged} with items the \
         attacher left out, none hung, crashed or crossed trajectories"
    );
    // The corruption reached the calls (a fuzz whose flips changed nothing
    // would prove nothing): some were refused, or, for item records, an
    // attacher rebuilding from them left corrupted items out.
    if items {
        assert!(diverged > 0, "no case's corruption reached the items");
    } else {
        assert!(errors > 0, "no call saw the corruption");
    }
}
