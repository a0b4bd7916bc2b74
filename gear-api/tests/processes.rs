//! Many processes on one shared table: real processes (this test binary
//! re-run in a child role), not threads. Every sampled row is checked
//! against a pattern that encodes its trajectory and step, so torn or mixed
//! rows are caught; writers and samplers are killed with SIGKILL.

use gear_api::{AttachOptions, Error, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, RandomSource, SlotKey, SlotState, TableSpec, WindowSpec, Xoshiro256};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const OBS: usize = 64;
const WINDOW: u64 = 8;

fn spec(t: u64, capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("id", DType::I64, vec![]),
            ColumnSpec::new("step", DType::I32, vec![]),
            ColumnSpec::new("obs", DType::U8, vec![OBS as u64]),
        ],
        t,
        capacity,
    )
    .unwrap()
}

fn obs_byte(id: i64, step: i32, i: usize) -> u8 {
    (id as u64).wrapping_mul(31).wrapping_add(step as u64 * 7).wrapping_add(i as u64) as u8
}

fn append(traj: &mut gear_api::Trajectory, id: i64, step: i32) {
    let obs: Vec<u8> = (0..OBS).map(|i| obs_byte(id, step, i)).collect();
    traj.append_step(&[StepValue::typed(&[id]), StepValue::typed(&[step]), StepValue::typed(&obs)]).unwrap();
}

/// Checks every row of a batch sampled with `WindowSpec::last(WINDOW)`:
/// one trajectory per row, consecutive steps, pattern bytes, zero padding.
fn check_batch(batch: &gear_api::SampledBatch) -> Result<(), String> {
    let ids: &[i64] = batch.column("id").unwrap().as_slice().unwrap();
    let steps: &[i32] = batch.column("step").unwrap().as_slice().unwrap();
    let obs = batch.column("obs").unwrap().bytes;
    let w = WINDOW as usize;
    for (r, &n) in batch.lengths().iter().enumerate() {
        let pad = w - n as usize;
        let first = r * w + pad;
        for j in 0..w {
            let at = r * w + j;
            let o = &obs[at * OBS..(at + 1) * OBS];
            if j < pad {
                if ids[at] != 0 || steps[at] != 0 || o.iter().any(|&b| b != 0) {
                    return Err(format!("row {r} step {j}: padding is not zero"));
                }
                continue;
            }
            let (id, step) = (ids[at], steps[at]);
            if id != ids[first] || step != steps[first] + (j - pad) as i32 {
                return Err(format!(
                    "row {r} step {j}: id {id} step {step} after id {} step {}",
                    ids[first], steps[first]
                ));
            }
            if let Some(i) = (0..OBS).find(|&i| o[i] != obs_byte(id, step, i)) {
                return Err(format!("row {r} step {j}: obs byte {i} is torn (id {id} step {step})"));
            }
        }
    }
    Ok(())
}

/// Steps of an item row: the items' windows are at most this long.
const ITEM_WINDOW: u64 = 4;

/// A table of items: windows of `ITEM_WINDOW` steps every 2, the tail
/// included.
fn item_table(name: &str, t: u64, capacity: u64) -> ReplayTable {
    ReplayTable::builder(spec(t, capacity).with_items_per_trajectory(t).unwrap())
        .shared_memory(name)
        .item_pattern(gear_api::ItemPattern::Windows { len: ITEM_WINDOW, stride: 2, tail: true })
        .build()
        .unwrap()
}

/// Checks every row of an item batch sampled with
/// `WindowSpec::first(ITEM_WINDOW)`: one trajectory per row, consecutive
/// steps from the row's start, pattern bytes, zero padding after.
fn check_item_batch(batch: &gear_api::SampledBatch) -> Result<(), String> {
    let ids: &[i64] = batch.column("id").unwrap().as_slice().unwrap();
    let steps: &[i32] = batch.column("step").unwrap().as_slice().unwrap();
    let obs = batch.column("obs").unwrap().bytes;
    let w = ITEM_WINDOW as usize;
    for (r, &n) in batch.lengths().iter().enumerate() {
        if !batch.keys()[r].is_item() {
            return Err(format!("row {r}: key {} is not an item's", batch.keys()[r]));
        }
        if n == 0 || i64::from(steps[r * w]) != batch.starts()[r] as i64 {
            return Err(format!("row {r}: {n} steps from step {}, start {}", steps[r * w], batch.starts()[r]));
        }
        for j in 0..w {
            let at = r * w + j;
            let o = &obs[at * OBS..(at + 1) * OBS];
            if j >= n as usize {
                if ids[at] != 0 || steps[at] != 0 || o.iter().any(|&b| b != 0) {
                    return Err(format!("row {r} step {j}: padding is not zero"));
                }
                continue;
            }
            let (id, step) = (ids[at], steps[at]);
            if id != ids[r * w] || step != steps[r * w] + j as i32 {
                return Err(format!(
                    "row {r} step {j}: id {id} step {step} after id {} step {}",
                    ids[r * w],
                    steps[r * w]
                ));
            }
            if let Some(i) = (0..OBS).find(|&i| o[i] != obs_byte(id, step, i)) {
                return Err(format!("row {r} step {j}: obs byte {i} is torn (id {id} step {step})"));
            }
        }
    }
    Ok(())
}

const ROLE: &str = "GEAR_TEST_CHILD_ROLE";
const TABLE: &str = "GEAR_TEST_CHILD_TABLE";
const ARG: &str = "GEAR_TEST_CHILD_ARG";

/// Entry point of every child process; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    if role == "server" {
        return; // see child_server
    }
    let name = std::env::var(TABLE).unwrap();
    let arg: u64 = std::env::var(ARG).ok().and_then(|a| a.parse().ok()).unwrap_or(0);
    let table = ReplayTable::attach(&name, AttachOptions::default()).unwrap();
    let t_max = table.spec().max_len();
    match role.as_str() {
        // Writes trajectories of random length for `arg` milliseconds.
        "writer" => {
            let idx = std::process::id() as i64;
            let mut rng = Xoshiro256::seed_from_u64(idx as u64);
            let deadline = Instant::now() + Duration::from_millis(arg);
            let mut n = 0i64;
            let writer = table.writer().with_timeout(Duration::from_secs(10));
            while Instant::now() < deadline {
                n += 1;
                let id = idx << 32 | n;
                let mut traj = writer.begin(None).unwrap();
                for s in 0..1 + rng.below(t_max) as i32 {
                    append(&mut traj, id, s);
                }
                traj.end().unwrap();
            }
            println!("writer wrote {n}");
        }
        // Samples and checks batches for `arg` milliseconds.
        "sampler" => {
            let deadline = Instant::now() + Duration::from_millis(arg);
            let mut sampler = table
                .sampler(SampleConfig::new(16, WindowSpec::last(WINDOW)).timeout(Some(Duration::from_secs(10))))
                .unwrap();
            let mut rows = 0;
            while Instant::now() < deadline {
                let batch = sampler.sample().unwrap();
                if let Err(e) = check_batch(batch) {
                    panic!("integrity: {e}");
                }
                rows += batch.rows();
            }
            println!("sampler checked {rows}");
        }
        // Begins a trajectory, publishes `arg` steps, and waits to be killed.
        "hang-writer" => {
            let mut traj = table.writer().begin(Some(2.0)).unwrap();
            for s in 0..arg as i32 {
                append(&mut traj, 7_000 + arg as i64, s);
            }
            println!("ready {} {}", traj.key().slot, traj.key().generation);
            std::thread::sleep(Duration::from_secs(60));
        }
        // Samples item rows (`WindowSpec::first(ITEM_WINDOW)`) and checks
        // each against its item's window for `arg` milliseconds.
        "item-sampler" => {
            let deadline = Instant::now() + Duration::from_millis(arg);
            let mut sampler = table
                .sampler(SampleConfig::new(16, WindowSpec::first(ITEM_WINDOW)).timeout(Some(Duration::from_secs(10))))
                .unwrap();
            let mut rows = 0;
            while Instant::now() < deadline {
                let batch = sampler.sample().unwrap();
                if let Err(e) = check_item_batch(batch) {
                    panic!("integrity: {e}");
                }
                rows += batch.rows();
            }
            println!("item-sampler checked {rows}");
        }
        // Begins a trajectory, publishes `arg % 100` steps, adds items over
        // steps 0..2 and 1..3 when `arg >= 100`, writes one more step of
        // one column only (not published), and waits to be killed.
        "item-hang-writer" => {
            let mut traj = table.writer().begin(None).unwrap();
            let id = 9_000 + arg as i64;
            for s in 0..(arg % 100) as i32 {
                append(&mut traj, id, s);
            }
            if arg >= 100 {
                traj.add_item(0, 2, Some(3.0)).unwrap();
                traj.add_item(1, 2, None).unwrap();
            }
            traj.append_column("id", 1, StepValue::typed(&[id])).unwrap();
            println!("ready {} {}", traj.key().slot, traj.key().generation);
            std::thread::sleep(Duration::from_secs(60));
        }
        // Sets every priority to 0 except slot `arg`'s (100).
        "reprioritize" => {
            let mut s = table.sampler(SampleConfig::new(64, WindowSpec::last(1))).unwrap();
            let keys: std::collections::BTreeSet<SlotKey> = s.sample().unwrap().keys().iter().copied().collect();
            let updates: Vec<(SlotKey, f64)> =
                keys.iter().map(|k| (*k, if u64::from(k.slot) == arg { 100.0 } else { 0.0 })).collect();
            assert_eq!(table.update_priorities(&updates).unwrap(), keys.len());
            println!("reprioritized {}", keys.len());
        }
        // Begins a trajectory on a full queue: waits until killed.
        "blocked-writer" => {
            println!("ready 0 0");
            let _ = table.writer().with_timeout(Duration::from_secs(60)).begin(None);
        }
        // Samples large batches until killed.
        "sampler-loop" => {
            let mut sampler = table
                .sampler(SampleConfig::new(64, WindowSpec::last(WINDOW)).timeout(Some(Duration::from_secs(60))))
                .unwrap();
            println!("ready 0 0");
            loop {
                let _ = sampler.sample();
            }
        }
        other => panic!("unknown child role {other}"),
    }
}

fn spawn(role: &str, table: &str, arg: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(TABLE, table)
        .env(ARG, arg.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the child's stdout until its `ready SLOT GEN` line (30 s at most,
/// so a stuck child fails the test instead of hanging it).
fn wait_ready(child: &mut Child) -> SlotKey {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // libtest prints "test child_entry ... " before the test's output.
            if let Some(rest) = line.split("ready ").nth(1) {
                let mut it = rest.split(' ').map(|x| x.parse::<u32>().unwrap());
                let _ = tx.send(SlotKey { slot: it.next().unwrap(), generation: it.next().unwrap() });
                return;
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(key) => key,
        Err(_) => {
            let _ = child.kill();
            panic!("child was not ready within 30 s (or ended first)");
        }
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

fn finish(child: Child, role: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{role} failed:\n{text}");
    text
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("gear-proc-{prefix}-{}-{nanos}", std::process::id())
}

#[test]
fn four_writer_and_two_sampler_processes_never_see_torn_rows() {
    let name = unique("stress");
    // A small table so slots are evicted and reused while samplers copy.
    let table = ReplayTable::builder(spec(24, 48)).shared_memory(&name).sample_while_writing(true).build().unwrap();
    // `cargo xtask soak` runs this for longer through GEAR_STRESS_MS.
    let run_ms = std::env::var("GEAR_STRESS_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2500);
    let writers: Vec<Child> = (0..4).map(|_| spawn("writer", &name, run_ms)).collect();
    let samplers: Vec<Child> = (0..2).map(|_| spawn("sampler", &name, run_ms)).collect();
    let mut written = 0u64;
    for w in writers {
        let text = finish(w, "writer");
        written += text.lines().find_map(|l| l.split("writer wrote ").nth(1)).unwrap().trim().parse::<u64>().unwrap();
    }
    let mut checked = 0u64;
    for s in samplers {
        let text = finish(s, "sampler");
        checked +=
            text.lines().find_map(|l| l.split("sampler checked ").nth(1)).unwrap().trim().parse::<u64>().unwrap();
    }
    let info = table.info().unwrap();
    eprintln!("stress: {written} trajectories written, {checked} rows checked, {} evictions", info.evictions);
    assert_eq!(info.inserts, written, "every committed trajectory is counted once");
    assert!(written > 100 && checked > 100, "too little work to mean anything: {written} written, {checked} rows");
    assert!(info.evictions > 0, "the stress must reuse slots");
    assert_eq!(info.slots.writing, 0);
    // The creator can still sample what the writers left, and it checks out.
    let mut sampler = table.sampler(SampleConfig::new(16, WindowSpec::last(WINDOW))).unwrap();
    check_batch(sampler.sample().unwrap()).unwrap();
}

#[test]
fn a_killed_writer_loses_only_unpublished_steps_and_its_slot_is_reused() {
    let name = unique("killw");
    let table = ReplayTable::builder(spec(16, 3)).shared_memory(&name).build().unwrap();
    let mut with_steps = spawn("hang-writer", &name, 5);
    let k5 = wait_ready(&mut with_steps);
    let mut empty = spawn("hang-writer", &name, 0);
    let k0 = wait_ready(&mut empty);
    kill(&mut with_steps);
    kill(&mut empty);
    assert_eq!(table.reclaim_dead().unwrap(), 2);
    let info = table.info().unwrap();
    assert_eq!((info.reclaimed, info.size, info.inserts), (2, 1, 1));
    assert_eq!(info.slots.writing, 0);
    // The five published steps survive as a committed trajectory.
    let mut sampler = table.sampler(SampleConfig::new(4, WindowSpec::last(WINDOW)).timeout(None)).unwrap();
    let batch = sampler.sample().unwrap();
    assert!(batch.keys().iter().all(|k| *k == k5));
    assert_eq!(batch.lengths(), &[5; 4]);
    check_batch(batch).unwrap();
    // The empty one's slot is free again, and the table keeps serving:
    // writing three more evicts the reclaimed trajectory and reuses its slot.
    let w = table.writer();
    let mut slots = Vec::new();
    for id in 1..=3 {
        let mut t = w.begin(None).unwrap();
        append(&mut t, id, 0);
        slots.push(t.end().unwrap());
    }
    assert!(slots.iter().any(|k| k.slot == k0.slot && k.generation > k0.generation));
    assert!(slots.iter().any(|k| k.slot == k5.slot && k.generation > k5.generation));
}

#[test]
fn dead_writers_holding_every_slot_are_reclaimed_by_the_next_writer() {
    let name = unique("fullw");
    let table = ReplayTable::builder(spec(16, 2)).shared_memory(&name).build().unwrap();
    let mut kids: Vec<Child> = (0..2).map(|_| spawn("hang-writer", &name, 0)).collect();
    for k in &mut kids {
        wait_ready(k);
    }
    for k in &mut kids {
        kill(k);
    }
    // No explicit reclaim: begin finds no free slot, nothing to evict, scans.
    let mut t = table.writer().begin(None).unwrap();
    append(&mut t, 1, 0);
    t.end().unwrap();
    assert_eq!(table.info().unwrap().reclaimed, 2);
}

#[test]
fn a_sampler_killed_mid_sample_leaves_nothing_pinned() {
    let name = unique("kills");
    let table = ReplayTable::builder(spec(16, 32)).shared_memory(&name).max_times_sampled(2).build().unwrap();
    let w = table.writer();
    let mut id = 0;
    for round in 0..4 {
        for _ in 0..32 {
            id += 1;
            let mut t = w.begin(None).unwrap();
            for s in 0..8 {
                append(&mut t, id, s);
            }
            t.end().unwrap();
        }
        let mut child = spawn("sampler-loop", &name, 0);
        wait_ready(&mut child);
        std::thread::sleep(Duration::from_millis(20 + 15 * round));
        kill(&mut child);
    }
    table.reclaim_dead().unwrap();
    let info = table.info().unwrap();
    assert_eq!(info.slots.retiring, 0, "no slot stays pinned by a dead sampler");
    assert_eq!(info.slots.free + info.slots.committed, 32);
    assert_eq!(info.size, info.slots.committed);
    // The table still serves: write, sample, check.
    for _ in 0..4 {
        id += 1;
        let mut t = w.begin(None).unwrap();
        for s in 0..8 {
            append(&mut t, id, s);
        }
        t.end().unwrap();
    }
    let mut sampler = table.sampler(SampleConfig::new(4, WindowSpec::last(WINDOW))).unwrap();
    check_batch(sampler.sample().unwrap()).unwrap();
}

#[test]
fn attaching_to_what_is_not_a_table_is_a_clear_error() {
    let dir = std::env::temp_dir().join(unique("bad"));
    std::fs::create_dir_all(&dir).unwrap();
    let opts = || AttachOptions { dir: Some(dir.clone()), ..Default::default() };
    let msg = |name: &str| ReplayTable::attach(name, opts()).unwrap_err().to_string();
    std::fs::write(dir.join("garbage"), vec![0x5a; 8192]).unwrap();
    assert!(msg("garbage").contains("bad magic"), "{}", msg("garbage"));
    // A real table, then truncated, then with its version changed.
    let table = ReplayTable::builder(spec(8, 4))
        .pool(gear_api::PoolConfig::Shared { name: "real".into(), dir: Some(dir.clone()) })
        .build()
        .unwrap();
    let bytes = std::fs::read(dir.join("real")).unwrap();
    std::fs::write(dir.join("short"), &bytes[..bytes.len() / 2]).unwrap();
    assert!(msg("short").contains("truncated"), "{}", msg("short"));
    let mut v = bytes.clone();
    v[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(dir.join("future"), &v).unwrap();
    assert!(msg("future").contains("version 99"), "{}", msg("future"));
    std::fs::write(dir.join("tiny"), b"GEAR").unwrap();
    assert!(msg("tiny").contains("too small"), "{}", msg("tiny"));
    assert!(msg("absent").contains("not found"));
    assert!(msg("../etc").contains("invalid shared memory name"));
    drop(table);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_writer_waiting_in_another_process_is_listed_until_it_dies() {
    let name = format!("gear-test-waits-{}", std::process::id());
    let table = ReplayTable::builder(spec(8, 4)).queue(2).unwrap().shared_memory(&name).build().unwrap();
    for id in 1..=2 {
        let mut t = table.writer().begin(None).unwrap();
        append(&mut t, id, 0);
        t.end().unwrap();
    }
    let mut child = spawn("blocked-writer", &name, 0);
    wait_ready(&mut child);
    let listed = |table: &ReplayTable| table.info().unwrap().waiting;
    let start = Instant::now();
    while listed(&table).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20), "the child's wait was never listed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let w = listed(&table);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        (w[0].role, w[0].reason, w[0].pid),
        (gear_api::WaitRole::Writer, gear_api::WaitReason::FullTable, child.id())
    );
    // A process killed while waiting leaves an entry that reads as dead.
    kill(&mut child);
    assert!(listed(&table).is_empty(), "a dead process's wait is not listed: {:?}", listed(&table));
}

#[test]
fn a_closed_or_dead_server_gives_attached_processes_a_clear_error() {
    let name = unique("server");
    let table = ReplayTable::builder(spec(8, 4)).shared_memory(&name).build().unwrap();
    let attached = ReplayTable::attach(&name, AttachOptions::default()).unwrap();
    let mut s = attached.sampler(SampleConfig::new(1, WindowSpec::last(4)).timeout(None)).unwrap();
    let waiter = std::thread::spawn(move || s.sample().map(|_| ()));
    std::thread::sleep(Duration::from_millis(50));
    drop(table); // the creator goes away: the table closes
    assert!(matches!(waiter.join().unwrap(), Err(Error::Closed)));
    assert!(matches!(attached.writer().begin(None).map(|_| ()), Err(Error::Closed)));
}

#[test]
fn writing_after_end_is_refused_and_changes_nothing() {
    let table = ReplayTable::builder(spec(4, 2)).build().unwrap();
    let mut t = table.writer().begin(None).unwrap();
    append(&mut t, 1, 0);
    let key = t.end().unwrap();
    let e = t
        .append_step(&[StepValue::typed(&[1i64]), StepValue::typed(&[1i32]), StepValue::typed(&[0u8; OBS])])
        .unwrap_err();
    assert!(e.to_string().contains("already ended"), "{e}");
    assert!(t.end().is_err());
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts), (1, 1));
    assert_eq!(table.spec().columns().len(), 3);
    let _ = (key, SlotState::Committed);
}

#[test]
fn priority_updates_from_another_process_steer_sampling_here() {
    let name = unique("prio");
    let table = ReplayTable::builder(spec(4, 16))
        .shared_memory(&name)
        .sampler_kind(
            gear_sampler::StrategyKind::Prioritized,
            gear_sampler::StrategyParams { alpha: 1.0, beta: 0.4, stratified: true },
        )
        .build()
        .unwrap();
    let w = table.writer();
    let mut keys = Vec::new();
    for id in 1..=8 {
        let mut t = w.begin(Some(1.0)).unwrap();
        append(&mut t, id, 0);
        keys.push(t.end().unwrap());
    }
    // The child zeroes every priority but the fifth trajectory's.
    let child = spawn("reprioritize", &name, u64::from(keys[4].slot));
    finish(child, "reprioritize");
    let mut sampler = table.sampler(SampleConfig::new(64, WindowSpec::last(1))).unwrap();
    let batch = sampler.sample().unwrap();
    assert!(batch.keys().iter().all(|k| *k == keys[4]), "only the re-prioritized item is drawn: {:?}", batch.keys());
    assert!(batch.probabilities().iter().all(|&p| (p - 1.0).abs() < 1e-12));
}

#[test]
fn a_killed_server_gives_waiters_a_clear_error_and_its_table_can_be_recreated() {
    let name = unique("killsrv");
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_server", "--nocapture", "--test-threads=1"])
        .env(ROLE, "server")
        .env(TABLE, &name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_ready(&mut server);
    let attached = ReplayTable::attach(&name, AttachOptions::default()).unwrap();
    let mut s = attached.sampler(SampleConfig::new(1, WindowSpec::last(4)).timeout(None)).unwrap();
    let waiter = std::thread::spawn(move || s.sample().map(|_| ()));
    std::thread::sleep(Duration::from_millis(50));
    kill(&mut server);
    assert!(matches!(waiter.join().unwrap(), Err(Error::ServerGone { .. })), "a waiter learns the server died");
    assert!(matches!(ReplayTable::attach(&name, AttachOptions::default()), Err(Error::ServerGone { .. })));
    // The dead server's file is still there; creating the table again
    // replaces it.
    let again = ReplayTable::builder(spec(8, 4)).shared_memory(&name).build().unwrap();
    assert_eq!(again.info().unwrap().inserts, 0);
}

/// The server child of the test above: creates the table, waits to be killed.
#[test]
fn child_server() {
    if std::env::var(ROLE).as_deref() != Ok("server") {
        return;
    }
    let name = std::env::var(TABLE).unwrap();
    let _table = ReplayTable::builder(spec(8, 4)).shared_memory(&name).build().unwrap();
    println!("ready 0 0");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn item_writers_and_samplers_in_separate_processes_never_see_torn_rows() {
    let name = unique("items");
    // Small: trajectories (and so their items) are evicted and their slots
    // reused while samplers copy items of them.
    let table = item_table(&name, 12, 24);
    let run_ms = std::env::var("GEAR_STRESS_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let writers: Vec<Child> = (0..2).map(|_| spawn("writer", &name, run_ms)).collect();
    let samplers: Vec<Child> = (0..2).map(|_| spawn("item-sampler", &name, run_ms)).collect();
    let mut written = 0u64;
    for w in writers {
        let text = finish(w, "writer");
        written += text.lines().find_map(|l| l.split("writer wrote ").nth(1)).unwrap().trim().parse::<u64>().unwrap();
    }
    let mut checked = 0u64;
    for s in samplers {
        let text = finish(s, "item-sampler");
        checked +=
            text.lines().find_map(|l| l.split("item-sampler checked ").nth(1)).unwrap().trim().parse::<u64>().unwrap();
    }
    let info = table.info().unwrap();
    eprintln!("items: {written} trajectories written, {checked} item rows checked, {} evictions", info.evictions);
    assert!(written > 100 && checked > 100, "too little work to mean anything: {written} written, {checked} rows");
    assert!(info.evictions > 0, "the stress must reuse slots");
    assert!(info.inserts >= written, "every trajectory has at least one item (the tail window)");
    // What the writers left is consistent: the table's size is its
    // committed trajectories' live items, each of them sampled back right.
    let mut sampler = table.sampler(SampleConfig::new(64, WindowSpec::first(ITEM_WINDOW))).unwrap();
    check_item_batch(sampler.sample().unwrap()).unwrap();
}

#[test]
fn a_writer_killed_before_adding_items_leaves_the_pattern_over_its_published_steps() {
    let name = unique("itemkill");
    let table = item_table(&name, 16, 4);
    let mut child = spawn("item-hang-writer", &name, 5);
    let traj = wait_ready(&mut child);
    kill(&mut child);
    assert_eq!(table.reclaim_dead().unwrap(), 1);
    // Five steps published (the sixth, of one column, was not): windows
    // 0..4 and the tail 2..5; none reaches past step 5.
    let items = table.items_of(traj).unwrap();
    assert_eq!(items.iter().map(|i| (i.start, i.len)).collect::<Vec<_>>(), vec![(0, 4), (2, 3)]);
    assert_eq!(table.info().unwrap().size, 2);
    let mut sampler = table.sampler(SampleConfig::new(32, WindowSpec::first(ITEM_WINDOW))).unwrap();
    let batch = sampler.sample().unwrap();
    check_item_batch(batch).unwrap();
    assert!(batch.keys().iter().all(|k| items.iter().any(|i| i.key == *k)));
}

#[test]
fn a_writer_killed_after_adding_items_keeps_exactly_those_and_no_dangling_one() {
    let name = unique("itemkill2");
    let table = item_table(&name, 16, 2);
    let mut child = spawn("item-hang-writer", &name, 103);
    let traj = wait_ready(&mut child);
    // Counted while the writer lives: once it is dead, any call that takes
    // the lock may reclaim its slot (the background slice).
    assert_eq!(table.info().unwrap().size, 0, "pending items are not selectable");
    kill(&mut child);
    assert_eq!(table.reclaim_dead().unwrap(), 1);
    let items = table.items_of(traj).unwrap();
    assert_eq!(items.iter().map(|i| (i.start, i.len, i.priority)).collect::<Vec<_>>()[0], (0, 2, 3.0));
    assert_eq!(items.iter().map(|i| (i.start, i.len)).collect::<Vec<_>>(), vec![(0, 2), (1, 2)]);
    let mut sampler = table.sampler(SampleConfig::new(16, WindowSpec::first(ITEM_WINDOW))).unwrap();
    check_item_batch(sampler.sample().unwrap()).unwrap();
    // Writing two more trajectories evicts the reclaimed one and its items:
    // their keys are stale, nothing of them is drawn again.
    let w = table.writer();
    for id in 1..=2 {
        let mut t = w.begin(None).unwrap();
        for s in 0..4 {
            append(&mut t, id, s);
        }
        t.end().unwrap();
    }
    assert!(table.items_of(traj).unwrap().is_empty());
    let stale: Vec<(SlotKey, f64)> = items.iter().map(|i| (i.key, 1.0)).collect();
    assert_eq!(table.update_priorities(&stale).unwrap(), 0);
    let batch = sampler.sample().unwrap();
    check_item_batch(batch).unwrap();
    assert!(batch.keys().iter().all(|k| items.iter().all(|i| i.key != *k)));
}
