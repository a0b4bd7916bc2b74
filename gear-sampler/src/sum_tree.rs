//! An f64 sum tree with a min tree beside it, for proportional prioritized
//! replay (Schaul et al., "Prioritized Experience Replay", ICLR 2016,
//! appendix B.2.1; the "sum tree" of Baselines, cpprb and Reverb).
//!
//! Layout. The tree is 8-ary rather than binary: eight f64 lanes fill one
//! 64-byte cache line, so a root-to-leaf walk over 10^6 leaves touches 7
//! lines instead of 20 (the B-tree argument; Bayer & McCreight 1972). Level
//! 0 holds the leaf masses; every level above holds, per child, the child's
//! sum and the minimum of its positive masses, plus the running (prefix)
//! sums of the eight child sums, so a descent picks a lane with eight
//! independent comparisons on one cache line instead of a chain of adds.
//!
//! Drift. Every internal value is *recomputed* from its children (always in
//! lane order 0..8) rather than adjusted by a delta, so the tree is a pure
//! function of the current leaves: no rounding error carries over from one
//! update to the next, and the root stays within a few ulps of the exact sum
//! however many updates came before (tests/prioritized.rs checks 5 million).
//! A node's prefix sums are computed in the same lane order as the sum its
//! parent stores for it, and the descent falls back to the last non-empty
//! lane when rounding leaves the target just past a node's end, so it never
//! lands on a leaf of zero mass while the total is positive.

use gear_core::Result;

use crate::keys::filled;

/// Children per node: one cache line of f64.
const FAN: usize = 8;

/// Independent cache-line loads the batched loops touch side by side.
pub(crate) const GROUP: usize = 32;

/// Descents [`SumTree::find_many`] runs side by side: a whole batch of 256
/// (criterion, 10^6 leaves: a prioritized sample of 256 took ~26 us against
/// ~37 us with groups of 32, more misses in flight per level).
const DESCENTS: usize = 256;

/// Eight leaf masses, one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Leaves([f64; FAN]);

/// The summaries of eight children (leaf blocks or nodes one level down).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Inner {
    /// `prefix[k] = (((sum[0] + sum[1]) + ...) + sum[k])`, left to right;
    /// `prefix[FAN - 1]` is the node's sum. The only line a descent reads.
    prefix: [f64; FAN],
    /// Each child's sum.
    sum: [f64; FAN],
    /// Each child's minimum positive mass, `+inf` where it has none.
    min: [f64; FAN],
}

const EMPTY_LEAVES: Leaves = Leaves([0.0; FAN]);
const EMPTY_INNER: Inner = Inner { prefix: [0.0; FAN], sum: [0.0; FAN], min: [f64::INFINITY; FAN] };

impl Inner {
    /// Recomputes `prefix` from `sum`; returns the node's sum.
    #[inline(always)]
    fn refresh_prefix(&mut self) -> f64 {
        let mut acc = 0.0;
        for (p, &x) in self.prefix.iter_mut().zip(&self.sum) {
            acc += x;
            *p = acc;
        }
        acc
    }

    #[inline(always)]
    fn total(&self) -> f64 {
        self.prefix[FAN - 1]
    }

    /// The lane whose prefix interval holds `u`, and `u` relative to it:
    /// the number of prefix sums `<= u` (lanes of zero mass have empty
    /// intervals and are never picked). Past the end (rounding), the last
    /// lane of positive mass, with `u` at its end.
    #[inline(always)]
    fn pick(&self, u: f64) -> (usize, f64) {
        let lane: usize = self.prefix.iter().map(|&c| usize::from(c <= u)).sum();
        if lane < FAN {
            let below = if lane == 0 { 0.0 } else { self.prefix[lane.saturating_sub(1)] };
            (lane, u - below)
        } else {
            past_end(&self.sum)
        }
    }
}

/// Sum of the lanes in lane order, the order [`Inner::refresh_prefix`]
/// uses, so a node's stored child sum equals the child's last prefix sum.
#[inline(always)]
fn lane_sum(l: &[f64; FAN]) -> f64 {
    let mut s = 0.0;
    for &x in l {
        s += x;
    }
    s
}

#[inline(always)]
fn lane_min(l: &[f64; FAN]) -> f64 {
    l.iter().fold(f64::INFINITY, |m, &x| m.min(x))
}

#[inline(always)]
fn lane_min_positive(l: &[f64; FAN]) -> f64 {
    l.iter().fold(f64::INFINITY, |m, &x| if x > 0.0 { m.min(x) } else { m })
}

/// The last lane of positive mass with `u` at its end, for a target that
/// rounding put at or past the end of a node; its subtree then does the
/// same, down to a leaf of positive mass. With no positive lane (a zero
/// total) lane 0 keeps the walk in range.
#[cold]
fn past_end(l: &[f64; FAN]) -> (usize, f64) {
    let last = l.iter().rposition(|&x| x > 0.0).unwrap_or(0);
    (last, l[last])
}

/// [`Inner::pick`] over eight leaf masses, which carry no prefix sums
/// (keeping the leaf level at one line per eight slots): the prefix sums
/// are accumulated on the way, in the same order.
#[inline(always)]
fn pick(l: &[f64; FAN], u: f64) -> (usize, f64) {
    let mut acc = 0.0;
    let mut below = 0.0;
    let mut lane = 0usize;
    for &x in l {
        acc += x;
        let passed = acc <= u;
        lane += usize::from(passed);
        below = if passed { acc } else { below };
    }
    if lane < FAN {
        (lane, u - below)
    } else {
        past_end(l)
    }
}

/// Leaf masses (non-negative, finite) over `capacity` leaves, with their
/// total, minimum positive mass and inverse-CDF search.
#[derive(Clone, Debug)]
pub(crate) struct SumTree {
    capacity: usize,
    /// Leaf `i` is `leaves[i / FAN].0[i % FAN]`; lanes past `capacity` stay 0.
    leaves: Vec<Leaves>,
    /// `levels[0]` summarises leaf blocks, `levels[k]` the nodes of
    /// `levels[k - 1]`: entry `e` of a level lives at `[e / FAN]`, lane
    /// `e % FAN`, and summarises block or node `e` one level down. Unused
    /// lanes are neutral (sum 0, min +inf). The last level is a single
    /// node, the root.
    levels: Vec<Vec<Inner>>,
    /// Scratch of [`SumTree::refresh`]: the entries of one level whose
    /// summaries changed (kept to reuse its allocation).
    dirty: Vec<usize>,
}

impl Default for SumTree {
    fn default() -> Self {
        SumTree { capacity: 0, leaves: vec![EMPTY_LEAVES], levels: vec![vec![EMPTY_INNER]], dirty: Vec::new() }
    }
}

impl SumTree {
    /// A tree of `capacity` leaves, all of mass 0.
    pub(crate) fn new(capacity: usize, who: &str) -> Result<Self> {
        let blocks = capacity.div_ceil(FAN).max(1);
        let leaves = filled(blocks, EMPTY_LEAVES, who)?;
        let mut levels = Vec::new();
        let mut entries = blocks;
        loop {
            let nodes = entries.div_ceil(FAN);
            levels.push(filled(nodes, EMPTY_INNER, who)?);
            if nodes == 1 {
                break;
            }
            entries = nodes;
        }
        Ok(SumTree { capacity, leaves, levels, dirty: Vec::new() })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Mass of leaf `i` (`i < capacity`).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> f64 {
        self.leaves[i / FAN].0[i % FAN]
    }

    fn root(&self) -> &Inner {
        &self.levels[self.levels.len() - 1][0]
    }

    /// Sum of all leaf masses.
    pub(crate) fn total(&self) -> f64 {
        self.root().total()
    }

    /// Smallest positive leaf mass, `+inf` when there is none.
    pub(crate) fn min_positive(&self) -> f64 {
        lane_min(&self.root().min)
    }

    /// Sets leaf `i` (`i < capacity`) to `mass` (finite, `>= 0`) and
    /// recomputes its ancestors from their children. O(log_8 capacity).
    pub(crate) fn set(&mut self, i: usize, mass: f64) {
        self.set_leaf(i, mass);
        let mut e = i / FAN;
        let block = &self.leaves[e].0;
        let (mut sum, mut min) = (lane_sum(block), lane_min_positive(block));
        for level in &mut self.levels {
            let node = &mut level[e / FAN];
            node.sum[e % FAN] = sum;
            node.min[e % FAN] = min;
            sum = node.refresh_prefix();
            min = lane_min(&node.min);
            e /= FAN;
        }
    }

    /// Loads every cache line that [`SumTree::set`] of leaf `i` will
    /// write, returning a value to pass to `black_box`. The addresses depend
    /// only on `i`, so these loads are independent and their misses overlap,
    /// where `set` itself would meet them one level at a time. Out-of-range
    /// `i` touches nothing.
    #[inline]
    pub(crate) fn touch(&self, i: usize) -> u64 {
        if i >= self.capacity {
            return 0;
        }
        let mut e = i / FAN;
        let mut t = self.leaves[e].0[0].to_bits();
        for level in &self.levels {
            let node = &level[e / FAN];
            t ^= node.prefix[0].to_bits() ^ node.sum[0].to_bits() ^ node.min[0].to_bits();
            e /= FAN;
        }
        t
    }

    /// [`SumTree::touch`] of the leaf line only, for [`SumTree::set_leaf`].
    #[inline]
    pub(crate) fn touch_leaf(&self, i: usize) -> u64 {
        self.leaves.get(i / FAN).map_or(0, |b| b.0[0].to_bits())
    }

    /// Sets leaf `i` without touching its ancestors; call
    /// [`SumTree::rebuild`] before reading the tree again.
    #[inline]
    pub(crate) fn set_leaf(&mut self, i: usize, mass: f64) {
        debug_assert!(i < self.capacity && mass.is_finite() && mass >= 0.0);
        self.leaves[i / FAN].0[i % FAN] = mass;
    }

    /// Recomputes the ancestors of the leaves in `leaves` (set with
    /// [`SumTree::set_leaf`]) from their children, each node once however
    /// many of the leaves lie below it, level by level from the bottom.
    /// Every node is recomputed exactly as [`SumTree::set`] recomputes it
    /// (a pure function of its children), so `set_leaf` of a batch then
    /// `refresh` leaves the tree bit for bit as `set` of each would: a
    /// batch of 256 consecutive leaves refreshes 32 + 4 + 1 + ... nodes
    /// instead of 256 x 7. Indices past `capacity` are ignored.
    pub(crate) fn refresh(&mut self, leaves: impl IntoIterator<Item = usize>) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.clear();
        let capacity = self.capacity;
        dirty.extend(leaves.into_iter().filter(|&i| i < capacity).map(|i| i / FAN));
        // Usually consecutive slots, already sorted; sorting makes every
        // node's children adjacent so each node is refreshed once.
        dirty.sort_unstable();
        dirty.dedup();
        // Level 0 summarises leaf blocks.
        for &e in &dirty {
            let block = &self.leaves[e].0;
            let node = &mut self.levels[0][e / FAN];
            node.sum[e % FAN] = lane_sum(block);
            node.min[e % FAN] = lane_min_positive(block);
        }
        for k in 0..self.levels.len() {
            // `dirty` holds the entries of level `k` whose lanes changed:
            // refresh their nodes and pass the summaries one level up.
            for e in dirty.iter_mut() {
                *e /= FAN;
            }
            dirty.dedup();
            let (here, above) = self.levels.split_at_mut(k + 1);
            for &n in &dirty {
                let node = &mut here[k][n];
                let sum = node.refresh_prefix();
                let min = lane_min(&node.min);
                if let Some(parent) = above.first_mut() {
                    let p = &mut parent[n / FAN];
                    p.sum[n % FAN] = sum;
                    p.min[n % FAN] = min;
                }
            }
        }
        self.dirty = dirty;
    }

    /// Recomputes every internal value from the leaves: O(capacity),
    /// sequential memory access.
    pub(crate) fn rebuild(&mut self) {
        let (first, rest) = self.levels.split_first_mut().expect("a tree has at least one level");
        for (node, blocks) in first.iter_mut().zip(self.leaves.chunks(FAN)) {
            for (lane, block) in blocks.iter().enumerate() {
                node.sum[lane] = lane_sum(&block.0);
                node.min[lane] = lane_min_positive(&block.0);
            }
            node.refresh_prefix();
        }
        let mut below: &Vec<Inner> = first;
        for level in rest {
            for (node, children) in level.iter_mut().zip(below.chunks(FAN)) {
                for (lane, child) in children.iter().enumerate() {
                    node.sum[lane] = child.total();
                    node.min[lane] = lane_min(&child.min);
                }
                node.refresh_prefix();
            }
            below = level;
        }
    }

    /// The leaf whose interval of the cumulative mass holds `u`, for `u` in
    /// `[0, total)`; leaves of zero mass are never returned while the total
    /// is positive. (With a zero total it returns leaf 0.)
    #[cfg(test)]
    pub(crate) fn find(&self, u: f64) -> usize {
        let mut one = [0usize];
        self.find_many(&[u], &mut one, |_| {});
        one[0]
    }

    /// [`SumTree::find`] for each of `us`, written to `out` (same length),
    /// calling `found(leaf)` as soon as each leaf is known (for example to
    /// start loading what the caller will read about it).
    ///
    /// Descents run in groups of [`DESCENTS`], level by level. Below the
    /// few top levels every node is a likely cache miss, so as soon as a
    /// descent has picked its lane on one level it starts loading its node
    /// on the next: that miss then overlaps the picks of every other
    /// descent of the group, and `DESCENTS` serial miss latencies per level
    /// become about one, hidden behind useful work.
    pub(crate) fn find_many(&self, us: &[f64], out: &mut [usize], mut found: impl FnMut(usize)) {
        debug_assert_eq!(us.len(), out.len());
        for (us, out) in us.chunks(DESCENTS).zip(out.chunks_mut(DESCENTS)) {
            let k = us.len();
            let mut u = [0.0f64; DESCENTS];
            let mut e = [0usize; DESCENTS];
            u[..k].copy_from_slice(us);
            // From the root down: pick on `level`, then start loading the
            // picked child, a node of the level below or a leaf block.
            for (i, level) in self.levels.iter().enumerate().rev() {
                for j in 0..k {
                    let (lane, rest) = level[e[j]].pick(u[j]);
                    e[j] = e[j] * FAN + lane;
                    u[j] = rest;
                    match i.checked_sub(1) {
                        Some(below) => prefetch_at(&self.levels[below], e[j]),
                        None => prefetch_at(&self.leaves, e[j]),
                    }
                }
            }
            for j in 0..k {
                let (lane, _) = pick(&self.leaves[e[j]].0, u[j]);
                out[j] = e[j] * FAN + lane;
                found(out[j]);
            }
        }
    }
}

/// Starts loading `v[i]`'s first cache line (a hint; nothing when `i` is
/// out of range).
#[inline(always)]
fn prefetch_at<T>(v: &[T], i: usize) {
    if let Some(x) = v.get(i) {
        gear_core::hint::prefetch(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every stored value equals the sum/min-positive of its children, and
    /// padding lanes are neutral.
    fn check_invariants(t: &SumTree) {
        let mut child_sum: Vec<f64> = t.leaves.iter().map(|b| lane_sum(&b.0)).collect();
        let mut child_min: Vec<f64> = t.leaves.iter().map(|b| lane_min_positive(&b.0)).collect();
        for (i, b) in t.leaves.iter().enumerate() {
            for (lane, &m) in b.0.iter().enumerate() {
                if i * FAN + lane >= t.capacity {
                    assert_eq!(m, 0.0, "padding leaf {} is not zero", i * FAN + lane);
                }
            }
        }
        for (k, level) in t.levels.iter().enumerate() {
            assert_eq!(level.len(), child_sum.len().div_ceil(FAN), "level {k} size");
            for (e, (&s, &m)) in child_sum.iter().zip(&child_min).enumerate() {
                assert_eq!(level[e / FAN].sum[e % FAN], s, "level {k} entry {e} sum");
                assert_eq!(level[e / FAN].min[e % FAN], m, "level {k} entry {e} min");
            }
            for e in child_sum.len()..level.len() * FAN {
                assert_eq!(level[e / FAN].sum[e % FAN], 0.0);
                assert_eq!(level[e / FAN].min[e % FAN], f64::INFINITY);
            }
            for (n, node) in level.iter().enumerate() {
                let mut acc = 0.0;
                for k in 0..FAN {
                    acc += node.sum[k];
                    assert_eq!(node.prefix[k], acc, "level {k} node {n} prefix {k}");
                }
            }
            child_sum = level.iter().map(|n| lane_sum(&n.sum)).collect();
            child_min = level.iter().map(|n| lane_min(&n.min)).collect();
        }
        assert_eq!(child_sum.len(), 1, "the last level is one node");
    }

    fn leaves_of(t: &SumTree) -> Vec<f64> {
        (0..t.capacity()).map(|i| t.get(i)).collect()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Set(usize, f64),
        Batch(Vec<(usize, f64)>),
    }

    fn mass() -> impl Strategy<Value = f64> {
        prop_oneof![Just(0.0), 1e-300..1e-290f64, 0.0..1.0f64, 1.0..1e6f64, Just(1e290)]
    }

    fn op(cap: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..cap, mass()).prop_map(|(i, m)| Op::Set(i, m)),
            1 => prop::collection::vec((0..cap, mass()), 0..20).prop_map(Op::Batch),
        ]
    }

    fn case() -> impl Strategy<Value = (usize, Vec<Op>, Vec<f64>)> {
        prop_oneof![1..10usize, 60..70usize, 500..600usize].prop_flat_map(|cap| {
            (Just(cap), prop::collection::vec(op(cap), 0..120), prop::collection::vec(0.0..1.0f64, 32))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn internal_nodes_are_sums_and_mins_of_children((cap, ops, probes) in case()) {
            let mut t = SumTree::new(cap, "test").unwrap();
            let mut model = vec![0.0; cap];
            for op in ops {
                match op {
                    Op::Set(i, m) => { t.set(i, m); model[i] = m; }
                    Op::Batch(b) => {
                        for (i, m) in b { t.set_leaf(i, m); model[i] = m; }
                        t.rebuild();
                    }
                }
                check_invariants(&t);
            }
            prop_assert_eq!(leaves_of(&t), model.clone());
            let min = model.iter().copied().filter(|&m| m > 0.0).fold(f64::INFINITY, f64::min);
            prop_assert_eq!(t.min_positive(), min);
            let exact: f64 = model.iter().sum();
            let total = t.total();
            prop_assert!((total - exact).abs() <= 1e-12 * exact, "total {} vs {}", total, exact);
            // Inverse CDF: a positive-mass leaf whose interval holds u.
            if total > 0.0 {
                let mut us: Vec<f64> = probes.iter().map(|r| r * total).collect();
                us.push(0.0);
                us.push(total);               // past the end: rounding fallback
                us.push(total * (1.0 - f64::EPSILON));
                let mut found = vec![0; us.len()];
                t.find_many(&us, &mut found, |_| {});
                for (&u, &i) in us.iter().zip(&found) {
                    prop_assert!(model[i] > 0.0, "u {} found zero-mass leaf {}", u, i);
                    prop_assert_eq!(t.find(u), i);
                    let before: f64 = model[..i].iter().sum();
                    let tol = 1e-9 * total;
                    prop_assert!(u >= before - tol && u <= before + model[i] + tol,
                        "u {} not in leaf {} interval [{}, {})", u, i, before, before + model[i]);
                }
            }
        }
    }

    /// Every stored value of two trees, as bits.
    fn bits_of(t: &SumTree) -> Vec<u64> {
        let leaves = t.leaves.iter().flat_map(|b| b.0);
        let inner = t.levels.iter().flatten().flat_map(|n| n.prefix.into_iter().chain(n.sum).chain(n.min));
        leaves.chain(inner).map(f64::to_bits).collect()
    }

    fn batches(cap: usize) -> impl Strategy<Value = Vec<Vec<(usize, f64)>>> {
        // Runs of consecutive leaves (as inserts of fresh slots come) and
        // scattered ones, repeats included.
        let run = (0..cap, 1..300usize, mass()).prop_map(move |(start, n, m)| {
            (start..(start + n).min(cap)).map(|i| (i, m * (1 + i % 3) as f64)).collect()
        });
        let scattered = prop::collection::vec((0..cap, mass()), 0..40);
        prop::collection::vec(prop_oneof![run, scattered], 1..12)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// `set_leaf` of a batch then one `refresh` gives the tree `set` of
        /// each leaf gives, bit for bit, after every batch.
        #[test]
        fn deferred_refresh_equals_eager_propagation(
            (cap, batches) in prop_oneof![1..10usize, 60..70usize, 500..600usize, 4000..4200usize]
                .prop_flat_map(|cap| (Just(cap), batches(cap)))
        ) {
            let mut eager = SumTree::new(cap, "test").unwrap();
            let mut deferred = SumTree::new(cap, "test").unwrap();
            for batch in batches {
                for &(i, m) in &batch {
                    eager.set(i, m);
                    deferred.set_leaf(i, m);
                }
                deferred.refresh(batch.iter().map(|&(i, _)| i).chain([cap, usize::MAX]));
                prop_assert_eq!(bits_of(&deferred), bits_of(&eager));
                check_invariants(&deferred);
            }
        }
    }

    #[test]
    fn pick_skips_zero_lanes_and_falls_back_at_the_end() {
        let l = [0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0];
        assert_eq!(pick(&l, 0.0), (1, 0.0));
        assert_eq!(pick(&l, 0.5), (1, 0.5));
        assert_eq!(pick(&l, 1.0), (4, 0.0));
        assert_eq!(pick(&l, 2.5), (4, 1.5));
        assert_eq!(pick(&l, 3.0), (4, 2.0), "u at the end falls back to the last positive lane");
        assert_eq!(pick(&l, 1e9), (4, 2.0));
    }

    #[test]
    fn one_leaf_and_big_trees_have_consistent_shapes() {
        for cap in [0, 1, 7, 8, 9, 64, 65, 512, 513, 4097, 100_000] {
            let mut t = SumTree::new(cap, "test").unwrap();
            if cap > 0 {
                t.set(cap - 1, 3.0);
                assert_eq!(t.total(), 3.0);
                assert_eq!(t.find(1.0), cap - 1);
                assert_eq!(t.min_positive(), 3.0);
            }
            check_invariants(&t);
        }
    }
}
