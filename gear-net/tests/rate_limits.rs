//! Rate limiting across shards: each shard keeps Reverb's per-table rules
//! (minimum size to sample, samples per insert within an error buffer). A
//! cross-shard batch waits on a shard that may not sample, leaves it out
//! when its wait ends (the shard answers DEADLINE_EXCEEDED a little before
//! the client's deadline) and draws those rows from the others; the shard
//! serves again once inserts allow it. A shard whose limiter holds a
//! writer back refuses the trajectory when the stream's begin wait runs
//! out; a spreading writer then sends it to the next shard.

use gear_api::{RateLimiterConfig, ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{
    ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, RemoteTrajectory, ServerConfig, ServerHandle,
    StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use std::time::Duration;

#[allow(dead_code)] // each suite uses part of the shared helpers
mod common;
use common::within;

const TOKEN: &str = "rate-limit-test-token-01";

fn shard(s: u32, items: u64, limiter: RateLimiterConfig) -> ServerHandle {
    let spec = TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 2, 64).unwrap();
    let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
    let table = ReplayTable::builder(spec).rate_limiter(limiter).build().unwrap();
    let writer = table.writer();
    for i in 0..items {
        let mut t = writer.begin(None).unwrap();
        t.append_step(&[StepValue::typed(&[i as i64])]).unwrap();
        t.end().unwrap();
    }
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s, TOKEN);
    ServerHandle::start(table, &config, strategy).unwrap()
}

fn cluster(servers: &[ServerHandle]) -> ClusterClient {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    // A shard that may not sample holds a batch for 3/4 of this.
    config.call_timeout = Duration::from_millis(800);
    config.seed = 7;
    ClusterClient::new(config).unwrap()
}

fn rows_from(b: &ClusterBatch, s: u32) -> usize {
    b.keys.iter().filter(|k| k.shard == s).count()
}

fn lost_waiting(b: &ClusterBatch, s: usize) -> bool {
    b.lost.iter().any(|l| l.shard == s && l.reason.contains("waiting to sample"))
}

fn one(id: i64) -> RemoteTrajectory {
    RemoteTrajectory { steps: 1, columns: vec![id.to_le_bytes().to_vec().into()], priority: None }
}

#[test]
fn a_shard_below_its_minimum_size_is_waited_for_then_left_out() {
    let min = RateLimiterConfig::min_size(3);
    let servers = [shard(0, 4, min), shard(1, 4, min), shard(2, 1, min)];
    let cluster = cluster(&servers);
    let request = ClusterSample { rows: 60, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let b = cluster.sample(&request).unwrap();
    assert_eq!(b.keys.len(), 60);
    assert!(lost_waiting(&b, 2), "shard 2 should have been left out after waiting: {:?}", b.lost);
    assert_eq!(rows_from(&b, 2), 0);
    // Two more items reach shard 2's minimum; it serves again.
    cluster.insert(WriteTarget::Shard(2), vec![one(10), one(11)], 0).unwrap();
    let b = cluster.sample(&request).unwrap();
    assert!(b.lost.is_empty(), "{:?}", b.lost);
    assert!(b.rejoined.contains(&2));
    assert!(rows_from(&b, 2) > 0);
}

#[test]
fn samples_per_insert_stops_a_shard_until_it_gets_inserts() {
    // Shard 0: ratio 1 within [2 - 4, 2 + 4]; 4 items inserted, so the
    // error inserts - samples = 4 allows 6 samples. Shard 1 is unlimited.
    let ratio = RateLimiterConfig::sample_to_insert_ratio(1.0, 2, 4.0).unwrap();
    let servers = [shard(0, 4, ratio), shard(1, 4, RateLimiterConfig::default())];
    let cluster = cluster(&servers);
    let request = ClusterSample { rows: 2, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let mut from_0 = 0;
    let mut blocked = false;
    for _ in 0..40 {
        let b = cluster.sample(&request).unwrap();
        assert_eq!(b.keys.len(), 2);
        from_0 += rows_from(&b, 0);
        if lost_waiting(&b, 0) {
            blocked = true;
            break;
        }
    }
    assert!(blocked, "shard 0 never ran out of samples ({from_0} drawn)");
    assert!((5..=6).contains(&from_0), "shard 0 gave {from_0} rows on a budget of 6");
    // Four inserts give it four more samples.
    cluster.insert(WriteTarget::Shard(0), (0..4).map(one).collect(), 0).unwrap();
    let mut after = 0;
    for _ in 0..40 {
        let b = cluster.sample(&request).unwrap();
        after += rows_from(&b, 0);
        if lost_waiting(&b, 0) {
            break;
        }
    }
    assert!(after > 0, "shard 0 did not serve after the inserts");
    assert!(from_0 + after <= 10, "shard 0 gave {} rows on a budget of 10", from_0 + after);
    assert_eq!(cluster.info(0).unwrap().samples as usize, from_0 + after);
}

#[test]
fn a_remote_insert_held_back_by_the_limiter_waits_then_commits() {
    // Ratio 1 within an error buffer of 2: writers run at most a few
    // trajectories ahead of the samples.
    let ratio = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap();
    let server = shard(0, 0, ratio);
    let table = server.tables().table(gear_net::DEFAULT_TABLE).unwrap().clone();
    let mut config = ClusterConfig::new(vec![server.local_addr().to_string()], TOKEN);
    config.call_timeout = Duration::from_secs(20);
    let cluster = ClusterClient::new(config).unwrap();
    let started = std::time::Instant::now();
    let writer = std::thread::spawn(move || cluster.insert(WriteTarget::Shard(0), (0..8).map(one).collect(), 0));
    // The stream's first trajectories go in at once, then the limiter
    // holds its writer (the shard waits off its runtime threads).
    std::thread::sleep(Duration::from_millis(400));
    assert!(!writer.is_finished(), "8 inserts were not held back");
    let held = table.info().unwrap().inserts;
    assert!((1..8).contains(&held), "{held} trajectories in before the limiter held");
    let config = gear_api::SampleConfig::new(1, WindowSpec::last(1)).timeout(Some(Duration::from_millis(50)));
    let mut sampler = table.sampler(config).unwrap();
    while !writer.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(15), "the held insert never resumed");
        let _ = sampler.sample();
    }
    let keys = writer.join().unwrap().unwrap();
    assert_eq!(keys.len(), 8);
    assert_eq!(table.info().unwrap().inserts, 8);
    assert!(table.wait_stats().insert_waits >= 1, "the shard's writer never waited");
}

/// Ratio 1 within [-1, 3] (minimum size 1, error buffer 2): a shard whose
/// inserts lead its samples by 3 holds its writers back; one whose samples
/// caught up with its inserts holds its samplers.
fn tight() -> RateLimiterConfig {
    RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap()
}

fn table_of(server: &ServerHandle) -> ReplayTable {
    server.tables().table(gear_net::DEFAULT_TABLE).unwrap().clone()
}

fn client(servers: &[ServerHandle], call_timeout: Duration, seed: u64) -> ClusterClient {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.call_timeout = call_timeout;
    config.seed = seed;
    ClusterClient::new(config).unwrap()
}

#[test]
fn a_round_robin_writer_sends_a_held_trajectory_to_the_next_shard() {
    within("rate_limits", 60, || {
        // Shard 0 holds its writers (3 inserts, no samples); shard 1 is empty.
        let servers = [shard(0, 3, tight()), shard(1, 0, tight())];
        // Longer than a shard's own wait would have been before (30 s is
        // its bound; 20 s here): the insert succeeds only if it moves.
        let cluster = client(&servers, Duration::from_secs(20), 1);
        // Round robin starts at shard 0.
        let keys = cluster.insert(WriteTarget::RoundRobin, vec![one(100)], 0).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].shard, 1, "the held trajectory should have gone to shard 1");
        assert_eq!(table_of(&servers[0]).info().unwrap().inserts, 3, "shard 0 stored part of a held insert");
        assert_eq!(table_of(&servers[1]).info().unwrap().inserts, 1);
        assert_eq!(cluster.info(0).unwrap().held_inserts, 1, "shard 0 did not count the trajectory it held");
        assert_eq!(cluster.info(1).unwrap().held_inserts, 0);
        // A batch spread over both: shard 0 holds its part, shard 1 takes
        // the rest (it admits 3 before holding too), nothing lost twice.
        let keys = cluster.insert(WriteTarget::RoundRobin, (0..2).map(one).collect(), 0).unwrap();
        assert!(keys.iter().all(|k| k.shard == 1), "{keys:?}");
        assert_eq!(table_of(&servers[0]).info().unwrap().inserts, 3);
        assert_eq!(table_of(&servers[1]).info().unwrap().inserts, 3);
        // Shard 0 answered every time: it is not taken for lost.
        let request = ClusterSample { rows: 4, window: WindowSpec::last(1), columns: vec![], random_start: false };
        let b = cluster.sample(&request).unwrap();
        assert!(b.lost.is_empty() && b.rejoined.is_empty(), "{:?} {:?}", b.lost, b.rejoined);
    });
}

#[test]
fn a_trainer_waiting_on_a_hungry_shard_is_fed_by_a_writer_held_on_a_full_one() {
    within("rate_limits", 60, || {
        // Ratio 1 within [-19, 21]. Shard 0 is full: 21 inserts and no
        // samples hold its writers. Shard 1 is hungry: 10 items sampled 29
        // times, so its samplers wait for inserts.
        let wide = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 20.0).unwrap();
        let servers = [shard(0, 21, wide), shard(1, 10, wide)];
        let hungry = table_of(&servers[1]);
        let mut local = hungry.sampler(gear_api::SampleConfig::new(29, WindowSpec::last(1))).unwrap();
        local.sample().unwrap();
        // The trainer's draw from the hungry shard (a batch's part there).
        let trainer = client(&servers, Duration::from_secs(20), 5);
        let sampling = std::thread::spawn(move || {
            let request = ClusterSample { rows: 1, window: WindowSpec::last(1), columns: vec![], random_start: false };
            trainer.sample_shard(1, &request)
        });
        std::thread::sleep(Duration::from_millis(300));
        if sampling.is_finished() {
            let b = sampling.join().unwrap();
            panic!("the draw did not wait for the hungry shard: {b:?}");
        }
        // The actor's round robin points at the full shard. Held there, its
        // trajectory moves to the hungry shard, which then serves the draw;
        // before, both waited until a deadline ran out.
        let actor = client(&servers, Duration::from_secs(20), 9);
        let keys = actor.insert(WriteTarget::RoundRobin, vec![one(7)], 0).unwrap();
        assert_eq!(keys[0].shard, 1);
        let b = sampling.join().unwrap().unwrap();
        assert_eq!(b.keys.len(), 1);
        assert!(b.lost.is_empty(), "{:?}", b.lost);
    });
}

#[test]
fn a_writer_aimed_at_a_held_shard_is_refused_before_its_deadline() {
    within("rate_limits", 60, || {
        let servers = [shard(0, 3, tight()), shard(1, 0, tight())];
        let cluster = client(&servers, Duration::from_millis(800), 3);
        let e = cluster.insert(WriteTarget::Shard(0), vec![one(1)], 0).unwrap_err();
        let gear_net::Error::Status { shard: 0, status } = &e else { panic!("{e}") };
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{e}");
        assert!(status.message().contains("rate limiter"), "{e}");
        // The shard gave up when the client did: no writer waits on.
        let table = table_of(&servers[0]);
        assert!(table.info().unwrap().waiting.is_empty(), "{:?}", table.info().unwrap().waiting);
        assert_eq!(table.info().unwrap().inserts, 3);
        // Every shard holding: a spread insert moves its trajectories
        // round until the call's deadline, then fails storing none.
        let full = table_of(&servers[1]);
        let writer = full.writer();
        for i in 0..3 {
            let mut t = writer.begin(None).unwrap();
            t.append_step(&[StepValue::typed(&[i as i64])]).unwrap();
            t.end().unwrap();
        }
        let e = cluster.insert(WriteTarget::RoundRobin, (0..3).map(one).collect(), 0).unwrap_err();
        assert!(e.to_string().contains("held 3 trajectories"), "{e}");
        assert_eq!(table.info().unwrap().inserts + full.info().unwrap().inserts, 6);
        // Neither shard is taken for lost: both answered.
        let request = ClusterSample { rows: 4, window: WindowSpec::last(1), columns: vec![], random_start: false };
        let b = cluster.sample(&request).unwrap();
        assert!(b.lost.is_empty() && b.rejoined.is_empty(), "{:?} {:?}", b.lost, b.rejoined);
    });
}
