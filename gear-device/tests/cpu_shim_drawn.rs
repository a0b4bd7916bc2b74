//! GPU selection's kernels through the CPU shim (see `cpu_shim.rs` for how
//! the shim runs CUDA sources as C++): the device mirror kept in step by
//! scatters of the changed slots only, and draws that go from the draw
//! kernel through `gear_drawn_rows` into the gather's row tables without
//! leaving the device. The inputs are what the crate's own `SlotMirror`
//! writes; the results are checked against host references.

mod common;

use common::shim::{driver, run, Reader, Writer};
use gear_core::{
    BatchLayout, ColumnSpec, DType, GatherRow, Layout, Pad, RandomSource, SelectionRule, SlotKey, TableSpec,
    WindowSpec, Xoshiro256,
};
use gear_device::drawn::{MirrorUploads, NO_KEY};
use gear_device::{plan, SlotMirror, SlotUpdate};
use std::path::PathBuf;

/// A random table (1 to 3 columns of odd and aligned sizes, T and capacity
/// small), its bytes, requested columns and a window.
fn random_table(rng: &mut Xoshiro256) -> (Layout, Vec<u8>, Vec<usize>, WindowSpec) {
    let ncols = 1 + rng.below(3) as usize;
    let columns = (0..ncols)
        .map(|i| {
            let dtype = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
            let shape: Vec<u64> = match rng.below(3) {
                0 => vec![1 + 2 * rng.below(8)],
                1 => vec![16],
                _ => vec![],
            };
            ColumnSpec::new(format!("c{i}"), dtype, shape)
        })
        .collect();
    let t = 1 + rng.below(20);
    let spec = TableSpec::new(columns, t, 1 + rng.below(40)).unwrap();
    let layout = Layout::new(&spec).unwrap();
    let data: Vec<u8> = (0..layout.total_bytes()).map(|_| rng.next_u64() as u8).collect();
    let requested = (0..1 + rng.below(3)).map(|_| rng.below(ncols as u64) as usize).collect();
    let window = WindowSpec {
        offset: rng.below(2 * t + 7) as i64 - (t as i64 + 3),
        len: 1 + rng.below(t),
        pad: if rng.below(2) == 0 { Pad::Tail } else { Pad::Head },
    };
    (layout, data, requested, window)
}

// ---------------------------------------------------------------- sync

/// The device arrays of a mirror (priority, key word, length per slot) as
/// `DeviceSlots::new` leaves them.
struct DeviceArrays {
    prio: Vec<f64>,
    keys: Vec<u64>,
    lens: Vec<u64>,
}

/// Applies one sync's uploads through the scatter kernels, as
/// `DeviceSlots::sync` launches them (priorities through
/// `DevicePriorities::set`, which keeps the last write of a slot).
fn scatter_uploads(exe: &PathBuf, dev: &mut DeviceArrays, up: &MirrorUploads) {
    let n = dev.prio.len() as u64;
    let unique = plan::last_write_wins(&up.priorities);
    let mut w = Writer::default();
    w.u(4).u(plan::grid_1d(unique.len() as u64).into()).u(plan::BLOCK.into()).u(n).u(unique.len() as u64);
    for &p in &dev.prio {
        w.f(p);
    }
    for &(s, _) in &unique {
        w.u(s.into());
    }
    for &(_, v) in &unique {
        w.f(v);
    }
    let out = run(exe, &w.0);
    let mut r = Reader(&out);
    dev.prio = (0..n).map(|_| r.f()).collect();
    for (words, pick) in [(&mut dev.keys, 1), (&mut dev.lens, 2)] {
        let m = up.rows.len() as u64;
        let mut w = Writer::default();
        w.u(6).u(3).u(32).u(n).u(m);
        for &x in words.iter() {
            w.u(x);
        }
        for r in &up.rows {
            w.u(r.0.into());
        }
        for r in &up.rows {
            w.u(if pick == 1 { r.1 } else { r.2 });
        }
        let out = run(exe, &w.0);
        let mut rd = Reader(&out);
        *words = (0..n).map(|_| rd.u()).collect();
    }
}

/// Device arrays kept in step by incremental syncs (only the slots each
/// batch of updates names) equal those a fresh mirror writes from every
/// update at once, for every rule and after a change of rule; a slot never
/// named keeps the empty state.
#[test]
fn incremental_syncs_leave_the_device_as_a_full_rebuild_would() {
    let Some(exe) = driver() else { return };
    let mut rng = Xoshiro256::seed_from_u64(0x5e4c);
    for case in 0..30 {
        let n = 1 + rng.below(50);
        let t = 1 + rng.below(30);
        let mut dev =
            DeviceArrays { prio: vec![-1.0; n as usize], keys: vec![NO_KEY; n as usize], lens: vec![0; n as usize] };
        let mut mirror = SlotMirror::new(n, t);
        let mut history: Vec<SlotUpdate> = Vec::new();
        let rules = [
            SelectionRule::Uniform,
            SelectionRule::Proportional { alpha: 0.6, beta: 0.4, stratified: true },
            SelectionRule::TopK,
        ];
        let mut rule = rules[case % 3];
        for round in 0..8 {
            if round == 5 {
                rule = rules[(case + 1) % 3];
            }
            let updates: Vec<SlotUpdate> = (0..rng.below(2 * n + 1))
                .map(|_| {
                    let slot = rng.below(n) as u32;
                    let key = (rng.below(4) != 0).then(|| SlotKey { slot, generation: rng.next_u64() as u32 });
                    let priority = [0.0, 1.5, 10.0 * rng.next_f64()][rng.below(3) as usize];
                    // Now and then a length over T: the slot must read empty.
                    SlotUpdate { slot, key, priority, len: rng.below(t + 2) }
                })
                .collect();
            let up = mirror.apply(rule, &updates).unwrap();
            if round > 0 && round != 5 {
                let mut named: Vec<u32> = updates.iter().map(|u| u.slot).collect();
                named.sort_unstable();
                named.dedup();
                assert_eq!(up.rows.len(), named.len(), "case {case} round {round}: only the named slots are written");
            }
            scatter_uploads(exe, &mut dev, &up);
            history.extend(updates);
            let full = SlotMirror::new(n, t).apply(rule, &history).unwrap();
            let mut want =
                DeviceArrays { prio: vec![f64::NAN; n as usize], keys: vec![0; n as usize], lens: vec![0; n as usize] };
            for (&(s, p), &(s2, k, l)) in full.priorities.iter().zip(&full.rows) {
                assert_eq!(s, s2);
                (want.prio[s as usize], want.keys[s as usize], want.lens[s as usize]) = (p, k, l);
            }
            assert_eq!(dev.prio, want.prio, "case {case} round {round}: priorities");
            assert_eq!(dev.keys, want.keys, "case {case} round {round}: keys");
            assert_eq!(dev.lens, want.lens, "case {case} round {round}: lengths");
            assert_eq!(mirror.held(), dev.keys.iter().filter(|&&k| k != NO_KEY).count(), "case {case}");
        }
    }
}

// ------------------------------------------------- device draws into gather

/// One pass of CudaCollector::gather_drawn through the shim: the device
/// mirror as `SlotMirror` (the crate's own bookkeeping) writes it, the
/// draw, `gear_drawn_rows`, and the gather reading the row tables the draw
/// filled. Returns the host words (key, len, probability, weight per row),
/// the kernel's lengths and the columns.
#[allow(clippy::too_many_arguments)]
fn run_drawn(
    exe: &PathBuf,
    layout: &Layout,
    data: &[u8],
    batch: &BatchLayout,
    uploads: &gear_device::drawn::MirrorUploads,
    rule: SelectionRule,
    held: usize,
    seed: u64,
    random_start: Option<u64>,
) -> (Vec<[u64; 4]>, Vec<u64>, Vec<Vec<u8>>) {
    let n = layout.capacity();
    let rows = batch.rows() as u64;
    let mut prio = vec![f64::NAN; n as usize];
    let mut keys = vec![0x1234u64; n as usize];
    let mut lens = vec![0x4321u64; n as usize];
    for &(s, p) in &uploads.priorities {
        prio[s as usize] = p;
    }
    for &(s, k, l) in &uploads.rows {
        (keys[s as usize], lens[s as usize]) = (k, l);
    }
    assert!(prio.iter().all(|p| !p.is_nan()), "the first sync writes every slot");
    let (alpha, beta, stratified, k) = match rule {
        SelectionRule::Uniform => (1.0, 0.0, false, 0),
        SelectionRule::Proportional { alpha, beta, stratified } => (alpha, beta, stratified, 0),
        SelectionRule::TopK => (1.0, 0.0, false, rows.min(held as u64)),
    };
    let (chunk_len, nchunks) = plan::prio_chunks(n);
    let (m, steps) = plan::topk_network(n);
    let mut w = Writer::default();
    w.u(5).u(3).u(32).u(n).f(alpha).f(beta).u(chunk_len).u(nchunks).u(seed).u(rows).u(stratified.into());
    // k == 0 selects proportional draws in the driver: a top-k batch with
    // nothing held draws nothing at all (no launch), as gather_drawn does.
    w.u(if rule == SelectionRule::TopK { k.max(1) } else { 0 }).u(m).u(steps.len() as u64);
    for (size, stride) in steps {
        w.u(size).u(stride);
    }
    let win = batch.window();
    w.u(random_start.is_some().into()).u(random_start.unwrap_or(0)).u(win.len).u(win.offset as u64);
    w.u(u64::from(win.pad == Pad::Head)).u(batch.columns().len() as u64).u(layout.slot_stride());
    w.u(data.len() as u64).bytes(data);
    for &p in &prio {
        w.f(p);
    }
    for (&k, &l) in keys.iter().zip(&lens) {
        w.u(k).u(l);
    }
    for (&c, &s) in batch.columns().iter().zip(batch.step_bytes()) {
        w.u(layout.offset(0, c, 0)).u(s);
    }
    let out = run(exe, &w.0);
    let mut r = Reader(&out);
    let words: Vec<u64> = (0..4 * rows).map(|_| r.u()).collect();
    let per_row = (0..rows as usize).map(|i| [0, 1, 2, 3].map(|j| words[j * rows as usize + i])).collect();
    let lengths = (0..rows).map(|_| r.u()).collect();
    let cols = (0..batch.columns().len()).map(|i| r.bytes(batch.column_bytes(i) as usize)).collect();
    assert!(r.0.is_empty(), "driver wrote trailing bytes");
    (per_row, lengths, cols)
}

#[test]
fn device_draws_feed_the_gather_without_leaving_the_device() {
    use gear_device::drawn::NO_KEY;
    use gear_device::{SlotMirror, SlotUpdate};
    let Some(exe) = driver() else { return };
    let mut rng = Xoshiro256::seed_from_u64(0xd4a3);
    let mut cut = 0;
    for case in 0..90 {
        let (layout, data, columns, base_window) = random_table(&mut rng);
        let t = layout.max_len();
        let n = layout.capacity();
        let rule = match case % 3 {
            0 => SelectionRule::Uniform,
            1 => SelectionRule::Proportional {
                alpha: [0.6, 1.0, 0.0][case / 3 % 3],
                beta: 0.4,
                stratified: case % 2 == 0,
            },
            _ => SelectionRule::TopK,
        };
        // Some slots hold nothing; priorities include zeros; a few cases
        // have nothing drawable at all.
        let empty = case % 10 == 7;
        let updates: Vec<SlotUpdate> = (0..n as u32)
            .map(|s| {
                let held = !empty && rng.below(5) != 0;
                let key = held.then(|| SlotKey { slot: s, generation: rng.next_u64() as u32 & 0xffff });
                let priority = [0.0, 0.25, 3.0, 10.0 * rng.next_f64()][rng.below(4) as usize];
                SlotUpdate { slot: s, key, priority, len: rng.below(t + 1) }
            })
            .collect();
        let mut mirror = SlotMirror::new(n, t);
        let uploads = mirror.apply(rule, &updates).unwrap();
        let random_start = (case % 4 == 1).then(|| rng.next_u64());
        let wlen = 1 + rng.below(t);
        let window = if random_start.is_some() {
            WindowSpec { offset: -(wlen as i64), len: wlen, pad: Pad::Tail }
        } else {
            base_window
        };
        let nrows = 1 + rng.below(12) as usize;
        let batch = BatchLayout::new(&layout, &columns, nrows, window).unwrap();
        let seed = rng.next_u64();
        let (got, lengths, cols) =
            run_drawn(exe, &layout, &data, &batch, &uploads, rule, mirror.held(), seed, random_start);
        // What each slot weighs, as the host strategy computes it.
        let mass = |u: &SlotUpdate| match (u.key, rule) {
            (None, _) => 0.0,
            (Some(_), SelectionRule::Proportional { alpha, .. }) if u.priority > 0.0 => u.priority.powf(alpha),
            (Some(_), SelectionRule::Proportional { .. }) => 0.0,
            (Some(_), _) => 1.0,
        };
        let total: f64 = updates.iter().map(mass).sum();
        let mmin = updates.iter().map(mass).filter(|&m| m > 0.0).fold(f64::INFINITY, f64::min);
        let mut ranking: Vec<&SlotUpdate> = updates.iter().filter(|u| u.key.is_some()).collect();
        ranking.sort_by(|a, b| b.priority.total_cmp(&a.priority).then(a.slot.cmp(&b.slot)));
        let mut rows = Vec::new();
        for (r, &[kw, len, pbits, wbits]) in got.iter().enumerate() {
            let (p, iw) = (f64::from_bits(pbits), f64::from_bits(wbits));
            if total == 0.0 {
                // Nothing drawable: keyless rows of length 0 the host redraws.
                assert_eq!((kw, len, p, iw), (NO_KEY, 0, 0.0, 0.0), "case {case} row {r}");
                rows.push(GatherRow::whole(0, 0));
                continue;
            }
            let key = SlotKey::from_u64(kw);
            let u = &updates[key.slot as usize];
            assert_eq!(u.key, Some(key), "case {case} row {r}: the row's key is its slot's");
            assert!(mass(u) > 0.0, "case {case} row {r}: slot {} cannot be drawn", key.slot);
            match rule {
                SelectionRule::TopK => {
                    let k = nrows.min(ranking.len());
                    assert_eq!(key.slot, ranking[r % k].slot, "case {case} row {r}: top-k order");
                    assert_eq!((p, iw), (1.0, 1.0));
                }
                SelectionRule::Uniform => assert_eq!((p, iw), (1.0 / mirror.held() as f64, 1.0), "case {case}"),
                SelectionRule::Proportional { beta, .. } => {
                    let m = mass(u);
                    assert!((p - m / total).abs() <= 1e-12 * (m / total), "case {case} row {r}: probability");
                    let want = (mmin / m).powf(beta);
                    assert!((iw - want).abs() <= 1e-12 * want, "case {case} row {r}: weight {iw} vs {want}");
                }
            }
            if random_start.is_some() && u.len > wlen {
                assert!((wlen..=u.len).contains(&len), "case {case} row {r}: cut {len} of {}", u.len);
                cut += usize::from(len < u.len);
            } else {
                assert_eq!(len, u.len, "case {case} row {r}: stored length");
            }
            rows.push(GatherRow::whole(key.slot, len));
        }
        // The gather read the drawn rows from the tables the draw filled.
        let (want_cols, want_lengths) = common::gather_reference(&layout, &data, &batch, &rows);
        assert_eq!(lengths, want_lengths, "case {case}: lengths");
        assert!(cols == want_cols, "case {case}: gathered bytes differ from the rows drawn ({rows:?})");
        // The same seed draws the same rows.
        let again = run_drawn(exe, &layout, &data, &batch, &uploads, rule, mirror.held(), seed, random_start);
        assert!(again.0 == got, "case {case}: the seed fixes the draws");
    }
    assert!(cut > 0, "random starts never cut a trajectory");
}
