//! One conformance suite run against every strategy: random operation
//! sequences checked against a reference model of which keys are held, and
//! every refused call checked to leave the strategy as it was.

mod common;

use common::{key, rng};
use gear_core::{Error, RandomSource, Sampled, Selector, SlotKey};
use gear_sampler::{build, Prioritized, StrategyKind, StrategyParams};

const CAPACITY: u32 = 48;

/// Every built-in strategy, plus prioritized variants that take other
/// code paths (alpha 0, alpha 1 and beta 1, unstratified).
fn strategies() -> Vec<(String, Box<dyn Selector>)> {
    let mut v: Vec<(String, Box<dyn Selector>)> = StrategyKind::ALL
        .into_iter()
        .map(|k| (k.name().to_owned(), build(k, &StrategyParams::default()).unwrap()))
        .collect();
    for (alpha, beta, stratified) in [(0.0, 0.4, true), (1.0, 1.0, true), (0.7, 0.0, false)] {
        let p = Prioritized::builder().alpha(alpha).beta(beta).stratified(stratified).build().unwrap();
        v.push((format!("prioritized a={alpha} b={beta} s={stratified}"), Box::new(p)));
    }
    v
}

/// What a strategy holds, observed from outside: its length and a long
/// fixed-seed sample (sampling must not change a strategy either).
fn fingerprint(s: &mut dyn Selector) -> (usize, bool, Result<Vec<Sampled>, Error>) {
    let mut out = Vec::new();
    let n = 3 * s.len() + 5;
    let r = s.sample(n, &mut rng(99), &mut out).map(|()| out);
    (s.len(), s.is_empty(), r)
}

struct Model {
    /// Per slot: the generation held, if any.
    held: Vec<Option<u32>>,
    /// Per slot: the last generation used.
    generation: Vec<u32>,
}

impl Model {
    fn new() -> Self {
        Model { held: vec![None; CAPACITY as usize], generation: vec![0; CAPACITY as usize] }
    }
    fn len(&self) -> usize {
        self.held.iter().flatten().count()
    }
    fn held_key(&self, r: &mut dyn RandomSource) -> Option<SlotKey> {
        let keys: Vec<SlotKey> =
            self.held.iter().enumerate().filter_map(|(s, g)| g.map(|g| key(s as u32, g))).collect();
        (!keys.is_empty()).then(|| keys[r.below(keys.len() as u64) as usize])
    }
    fn free_slot(&self, r: &mut dyn RandomSource) -> Option<u32> {
        let free: Vec<u32> = (0..CAPACITY).filter(|&s| self.held[s as usize].is_none()).collect();
        (!free.is_empty()).then(|| free[r.below(free.len() as u64) as usize])
    }
}

fn priority(r: &mut dyn RandomSource) -> f64 {
    match r.below(5) {
        0 => 0.0,
        1 => 1.0,
        2 => r.next_f64() * 1e-3,
        _ => r.next_f64() * 10.0,
    }
}

const BAD_PRIORITIES: [f64; 4] = [-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

/// Runs `call`, expects it refused, and checks nothing changed.
fn refused<T: std::fmt::Debug>(
    name: &str,
    what: &str,
    s: &mut dyn Selector,
    call: impl FnOnce(&mut dyn Selector) -> Result<T, Error>,
) -> Error {
    let before = fingerprint(s);
    let r = call(s);
    let Err(e) = r else { panic!("{name}: {what} was accepted: {r:?}") };
    assert_eq!(fingerprint(s), before, "{name}: refused {what} changed the strategy");
    e
}

fn run_conformance(name: &str, s: &mut dyn Selector, seed: u64) {
    let mut r = rng(seed);
    let mut m = Model::new();
    let mut out = Vec::new();
    for step in 0..3000 {
        let what = r.below(100);
        match what {
            // insert
            0..=29 => {
                let Some(slot) = m.free_slot(&mut r) else {
                    continue;
                };
                m.generation[slot as usize] += 1;
                let k = key(slot, m.generation[slot as usize]);
                let given = (r.below(4) != 0).then(|| priority(&mut r));
                let got = s.insert(k, given).unwrap_or_else(|e| panic!("{name} step {step}: insert {k}: {e}"));
                match given {
                    Some(p) => assert_eq!(got, p, "{name}: insert records the priority given"),
                    None => assert!(got.is_finite() && got > 0.0, "{name}: default priority {got}"),
                }
                m.held[slot as usize] = Some(k.generation);
            }
            // update
            30..=49 => {
                let Some(k) = m.held_key(&mut r) else {
                    continue;
                };
                s.update(k, priority(&mut r)).unwrap_or_else(|e| panic!("{name} step {step}: update {k}: {e}"));
            }
            // remove
            50..=69 => {
                let Some(k) = m.held_key(&mut r) else {
                    continue;
                };
                s.remove(k).unwrap_or_else(|e| panic!("{name} step {step}: remove {k}: {e}"));
                m.held[k.slot as usize] = None;
            }
            // sample
            70..=84 => {
                let n = r.below(40) as usize;
                let prefix = r.below(3) as usize;
                out.clear();
                out.extend((0..prefix).map(|_| Sampled { key: key(999, 0), probability: 0.0, weight: 0.0 }));
                let res = s.sample(n, &mut r, &mut out);
                if m.len() == 0 {
                    assert!(matches!(res, Err(Error::Empty(_))), "{name}: sample on empty gave {res:?}");
                    assert_eq!(out.len(), prefix, "{name}: a refused sample appended draws");
                } else {
                    res.unwrap();
                    assert_eq!(out.len(), prefix + n, "{name}: sample({n}) must append exactly {n}");
                    for d in &out[prefix..] {
                        assert_eq!(m.held[d.key.slot as usize], Some(d.key.generation), "{name}: drew {}", d.key);
                        assert!(d.probability > 0.0 && d.probability <= 1.0, "{name}: probability {d:?}");
                        assert!(d.weight > 0.0 && d.weight <= 1.0, "{name}: weight {d:?}");
                    }
                }
            }
            // error cases
            _ => {
                let held = m.held_key(&mut r);
                let free = m.free_slot(&mut r);
                match what % 8 {
                    0 => {
                        if let Some(k) = held {
                            let again = key(k.slot, k.generation + r.below(2) as u32);
                            refused(name, "duplicate insert", s, |s| s.insert(again, Some(1.0)));
                        }
                    }
                    1 => {
                        if let Some(k) = held {
                            let stale = key(k.slot, k.generation.wrapping_sub(1));
                            let e = refused(name, "stale update", s, |s| s.update(stale, 1.0));
                            assert!(matches!(e, Error::StaleKey { .. }), "{name}: {e}");
                            let newer = key(k.slot, k.generation + 1);
                            let e = refused(name, "stale remove", s, |s| s.remove(newer));
                            assert!(matches!(e, Error::StaleKey { .. }), "{name}: {e}");
                        }
                    }
                    2 => {
                        if let Some(slot) = free {
                            let k = key(slot, m.generation[slot as usize]);
                            refused(name, "update of an unknown key", s, |s| s.update(k, 1.0));
                            refused(name, "remove of an unknown key", s, |s| s.remove(k));
                        }
                    }
                    3 => {
                        let k = key(CAPACITY + r.below(1000) as u32, 1);
                        for e in [
                            refused(name, "insert out of range", s, |s| s.insert(k, None)),
                            refused(name, "update out of range", s, |s| s.update(k, 1.0)),
                            refused(name, "remove out of range", s, |s| s.remove(k)),
                        ] {
                            assert!(matches!(e, Error::SlotOutOfRange { .. }), "{name}: {e}");
                        }
                    }
                    4 => {
                        if let Some(slot) = free {
                            let bad = BAD_PRIORITIES[r.below(4) as usize];
                            let k = key(slot, m.generation[slot as usize] + 1);
                            let e = refused(name, "insert with a bad priority", s, |s| s.insert(k, Some(bad)));
                            assert!(matches!(e, Error::InvalidPriority(_)), "{name}: {e}");
                        }
                    }
                    5 => {
                        if let Some(k) = held {
                            let bad = BAD_PRIORITIES[r.below(4) as usize];
                            let e = refused(name, "update with a bad priority", s, |s| s.update(k, bad));
                            assert!(matches!(e, Error::InvalidPriority(_)), "{name}: {e}");
                        }
                    }
                    6 => {
                        if m.len() > 0 {
                            let e = refused(name, "prepare while holding items", s, |s| s.prepare(u64::from(CAPACITY)));
                            assert!(matches!(e, Error::Selection(_)), "{name}: {e}");
                        }
                    }
                    _ => {
                        if m.len() == 0 {
                            let e = refused(name, "sample of empty", s, |s| s.sample(1, &mut rng(1), &mut Vec::new()));
                            assert!(matches!(e, Error::Empty(_)));
                        }
                    }
                }
            }
        }
        assert_eq!(s.len(), m.len(), "{name} step {step}: len");
        assert_eq!(s.is_empty(), m.len() == 0);
    }
}

#[test]
fn every_strategy_follows_the_selector_contract() {
    for (name, mut s) in strategies() {
        s.prepare(u64::from(CAPACITY)).unwrap();
        for seed in 0..4 {
            run_conformance(&name, s.as_mut(), seed);
            // Empty it so the next seed starts from scratch.
            let mut m = Vec::new();
            while !s.is_empty() {
                m.clear();
                s.sample(1, &mut rng(seed), &mut m).unwrap();
                s.remove(m[0].key).unwrap();
            }
        }
    }
}

#[test]
fn prepare_and_capacity_edges() {
    for (name, mut s) in strategies() {
        // Before prepare the capacity is 0: refused, not a panic.
        let e = s.insert(key(0, 1), None).unwrap_err();
        assert!(matches!(e, Error::SlotOutOfRange { capacity: 0, .. }), "{name}: {e}");
        assert!(s.prepare((1u64 << 32) + 1).is_err(), "{name}: capacity beyond u32 slots");
        let mut out = Vec::new();
        assert!(matches!(s.sample(3, &mut rng(0), &mut out), Err(Error::Empty(_))));
        assert!(out.is_empty());
        s.prepare(4).unwrap();
        s.insert(key(3, 7), Some(2.0)).unwrap();
        assert!(s.prepare(8).is_err(), "{name}: prepare while holding items");
        assert_eq!(s.len(), 1);
        s.remove(key(3, 7)).unwrap();
        s.prepare(8).unwrap();
        s.insert(key(7, 1), None).unwrap();
        // sample(0) appends nothing and is not an error while items are held.
        s.sample(0, &mut rng(0), &mut out).unwrap();
        assert!(out.is_empty());
        // A count that cannot be allocated is refused, not a panic.
        assert!(s.sample(usize::MAX, &mut rng(0), &mut out).is_err(), "{name}");
        assert!(out.is_empty());
        // A capacity of zero is allowed; every slot is out of range.
        s.remove(key(7, 1)).unwrap();
        s.prepare(0).unwrap();
        assert!(s.insert(key(0, 1), None).is_err());
    }
}

/// `insert_batch` leaves every strategy as inserting the keys one by one
/// does (same recorded priorities, same draws or order), with given and
/// default priorities; a refused key part way keeps the keys before it
/// and nothing after, as does a refused priority; a priority count that
/// does not match is refused
/// before anything changes.
#[test]
fn insert_batch_equals_inserting_one_by_one() {
    for ((name, mut batched), (_, mut single)) in strategies().into_iter().zip(strategies()) {
        batched.prepare(u64::from(CAPACITY)).unwrap();
        single.prepare(u64::from(CAPACITY)).unwrap();
        let mut r = rng(7);
        let first: Vec<SlotKey> = (0..20).map(|s| key(s, 1)).collect();
        let priorities: Vec<f64> = first.iter().map(|_| priority(&mut r)).collect();
        let mut recorded = Vec::new();
        batched.insert_batch(&first, Some(&priorities), &mut recorded).unwrap();
        let one: Vec<f64> = first.iter().zip(&priorities).map(|(&k, &p)| single.insert(k, Some(p)).unwrap()).collect();
        assert_eq!(recorded, one, "{name}: recorded priorities");
        // Default priorities, then a key already held part way.
        let mut second: Vec<SlotKey> = (20..25).map(|s| key(s, 1)).collect();
        second.push(key(3, 1));
        second.push(key(30, 1));
        recorded.clear();
        assert!(batched.insert_batch(&second, None, &mut recorded).is_err(), "{name}: a held key is refused");
        assert_eq!(recorded.len(), 5, "{name}: the keys before the refused one stay");
        for &k in &second[..5] {
            single.insert(k, None).unwrap();
        }
        // A priority refused part way (NaN, then below zero): the keys
        // before it stay, with the priorities given.
        for bad in [f64::NAN, -1.0, f64::INFINITY] {
            recorded.clear();
            let keys = [key(42, 1), key(43, 1), key(44, 1)];
            let refused = batched.insert_batch(&keys, Some(&[2.0, 3.0, bad]), &mut recorded);
            assert!(matches!(refused, Err(Error::InvalidPriority(_))), "{name}: {bad}: {refused:?}");
            assert_eq!(
                recorded,
                [single.insert(keys[0], Some(2.0)).unwrap(), single.insert(keys[1], Some(3.0)).unwrap()]
            );
            batched.remove_batch(&keys[..2]).unwrap();
            single.remove_batch(&keys[..2]).unwrap();
        }
        let short = batched.insert_batch(&[key(40, 1), key(41, 1)], Some(&[1.0]), &mut recorded);
        assert!(matches!(short, Err(Error::Selection(_))), "{name}: {short:?}");
        assert_eq!(fingerprint(&mut *batched), fingerprint(&mut *single), "{name}: draws or order");
        // The key after the refused one is not held: inserting it works.
        single.insert(key(30, 1), None).unwrap();
        batched.insert_batch(&[key(30, 1)], None, &mut Vec::new()).unwrap();
        assert_eq!(fingerprint(&mut *batched), fingerprint(&mut *single), "{name}: after the retry");
    }
}

/// `remove_batch` leaves every strategy as removing the keys one by one
/// does; a key not held part way keeps the removals before it and changes
/// nothing after.
#[test]
fn remove_batch_equals_removing_one_by_one() {
    for ((name, mut batched), (_, mut single)) in strategies().into_iter().zip(strategies()) {
        batched.prepare(u64::from(CAPACITY)).unwrap();
        single.prepare(u64::from(CAPACITY)).unwrap();
        let mut r = rng(9);
        let keys: Vec<SlotKey> = (0..40).map(|s| key(s, 1)).collect();
        for &k in &keys {
            let p = priority(&mut r);
            batched.insert(k, Some(p)).unwrap();
            single.insert(k, Some(p)).unwrap();
        }
        let gone: Vec<SlotKey> = (0..40).step_by(3).map(|s| key(s, 1)).collect();
        batched.remove_batch(&gone).unwrap();
        for &k in &gone {
            single.remove(k).unwrap();
        }
        assert_eq!(batched.len(), single.len(), "{name}");
        assert_eq!(fingerprint(&mut *batched), fingerprint(&mut *single), "{name}: draws or order");
        // Key 1 goes, key 0 (removed already) is refused, key 2 stays.
        assert!(batched.remove_batch(&[key(1, 1), key(0, 1), key(2, 1)]).is_err(), "{name}");
        single.remove(key(1, 1)).unwrap();
        assert_eq!(fingerprint(&mut *batched), fingerprint(&mut *single), "{name}: after the refusal");
    }
}
