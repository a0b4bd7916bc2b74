//! The transition sampler against a reference computed step by step from
//! the written episodes: frame stacks (the first frame of an episode
//! repeated before it, episodes that begin inside a trajectory), n-step
//! returns stopping at terminal steps and at trajectory ends, next
//! observations as views of the frames gathered once, or in a buffer of
//! their own when they would overlap.

use gear_api::{ItemPattern, ReplayTable, StepValue, TransitionBatch, TransitionConfig};
use gear_core::{ColumnSpec, DType, SlotKey, TableSpec};
use gear_sampler::{StrategyKind, StrategyParams};
use std::collections::HashMap;

/// A written trajectory: per step, whether its action ended the episode.
struct Episode {
    id: u8,
    dones: Vec<bool>,
}

fn frame(id: u8, step: u64) -> [u8; 4] {
    [id, step as u8, (step as u8) ^ 0x5a, 7]
}

fn reward(id: u8, step: u64) -> f32 {
    f32::from(id) * 10.0 + step as f32 * 0.5 - 3.0
}

fn spec(t: u64, capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![2, 2]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F32, vec![]),
            ColumnSpec::new("done", DType::Bool, vec![]),
        ],
        t,
        capacity,
    )
    .unwrap()
    .with_items_per_trajectory(t)
    .unwrap()
}

fn write(table: &ReplayTable, ep: &Episode) -> SlotKey {
    let mut t = table.writer().begin(None).unwrap();
    for (s, &done) in ep.dones.iter().enumerate() {
        let s = s as u64;
        t.append_step(&[
            StepValue::typed(&frame(ep.id, s)),
            StepValue::typed(&[i32::from(ep.id) * 1000 + s as i32]),
            StepValue::typed(&[reward(ep.id, s)]),
            StepValue::typed(&[done]),
        ])
        .unwrap();
    }
    t.end().unwrap()
}

/// What row `[t, t + len)` of `ep` must hold, step by step.
struct Expected {
    obs: Vec<u8>,
    next: Vec<u8>,
    reward: f32,
    done: bool,
    discount: f32,
    m: u64,
}

fn expected(ep: &Episode, t: u64, len: u64, k: u64, n: u64, gamma: f64) -> Expected {
    let m = (len - 1).min(n);
    let episode_start = (0..t).rev().find(|&j| ep.dones[j as usize]).map_or(0, |j| j + 1);
    let (steps, done) = match (0..m).find(|&i| ep.dones[(t + i) as usize]) {
        Some(i) => (i + 1, true),
        None => (m, false),
    };
    let stack = |end: u64| -> Vec<u8> {
        (0..k)
            .flat_map(|q| {
                let s = (end as i64 - (k as i64 - 1) + q as i64).max(episode_start as i64) as u64;
                frame(ep.id, s)
            })
            .collect()
    };
    let ret: f64 = (0..steps).map(|i| gamma.powi(i as i32) * f64::from(reward(ep.id, t + i))).sum();
    Expected {
        obs: stack(t),
        next: stack(t + steps),
        reward: ret as f32,
        done,
        discount: if done { 0.0 } else { gamma.powi(steps as i32) as f32 },
        m: steps,
    }
}

/// Every item of every episode checked, for one frame stack and n.
fn check(k: u64, n: u64, episodes: &[Episode]) -> (usize, usize) {
    let table = ReplayTable::builder(spec(16, 8))
        .item_pattern(ItemPattern::Transitions { n_step: n })
        .seed(k * 100 + n)
        .build()
        .unwrap();
    let mut items: HashMap<SlotKey, (usize, u64, u64)> = HashMap::new();
    for (e, ep) in episodes.iter().enumerate() {
        let traj = write(&table, ep);
        for it in table.items_of(traj).unwrap() {
            items.insert(it.key, (e, it.start, it.len));
        }
    }
    let gamma = 0.9;
    let config =
        TransitionConfig::new(64, "obs", "action", "reward").done("done").frame_stack(k).n_step(n).gamma(gamma);
    let mut sampler = table.transition_sampler(config).unwrap();
    let (mut rows, mut separate) = (0, 0);
    for _ in 0..20 {
        let b = sampler.sample().unwrap();
        let obs = b.obs("obs").unwrap();
        let next = b.next_obs("obs").unwrap();
        let want_shape: Vec<u64> = if k == 1 { vec![64, 2, 2] } else { vec![64, k, 2, 2] };
        assert_eq!(obs.shape(), want_shape);
        assert_eq!(next.shape(), want_shape);
        if b.next_is_separate() {
            separate += 1;
        } else {
            assert_eq!(next.view.offset, n as usize * 4, "next_obs is a view n frames into the same buffer");
            assert!(std::ptr::eq(next.view.bytes, obs.view.bytes));
        }
        let actions: &[i32] = b.column("action").unwrap().as_slice().unwrap();
        for r in 0..b.rows() {
            let (e, t, len) = items[&b.keys()[r]];
            let ep = &episodes[e];
            let want = expected(ep, t, len, k, n, gamma);
            let at = format!("k {k} n {n} episode {e} t {t}");
            assert_eq!(b.starts()[r], t, "{at}");
            assert_eq!(obs.view.row(r), &want.obs[..], "{at}: obs");
            assert_eq!(next.view.row(r), &want.next[..], "{at}: next_obs");
            assert_eq!(actions[r], i32::from(ep.id) * 1000 + t as i32, "{at}: action");
            assert!(
                (b.rewards()[r] - want.reward).abs() < 1e-4,
                "{at}: reward {} want {}",
                b.rewards()[r],
                want.reward
            );
            assert_eq!(b.dones()[r], want.done, "{at}: done");
            assert!((b.discounts()[r] - want.discount).abs() < 1e-6, "{at}: discount");
            assert_eq!(b.n_steps()[r], want.m, "{at}: steps");
            rows += 1;
        }
    }
    (rows, separate)
}

fn episodes() -> Vec<Episode> {
    let d = |v: &[u8]| v.iter().map(|&x| x == 1).collect::<Vec<bool>>();
    vec![
        // Terminal at the last action, then the final observation.
        Episode { id: 1, dones: d(&[0, 0, 0, 0, 0, 1, 0]) },
        // Truncated: no done flag at all.
        Episode { id: 2, dones: d(&[0, 0, 0, 0, 0, 0, 0, 0, 0]) },
        // Two episodes in one trajectory (a chunk that crosses a reset).
        Episode { id: 3, dones: d(&[0, 0, 1, 0, 0, 0, 0, 1, 0]) },
        // Shortest: one transition.
        Episode { id: 4, dones: d(&[1, 0]) },
    ]
}

#[test]
fn one_step_transitions_without_a_frame_stack() {
    let (rows, separate) = check(1, 1, &episodes());
    assert_eq!((rows, separate), (1280, 0));
}

#[test]
fn stacked_frames_and_n_step_returns_match_the_reference() {
    for (k, n) in [(4, 1), (4, 3), (2, 3), (3, 3), (1, 5), (4, 5)] {
        let (rows, separate) = check(k, n, &episodes());
        assert_eq!(rows, 1280);
        if n >= k {
            assert_eq!(separate, 0, "k {k} n {n}: next stacks fit behind the observations");
        } else if n > 1 {
            assert!(separate > 0, "k {k} n {n}: short returns must have used the separate buffer");
        }
    }
}

#[test]
fn transitions_follow_item_priorities_and_their_keys_update_them() {
    let table = ReplayTable::builder(spec(8, 2))
        .item_pattern(ItemPattern::Transitions { n_step: 1 })
        .sampler_kind(StrategyKind::Prioritized, StrategyParams { alpha: 1.0, beta: 0.4, stratified: false })
        .build()
        .unwrap();
    let traj = write(&table, &Episode { id: 9, dones: vec![false; 5] });
    let items = table.items_of(traj).unwrap();
    assert_eq!(items.len(), 4);
    let updates: Vec<(SlotKey, f64)> = items.iter().map(|i| (i.key, if i.start == 2 { 1.0 } else { 0.0 })).collect();
    assert_eq!(table.update_priorities(&updates).unwrap(), 4);
    let mut s = table.transition_sampler(TransitionConfig::new(32, "obs", "action", "reward")).unwrap();
    let b = s.sample().unwrap();
    assert!(b.starts().iter().all(|&t| t == 2));
    assert!(b.probabilities().iter().all(|&p| (p - 1.0).abs() < 1e-12));
    let obs = b.obs("obs").unwrap();
    assert_eq!(obs.strides(), vec![8, 2, 1], "k = 1: [rows, 2, 2] over rows of k + n = 2 frames");
    let stacked = table.transition_sampler(TransitionConfig::new(4, "obs", "action", "reward").frame_stack(3)).unwrap();
    drop(stacked);
}

#[test]
fn bad_configurations_are_refused_by_name() {
    let table = ReplayTable::builder(spec(8, 2)).item_pattern(ItemPattern::Transitions { n_step: 1 }).build().unwrap();
    let err = |c: TransitionConfig| table.transition_sampler(c).unwrap_err().to_string();
    let base = || TransitionConfig::new(4, "obs", "action", "reward");
    assert!(err(base().n_step(0)).contains("at least 1"));
    assert!(err(base().n_step(8)).contains("do not fit"));
    assert!(err(base().gamma(1.5)).contains("not in [0, 1]"));
    assert!(err(TransitionConfig::new(4, "obs", "action", "obs")).contains("needs one element per step"));
    assert!(err(TransitionConfig::new(4, "pixels", "action", "reward")).contains("pixels"));
    let plain = TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, vec![1])], 4, 2).unwrap();
    let table = ReplayTable::builder(plain).build().unwrap();
    let e = table.transition_sampler(TransitionConfig::new(1, "obs", "obs", "obs")).unwrap_err();
    assert!(e.to_string().contains("has no items"), "{e}");
}

#[test]
fn batches_the_caller_owns_keep_their_rows_while_later_ones_are_drawn() {
    // n < k: some batches keep their next observations apart.
    let (k, n, gamma) = (4, 2, 0.9);
    let table =
        ReplayTable::builder(spec(16, 8)).item_pattern(ItemPattern::Transitions { n_step: n }).seed(7).build().unwrap();
    let episodes = episodes();
    let mut items: HashMap<SlotKey, (usize, u64, u64)> = HashMap::new();
    for (e, ep) in episodes.iter().enumerate() {
        for it in table.items_of(write(&table, ep)).unwrap() {
            items.insert(it.key, (e, it.start, it.len));
        }
    }
    let config =
        TransitionConfig::new(16, "obs", "action", "reward").done("done").frame_stack(k).n_step(n).gamma(gamma);
    let mut sampler = table.transition_sampler(config.clone()).unwrap();
    let mut kept: Vec<(TransitionBatch, Vec<SlotKey>)> = Vec::new();
    for _ in 0..8 {
        let mut batch = sampler.new_batch().unwrap();
        let keys = sampler.sample_into(&mut batch).unwrap().keys().to_vec();
        kept.push((batch, keys));
    }
    assert!(kept.iter().any(|(b, _)| b.next_is_separate()), "some batch must have used the separate buffer");
    // Every batch still holds its own rows after the later ones were drawn.
    for (b, keys) in &kept {
        let (obs, next) = (b.observation(0), b.next_observation(0));
        for (r, key) in keys.iter().enumerate() {
            let (e, t, len) = items[key];
            let want = expected(&episodes[e], t, len, k, n, gamma);
            assert_eq!(obs.row(r), &want.obs[..], "episode {e} t {t}: obs");
            assert_eq!(next.row(r), &want.next[..], "episode {e} t {t}: next_obs");
            assert!((b.rewards()[r] - want.reward).abs() < 1e-4);
            assert_eq!((b.dones()[r], b.n_steps()[r]), (want.done, want.m));
        }
    }
    // A reused batch is rewritten whole; one of another layout is refused
    // before anything is drawn.
    let (mut reused, _) = kept.pop().unwrap();
    let keys = sampler.sample_into(&mut reused).unwrap().keys().to_vec();
    for (r, key) in keys.iter().enumerate() {
        let (e, t, len) = items[key];
        assert_eq!(reused.next_observation(0).row(r), &expected(&episodes[e], t, len, k, n, gamma).next[..]);
    }
    let mut other = table.transition_sampler(config.frame_stack(2)).unwrap().new_batch().unwrap();
    let samples = table.info().unwrap().samples;
    assert!(samples > 0);
    let err = sampler.sample_into(&mut other).unwrap_err();
    assert!(err.to_string().contains("another layout"), "{err}");
    assert_eq!(table.info().unwrap().samples, samples, "a refused batch draws nothing");
}
