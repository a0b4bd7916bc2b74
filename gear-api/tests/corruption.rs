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
//! `GEAR_FUZZ_CASES` sets the number of cases (default 240 here; `cargo
//! xtask soak` runs thousands).

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

/// The deadline every call in a case is given.
const CALL_TIMEOUT: Duration = Duration::from_millis(300);
/// How much longer than its deadline a call may take before it counts as
/// hung (scheduling noise on a loaded 2-core machine).
const SLACK: Duration = Duration::from_secs(3);

fn spec() -> TableSpec {
    common::spec3(6, 12)
}

fn step() -> [StepValue<'static>; 3] {
    [StepValue::typed(&[3u8; 6]), StepValue::typed(&[4i32]), StepValue::typed(&[1.0f32, 2.0])]
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
}

impl Tally {
    fn note<T, E>(&mut self, r: &Result<T, E>) {
        self.calls += 1;
        self.errors += u64::from(r.is_err());
    }
}

fn one_case(case: u64, seed: u64, tally: &mut Tally) {
    let mut rng = Xoshiro256::seed_from_u64(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let name = format!("gear-fuzz-{}-{case}", std::process::id());
    let table = ReplayTable::builder(spec()).shared_memory(&name).build().unwrap();
    for i in 0..6 {
        let mut t = table.writer().begin(Some(1.0 + i as f64)).unwrap();
        for _ in 0..1 + rng.below(6) {
            t.append_step(&step()).unwrap();
        }
        t.end().unwrap();
    }
    let (obs, act, rew) = (vec![5u8; 3 * 6], vec![6i32; 3], vec![7f32; 3 * 2]);
    table
        .writer()
        .insert_batch(3, 1, &[StepValue::typed(&obs), StepValue::typed(&act), StepValue::typed(&rew)], None)
        .unwrap();
    let open = table.writer().begin(None).unwrap(); // one slot left being written
    let rl = RegionLayout::for_spec(&spec()).unwrap();
    let areas = areas(&rl);
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
    for (who, t) in [("attached", attached.as_ref().ok()), ("creator", Some(&table))] {
        let Some(t) = t else { continue };
        let config = SampleConfig::new(4, WindowSpec::last(3)).timeout(Some(call));
        let sampled = timed(case, "sample", call * 2, || {
            t.sampler(config).and_then(|mut s| s.sample().map(|b| b.keys().to_vec()))
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

/// Entry point of the child processes; does nothing in a normal run.
#[test]
fn child_entry() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap().parse::<u64>().unwrap();
    let (first, count, seed) = (var(FIRST), var(COUNT), var(SEED));
    let mut tally = Tally::default();
    for case in first..first + count {
        one_case(case, seed, &mut tally);
    }
    println!("cases {first}..{} passed: {} calls, {} errors", first + count, tally.calls, tally.errors);
}

#[test]
fn corrupted_table_files_never_hang_panic_or_signal() {
    let cases: u64 = std::env::var("GEAR_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(240);
    let seed: u64 = std::env::var("GEAR_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x6ea2);
    const PER_CHILD: u64 = 40;
    let (mut first, mut calls, mut errors) = (0, 0, 0);
    while first < cases {
        let count = PER_CHILD.min(cases - first);
        let mut c = Command::new(std::env::current_exe().unwrap())
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
            }
        }
        first += count;
    }
    eprintln!("{cases} corrupted tables: {calls} calls, {errors} refused with an error, none hung or crashed");
    // The corruption reached the calls: some were refused (a fuzz whose
    // flips changed nothing would prove nothing).
    assert!(errors > 0, "no call saw the corruption");
}
