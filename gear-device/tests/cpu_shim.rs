//! The kernels' per-thread logic, checked on the CPU: g++ compiles the very
//! sources NVRTC compiles (gear-device/kernels/*.cu) against a host shim
//! (cpu/shim.h) that turns the CUDA built-ins into thread-local globals and a
//! launch into nested loops over blocks and threads. A small driver
//! (tests/shim/driver.cpp) runs them on inputs this file writes, with the
//! launch plans the crate itself builds, and the results are compared with
//! CPU references of the contracts.
//!
//! The shim runs simulated threads one after another, so it is faithful for
//! kernels without block-level synchronisation, shared memory or atomics,
//! which no kernel here uses. Needs g++ (or $CXX); without it the tests
//! print "skipped: no C++ compiler" unless GEAR_REQUIRE_CXX=1.

mod common;

use common::shim::{driver, run, Reader, Writer};
use gear_core::{
    BatchLayout, ColumnSpec, DType, GatherRow, Layout, Pad, RandomSource, TableSpec, WindowSpec, Xoshiro256,
};
use gear_device::plan;
use std::path::PathBuf;

// ---------------------------------------------------------------- gather

struct GatherCase {
    layout: Layout,
    data: Vec<u8>,
    batch: BatchLayout,
    rows: Vec<GatherRow>,
    /// Table slots with a copy in the cache area (the table's bytes of those
    /// slots are poisoned in the blob, so only the cache can supply them).
    cached_slots: Vec<u32>,
    blob_mis: u64,
    dst_mis: Vec<u64>,
    grid: Option<(u32, u32, u32)>,
}

/// Sends the case through the crate's own plan and the driver; returns the
/// kernel's lengths and column buffers, and per copy its path (for
/// coverage): 16 for aligned words, 17 for realigned words, 1 for bytes
/// only.
fn run_gather(exe: &PathBuf, case: &GatherCase) -> (Vec<Vec<u8>>, Vec<u64>, Vec<u64>) {
    let stride = case.layout.slot_stride();
    let table_bytes = case.layout.total_bytes();
    let mut blob = case.data.clone();
    let mut cached = vec![None; case.rows.len()];
    for (e, &slot) in case.cached_slots.iter().enumerate() {
        let range = (u64::from(slot) * stride) as usize..(u64::from(slot + 1) * stride) as usize;
        blob.extend_from_slice(&case.data[range.clone()]);
        blob[range].fill(0xEE);
        for (r, row) in case.rows.iter().enumerate() {
            if row.slot == slot {
                cached[r] = Some(table_bytes + e as u64 * stride);
            }
        }
    }
    let dst0 = vec![0u64; case.batch.columns().len()];
    let p = plan::plan_gather(&case.layout, &case.batch, &case.rows, 0, &dst0, &cached).unwrap();
    assert_eq!(p.cached_rows, cached.iter().flatten().count());
    let (gx, gy, bx) = case.grid.unwrap_or((p.grid.0, p.grid.1, plan::BLOCK));
    let mut w = Writer::default();
    w.u(1)
        .u(gx.into())
        .u(gy.into())
        .u(bx.into())
        .u(p.rows)
        .u(p.ncols)
        .u(p.w_offset as u64)
        .u(p.w_len)
        .u(p.pad_head.into());
    w.u(blob.len() as u64).u(case.blob_mis).bytes(&blob);
    for &word in &p.words {
        w.u(word);
    }
    for &m in &case.dst_mis {
        w.u(m);
    }
    let out = run(exe, &w.0);
    let mut r = Reader(&out);
    let lengths: Vec<u64> = (0..case.rows.len()).map(|_| r.u()).collect();
    let counted = (r.u(), r.u());
    let cols = (0..case.batch.columns().len()).map(|i| r.bytes(case.batch.column_bytes(i) as usize)).collect();
    assert!(r.0.is_empty(), "driver wrote trailing bytes");
    // The plan's copy shapes, on the addresses the driver used (bases 64-byte
    // aligned plus the misalignments), must predict the loads the kernel
    // counted: the kernel really moves those words 16 bytes at a time.
    let mut shifted = p.clone();
    for word in &mut shifted.words[..case.rows.len()] {
        *word += case.blob_mis;
    }
    for (i, m) in case.dst_mis.iter().enumerate() {
        shifted.words[p.cols_at() + 3 * i + 2] = *m;
    }
    let shapes = plan::copy_shapes(&shifted);
    let predicted = shapes.iter().fold((0, 0), |(a, b), s| (a + s.loads().0, b + s.loads().1));
    assert_eq!(counted, predicted, "source loads (1-byte, 16-byte) counted by the shim vs the plan");
    let widths = shapes
        .iter()
        .map(|s| {
            if s.words == 0 {
                1
            } else if s.realigned {
                17
            } else {
                16
            }
        })
        .collect();
    (cols, lengths, widths)
}

fn random_case(rng: &mut Xoshiro256) -> GatherCase {
    let ncols = 1 + rng.below(4) as usize;
    let columns = (0..ncols)
        .map(|i| {
            let dtype = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
            // Mix odd sizes (byte tail only), 16-multiples and long rows.
            let shape: Vec<u64> = match rng.below(4) {
                0 => vec![1 + 2 * rng.below(8)],
                1 => vec![16],
                2 => vec![3, 1 + rng.below(7)],
                _ => vec![],
            };
            ColumnSpec::new(format!("c{i}"), dtype, shape)
        })
        .collect();
    let t = 1 + rng.below(24);
    let capacity = 1 + rng.below(8);
    let spec = TableSpec::new(columns, t, capacity).unwrap();
    let layout = Layout::new(&spec).unwrap();
    let data: Vec<u8> = (0..layout.total_bytes()).map(|_| rng.next_u64() as u8).collect();
    let wlen = 1 + rng.below(t);
    let offset = rng.below(2 * t + 7) as i64 - (t as i64 + 3);
    let pad = if rng.below(2) == 0 { Pad::Tail } else { Pad::Head };
    let window = WindowSpec { offset, len: wlen, pad };
    let nreq = 1 + rng.below(4) as usize;
    let req: Vec<usize> = (0..nreq).map(|_| rng.below(ncols as u64) as usize).collect();
    let nrows = rng.below(10) as usize;
    let batch = BatchLayout::new(&layout, &req, nrows, window).unwrap();
    // Whole trajectories and items (windows starting inside the slot).
    let rows: Vec<GatherRow> = (0..nrows)
        .map(|_| {
            let slot = rng.below(capacity) as u32;
            match rng.below(2) {
                0 => GatherRow::whole(slot, rng.below(t + 1)),
                _ => {
                    let start = rng.below(t + 1);
                    GatherRow { slot, start: start as u32, len: rng.below(t - start + 1) }
                }
            }
        })
        .collect();
    let cached_slots: Vec<u32> = (0..capacity as u32).filter(|_| rng.below(3) == 0).collect();
    let grid = match rng.below(3) {
        0 => None,
        1 => Some((1 + rng.below(3) as u32, 1 + rng.below(3) as u32, [1, 7, 32][rng.below(3) as usize])),
        _ => Some((1 + rng.below(40) as u32, 1, 64)),
    };
    GatherCase {
        layout,
        data,
        batch,
        rows,
        cached_slots,
        blob_mis: rng.below(16),
        dst_mis: (0..nreq).map(|_| rng.below(16)).collect(),
        grid,
    }
}

#[test]
fn gather_matches_the_collector_contract_on_random_cases() {
    let Some(exe) = driver() else { return };
    let mut rng = Xoshiro256::seed_from_u64(0x6ea2);
    let mut widths = std::collections::BTreeMap::new();
    for i in 0..300 {
        let case = random_case(&mut rng);
        let (cols, lengths, w) = run_gather(exe, &case);
        let (want_cols, want_lengths) = common::gather_reference(&case.layout, &case.data, &case.batch, &case.rows);
        assert_eq!(lengths, want_lengths, "case {i}: lengths ({:?})", case.batch.window());
        for (c, (got, want)) in cols.iter().zip(&want_cols).enumerate() {
            assert!(
                got == want,
                "case {i}: column {c} differs (window {:?}, rows {:?})",
                case.batch.window(),
                case.rows
            );
        }
        for x in w {
            *widths.entry(x).or_insert(0u32) += 1;
        }
    }
    // Every copy path (aligned 16-byte words, realigned words, bytes only)
    // was exercised.
    for width in [16, 17, 1] {
        assert!(widths.get(&width).copied().unwrap_or(0) >= 20, "copy width {width} rarely hit: {widths:?}");
    }
}

#[test]
fn gather_edge_windows() {
    let Some(exe) = driver() else { return };
    let spec =
        TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, [37]), ColumnSpec::new("act", DType::F32, [4])], 16, 3)
            .unwrap();
    let layout = Layout::new(&spec).unwrap();
    let data: Vec<u8> = (0..layout.total_bytes()).map(|i| (i * 7 + 3) as u8).collect();
    let windows = [
        WindowSpec { offset: i64::MIN, len: 5, pad: Pad::Head },
        WindowSpec { offset: i64::MAX, len: 5, pad: Pad::Tail },
        WindowSpec { offset: -1, len: 16, pad: Pad::Head },
        WindowSpec { offset: 15, len: 16, pad: Pad::Tail },
        WindowSpec::whole(16),
        WindowSpec::last(16),
    ];
    for window in windows {
        for rows in [vec![], vec![GatherRow::whole(2, 0)], vec![GatherRow::whole(1, 16); 3]] {
            let batch = BatchLayout::new(&layout, &[1, 0, 1], rows.len(), window).unwrap();
            let case = GatherCase {
                layout: layout.clone(),
                data: data.clone(),
                batch,
                rows,
                cached_slots: vec![1],
                blob_mis: 5,
                dst_mis: vec![0, 3, 8],
                grid: None,
            };
            let (cols, lengths, _) = run_gather(exe, &case);
            let (want_cols, want_lengths) = common::gather_reference(&case.layout, &case.data, &case.batch, &case.rows);
            assert_eq!((cols, lengths), (want_cols, want_lengths), "{window:?}");
        }
    }
}

// ---------------------------------------------------------------- sampling

struct SampleOut {
    prefix: Vec<f64>,
    total: f64,
    wmin: f64,
    draws: Vec<(u32, f64, f64)>,
}

fn run_sample(
    exe: &PathBuf,
    prio: &[f64],
    alpha: f64,
    beta: f64,
    seed: u64,
    draws: u64,
    stratified: bool,
) -> SampleOut {
    let n = prio.len() as u64;
    let (chunk_len, nchunks) = plan::prio_chunks(n);
    let mut w = Writer::default();
    w.u(2).u(plan::grid_1d(nchunks).into()).u(plan::BLOCK.into()).u(n).f(alpha).f(beta);
    w.u(chunk_len).u(nchunks).u(seed).u(draws).u(stratified.into()).u(plan::grid_1d(draws).into());
    for &p in prio {
        w.f(p);
    }
    let out = run(exe, &w.0);
    let mut r = Reader(&out);
    let prefix = (0..n).map(|_| r.f()).collect();
    let (total, wmin) = (r.f(), r.f());
    let draws = (0..draws).map(|_| (r.u() as u32, r.f(), r.f())).collect();
    SampleOut { prefix, total, wmin, draws }
}

/// The mass of a slot: none without an item or with a zero priority (even
/// for alpha = 0, where `0^0` would be 1: the host strategies give zero
/// priorities no mass), else `p^alpha`.
fn weight(p: f64, alpha: f64) -> f64 {
    if p <= 0.0 {
        0.0
    } else if alpha == 1.0 {
        p
    } else {
        p.powf(alpha)
    }
}

fn random_priorities(rng: &mut Xoshiro256, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| match rng.below(6) {
            0 => -1.0,
            1 => 0.0,
            2 => 1e-3 * rng.next_f64(),
            _ => 10.0 * rng.next_f64(),
        })
        .collect()
}

#[test]
fn draws_follow_the_prefix_sums_and_the_seed() {
    let Some(exe) = driver() else { return };
    let mut rng = Xoshiro256::seed_from_u64(11);
    for case in 0..40 {
        let n = 1 + rng.below(if case % 4 == 0 { 20_000 } else { 300 }) as usize;
        let mut prio = random_priorities(&mut rng, n);
        prio[rng.below(n as u64) as usize] = 2.5; // at least one positive weight
        let alpha = [0.0, 0.6, 1.0][case % 3];
        let beta = [0.0, 0.4, 1.0][(case / 3) % 3];
        let stratified = case % 2 == 1;
        let seed = rng.next_u64();
        let draws = 1 + rng.below(500);
        let out = run_sample(exe, &prio, alpha, beta, seed, draws, stratified);
        let w: Vec<f64> = prio.iter().map(|&p| weight(p, alpha)).collect();
        // Prefix sums: non-decreasing, close to a plain sum, ending at the total.
        let mut acc = 0.0;
        for (i, &wi) in w.iter().enumerate() {
            acc += wi;
            assert!((out.prefix[i] - acc).abs() <= 1e-9 * acc.max(1.0), "case {case}: prefix[{i}]");
            if i > 0 {
                assert!(out.prefix[i] >= out.prefix[i - 1], "case {case}: prefix decreases at {i}");
            }
        }
        assert_eq!(out.prefix[n - 1], out.total, "case {case}");
        let wmin = w.iter().copied().filter(|&x| x > 0.0).fold(f64::INFINITY, f64::min);
        assert_eq!(out.wmin, wmin, "case {case}");
        for (d, &(slot, prob, iw)) in out.draws.iter().enumerate() {
            let i = slot as usize;
            assert!(i < n && w[i] > 0.0, "case {case} draw {d}: slot {slot} has no weight");
            let u = (common::splitmix_at(seed, d as u64) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let x = if stratified { ((d as f64 + u) / draws as f64) * out.total } else { u * out.total };
            let lo = if i == 0 { 0.0 } else { out.prefix[i - 1] };
            let clamped = x >= out.total && out.prefix[i] == out.total && lo < out.total;
            assert!(
                clamped || (lo <= x && x < out.prefix[i]),
                "case {case} draw {d}: x={x} not in [{lo}, {})",
                out.prefix[i]
            );
            assert!((prob - w[i] / out.total).abs() <= 1e-15, "case {case} draw {d}: probability");
            let want = if beta == 0.0 { 1.0 } else { (wmin / w[i]).powf(beta) };
            assert!((iw - want).abs() <= 1e-12 * want, "case {case} draw {d}: weight {iw} vs {want}");
            assert!(iw <= 1.0 + 1e-12, "weights are normalised by the largest");
        }
        let again = run_sample(exe, &prio, alpha, beta, seed, draws, stratified);
        assert!(again.draws == out.draws, "case {case}: the same seed must give the same draws");
        // Another seed changes the draws (stratified draws over few items
        // can legitimately coincide, so only the plain ones are checked).
        if !stratified && draws > 8 && w.iter().filter(|&&x| x > 0.0).count() > 1 {
            let other = run_sample(exe, &prio, alpha, beta, seed ^ 1, draws, stratified);
            assert!(other.draws != out.draws, "case {case}: another seed should change the draws");
        }
    }
}

#[test]
fn draw_frequencies_match_the_priorities() {
    let Some(exe) = driver() else { return };
    let prio: Vec<f64> = vec![4.0, 1.0, 0.0, -1.0, 0.5, 2.0, 8.0, 0.25, 3.0, 1.5, 0.75, 6.0];
    for (alpha, stratified) in [(1.0, false), (0.6, false), (0.6, true), (0.0, false)] {
        let draws = 200_000u64;
        let out = run_sample(exe, &prio, alpha, 0.0, 0x5eed + draws, draws, stratified);
        let w: Vec<f64> = prio.iter().map(|&p| weight(p, alpha)).collect();
        let total: f64 = w.iter().sum();
        let p: Vec<f64> = w.iter().map(|x| x / total).collect();
        let mut counts = vec![0u64; prio.len()];
        for &(slot, _, _) in &out.draws {
            counts[slot as usize] += 1;
        }
        let dof = p.iter().filter(|&&x| x > 0.0).count() - 1;
        let chi = common::chi_square(&counts, &p);
        assert!(chi < common::chi_square_bound(dof), "alpha {alpha} stratified {stratified}: chi2 {chi} ({counts:?})");
    }
}

/// With subnormal weights `u * total` rounds onto the prefix sums
/// themselves (and onto 0 and the total), so the search's boundary rule is
/// exercised: a draw must never land on a zero-weight slot.
#[test]
fn exact_boundaries_never_pick_zero_weights() {
    let Some(exe) = driver() else { return };
    let d = f64::from_bits(1);
    let prio = [0.0, d, 0.0, 2.0 * d, 0.0, 0.0, d, -1.0, 0.0];
    for stratified in [false, true] {
        let out = run_sample(exe, &prio, 1.0, 1.0, 99, 4000, stratified);
        let mut counts = [0u32; 9];
        for (i, &(slot, _, _)) in out.draws.iter().enumerate() {
            assert!(prio[slot as usize] > 0.0, "draw {i} picked slot {slot} with zero weight");
            counts[slot as usize] += 1;
        }
        assert!(counts[1] > 0 && counts[3] > 0 && counts[6] > 0, "{counts:?}");
    }
}

#[test]
fn all_zero_weights_report_a_zero_total() {
    let Some(exe) = driver() else { return };
    let out = run_sample(exe, &[0.0, -1.0, 0.0], 1.0, 1.0, 1, 0, false);
    assert_eq!((out.total, out.wmin), (0.0, -1.0));
}

// ---------------------------------------------------------------- top-k, scatter

/// Appends one top-k op with the crate's own launch plan (or, with
/// `small_grids`, one-block grids, so each simulated thread strides).
fn topk_op(w: &mut Writer, prio: &[f64], k: u64, small_grids: bool) {
    let n = prio.len() as u64;
    let (m, steps) = plan::topk_network(n);
    let grid = |items: u64| if small_grids { 1 } else { u64::from(plan::grid_1d(items)) };
    w.u(3).u(grid(m)).u(grid(k)).u(plan::BLOCK.into());
    w.u(n).u(k).u(m).u(steps.len() as u64);
    for (size, stride) in steps {
        w.u(grid(m / 2)).u(size).u(stride);
    }
    for &p in prio {
        w.f(p);
    }
}

/// The classic CPU top-k: a min-heap of the best k seen so far, then sorted
/// best first. Order: higher priority, then lower slot; negative = empty.
fn heap_top_k(prio: &[f64], k: usize) -> Vec<(u32, f64)> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    struct Key(f64, Reverse<u32>);
    impl PartialEq for Key {
        fn eq(&self, o: &Self) -> bool {
            self.cmp(o).is_eq()
        }
    }
    impl Eq for Key {}
    impl PartialOrd for Key {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Key {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
        }
    }
    let mut heap = BinaryHeap::new();
    for (i, &p) in prio.iter().enumerate() {
        if p < 0.0 {
            continue;
        }
        heap.push(Reverse(Key(p, Reverse(i as u32))));
        if heap.len() > k {
            heap.pop();
        }
    }
    let mut v: Vec<(u32, f64)> = heap.into_iter().map(|Reverse(Key(p, Reverse(i)))| (i, p)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

fn check_topk(out: &[u8], cases: &[(Vec<f64>, u64)]) {
    let mut r = Reader(out);
    for (case, (prio, k)) in cases.iter().enumerate() {
        let got: Vec<(u32, f64)> = (0..*k).map(|_| (r.u() as u32, r.f())).collect();
        let want = heap_top_k(prio, *k as usize);
        let n = prio.len();
        assert_eq!(&got[..want.len()], &want[..], "case {case}: n {n}, k {k}");
        assert!(
            got[want.len()..].iter().all(|&(s, p)| s == u32::MAX && p == -1.0),
            "case {case}: n {n}, k {k}: entries past the occupied slots must be marked empty: {:?}",
            &got[want.len()..]
        );
    }
}

/// Every k from 1 to n, for every n up to 40 and a few larger ones, with
/// ties and empty slots, against the CPU heap.
#[test]
fn top_k_matches_a_cpu_heap_for_every_k() {
    let Some(exe) = driver() else { return };
    let mut rng = Xoshiro256::seed_from_u64(3);
    let mut cases = Vec::new();
    for n in (1..=40u64).chain([63, 64, 65, 100, 129]) {
        // Few distinct values, so ties are common; one in five slots empty.
        let prio: Vec<f64> =
            (0..n).map(|_| if rng.below(5) == 0 { -1.0 } else { rng.below(12) as f64 / 4.0 }).collect();
        for k in 1..=n {
            cases.push((prio.clone(), k));
        }
    }
    let mut w = Writer::default();
    for (i, (prio, k)) in cases.iter().enumerate() {
        topk_op(&mut w, prio, *k, i % 3 == 0);
    }
    check_topk(&run(exe, &w.0), &cases);
}

/// Larger tables with distinct and tied priorities, k up to n.
#[test]
fn top_k_is_the_best_k_with_ties_to_the_lower_slot() {
    let Some(exe) = driver() else { return };
    let mut rng = Xoshiro256::seed_from_u64(4);
    let mut cases = Vec::new();
    for case in 0..24 {
        let n = 1 + rng.below(if case % 4 == 0 { 5000 } else { 300 });
        let prio: Vec<f64> = (0..n)
            .map(|_| match rng.below(6) {
                0 => -1.0,
                1 => 0.0,
                _ if case % 2 == 0 => rng.next_f64(),
                _ => rng.below(7) as f64,
            })
            .collect();
        let k = match case % 3 {
            0 => n,
            1 => 1 + rng.below(n),
            _ => n.div_ceil(4),
        };
        cases.push((prio, k));
    }
    let mut w = Writer::default();
    for (prio, k) in &cases {
        topk_op(&mut w, prio, *k, false);
    }
    check_topk(&run(exe, &w.0), &cases);
}

#[test]
fn scatter_applies_batched_updates_last_write_wins() {
    let Some(exe) = driver() else { return };
    let mut rng = Xoshiro256::seed_from_u64(5);
    for _ in 0..20 {
        let n = 1 + rng.below(100);
        let before: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let updates: Vec<(u32, f64)> = (0..rng.below(300)).map(|_| (rng.below(n) as u32, rng.next_f64())).collect();
        let unique = plan::last_write_wins(&updates);
        let mut w = Writer::default();
        w.u(4).u(plan::grid_1d(unique.len() as u64).into()).u(plan::BLOCK.into()).u(n).u(unique.len() as u64);
        for &b in &before {
            w.f(b);
        }
        for &(s, _) in &unique {
            w.u(s.into());
        }
        for &(_, v) in &unique {
            w.f(v);
        }
        let out = run(exe, &w.0);
        let mut r = Reader(&out);
        let got: Vec<f64> = (0..n).map(|_| r.f()).collect();
        let mut want = before.clone();
        for &(s, v) in &updates {
            want[s as usize] = v;
        }
        assert_eq!(got, want);
    }
}
