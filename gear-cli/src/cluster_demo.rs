//! `gear demo --cluster FILE`: the demo over a cluster. Actor threads write
//! trajectories of the shards' spec through the cluster client (round
//! robin over the shards; every value of step `s` is `s`) while a trainer thread samples windows across
//! every shard, each checked (whole rows, global probabilities); progress
//! every second and a summary at the end or on Ctrl-C.

use gear_api::{Error, Result};
use gear_core::{DType, TableSpec, WindowSpec};
use gear_net::{ClusterSample, RemoteTrajectory, WriteTarget};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn net(e: gear_net::Error) -> Error {
    Error::Backend(Box::new(e))
}

/// One trajectory of `steps` steps of `spec`'s columns: every value of
/// step `s` is `s` in the column's dtype (bools: true at the last step),
/// so that `gear sample --cluster` prints something legible.
fn trajectory(spec: &TableSpec, steps: u64) -> Result<RemoteTrajectory> {
    let mut columns = Vec::new();
    for c in spec.columns() {
        let elements = c.elements_per_step()? as usize;
        let mut bytes = Vec::with_capacity((c.step_bytes()? * steps) as usize);
        for s in 0..steps {
            let one = element(c.dtype(), s, s + 1 == steps);
            for _ in 0..elements {
                bytes.extend_from_slice(&one);
            }
        }
        columns.push(bytes.into());
    }
    Ok(RemoteTrajectory { steps, columns, priority: None })
}

/// `v` (a step index, below 2048) as one element of `dtype`.
fn element(dtype: DType, v: u64, last: bool) -> Vec<u8> {
    match dtype {
        DType::Bool => vec![u8::from(last)],
        DType::U8 | DType::I8 => vec![v as u8],
        DType::I16 => (v as i16).to_le_bytes().to_vec(),
        DType::I32 => (v as i32).to_le_bytes().to_vec(),
        DType::I64 => (v as i64).to_le_bytes().to_vec(),
        // bfloat16 is the top half of an f32.
        DType::BF16 => ((((v as f32).to_bits()) >> 16) as u16).to_le_bytes().to_vec(),
        DType::F16 => f16_of_integer(v as u16).to_le_bytes().to_vec(),
        DType::F32 => (v as f32).to_le_bytes().to_vec(),
        DType::F64 => (v as f64).to_le_bytes().to_vec(),
    }
}

/// The IEEE half-precision bits of an integer below 2048 (exact).
fn f16_of_integer(v: u16) -> u16 {
    if v == 0 {
        return 0;
    }
    let e = 15 - v.leading_zeros() as u16; // floor(log2 v)
    let mantissa = (u32::from(v) << (10 - e)) as u16 & 0x3ff;
    (e + 15) << 10 | mantissa
}

/// Runs the demo against the cluster in `file` for `duration` with
/// `actors` writer threads and batches of `batch` rows.
pub fn run(file: &Path, duration: Duration, actors: usize, batch: u64) -> Result<()> {
    let client = crate::cluster_config::connect(file)?;
    let spec = client.spec(0).map_err(net)?.table;
    let t = spec.max_len();
    let window = t.min(16);
    println!(
        "gear demo over {} shards: {actors} actor threads writing trajectories of {t} steps ({} B each), 1 trainer \
         sampling {batch} rows of {window} steps",
        client.shards(),
        spec.step_bytes() * t
    );
    let one = trajectory(&spec, t)?;
    let stop = AtomicBool::new(false);
    let (written, sampled, batches, lost) =
        (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let start = Instant::now();
    let done = || stop.load(Ordering::Relaxed) || crate::signals::stop_requested() || start.elapsed() >= duration;
    let result = std::thread::scope(|s| -> Result<()> {
        let writers: Vec<_> = (0..actors)
            .map(|_| {
                let (client, written, stop, one) = (&client, &written, &stop, &one);
                s.spawn(move || -> Result<()> {
                    while !done() {
                        let batch: Vec<_> = (0..4).map(|_| one.clone()).collect();
                        if let Err(e) = client.insert(WriteTarget::RoundRobin, batch, 0) {
                            stop.store(true, Ordering::Relaxed);
                            return Err(net(e));
                        }
                        written.fetch_add(4, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        let request =
            ClusterSample { rows: batch, window: WindowSpec::last(window), columns: vec![], random_start: false };
        let mut last = Instant::now();
        let mut trainer = Ok(());
        while !done() {
            if written.load(Ordering::Relaxed) == 0 {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            match client.sample(&request) {
                Ok(b) => {
                    if b.keys.len() as u64 != batch || b.lengths.iter().any(|&l| l == 0 || l > window) {
                        trainer = Err(Error::Integrity(format!(
                            "a batch of {} rows with lengths {:?} (asked {batch} rows of {window} steps)",
                            b.keys.len(),
                            b.lengths
                        )));
                        break;
                    }
                    sampled.fetch_add(b.keys.len() as u64, Ordering::Relaxed);
                    batches.fetch_add(1, Ordering::Relaxed);
                    lost.fetch_add(b.lost.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    trainer = Err(net(e));
                    break;
                }
            }
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                eprintln!(
                    "[{:5.1}s] written {} trajectories, sampled {} rows in {} batches",
                    start.elapsed().as_secs_f64(),
                    written.load(Ordering::Relaxed),
                    sampled.load(Ordering::Relaxed),
                    batches.load(Ordering::Relaxed)
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().map_err(|_| Error::Config("an actor thread panicked".into()))??;
        }
        trainer
    });
    let secs = start.elapsed().as_secs_f64();
    let w = written.load(Ordering::Relaxed);
    println!(
        "gear demo summary ({secs:.1} s{}): {w} trajectories written ({:.2} GB/s), {} rows sampled in {} batches, \
         {} times a shard was left out of a batch",
        if crate::signals::stop_requested() { ", stopped by a signal" } else { "" },
        (w * spec.step_bytes() * t) as f64 / secs / 1e9,
        sampled.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
        lost.load(Ordering::Relaxed)
    );
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_encode_the_step_in_every_dtype() {
        assert_eq!(f16_of_integer(1), 0x3c00);
        assert_eq!(f16_of_integer(3), 0x4200);
        assert_eq!(f16_of_integer(1000), 0x63d0);
        assert_eq!(element(DType::BF16, 2, false), 0x4000u16.to_le_bytes());
        assert_eq!(element(DType::I32, 7, false), 7i32.to_le_bytes());
        assert_eq!(element(DType::Bool, 7, true), [1]);
    }
}
