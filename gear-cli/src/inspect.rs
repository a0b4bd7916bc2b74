//! Looking inside tables: `gear inspect NAME` (spec, fill, rate limiter,
//! who waits on what) and `gear sample NAME --rows 4` (a few sampled rows,
//! values printed), for a shared table on this machine or, with
//! `--cluster FILE`, every shard of a cluster. Without a name, `gear
//! inspect` lists the tables in the directory.

use gear_api::{AttachOptions, Error, ReplayTable, Result, SampleConfig, TableInfo};
use gear_core::{DType, TableSpec, WindowSpec};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which table: a name (in `/dev/shm` or `--dir`) or a cluster file.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// The shared table's name (`gear inspect` alone lists the tables).
    pub name: Option<String>,
    /// Directory of the table's file (default /dev/shm).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A cluster file instead: every shard.
    #[arg(long, conflicts_with_all = ["name", "dir"])]
    pub cluster: Option<PathBuf>,
}

/// `gear sample`'s flags.
#[derive(clap::Args, Debug)]
pub struct SampleArgs {
    #[command(flatten)]
    pub target: Target,
    /// Rows to draw (they count as samples for the rate limiter and
    /// `max_times_sampled`, as any sampler's do).
    #[arg(long, default_value_t = 4)]
    pub rows: u64,
    /// Steps per row: the last N steps of each trajectory (default: 4, at
    /// most the table's T).
    #[arg(long)]
    pub window: Option<u64>,
    /// Columns to print, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub columns: Vec<String>,
    /// Seconds to wait for the rate limiter to admit the rows.
    #[arg(long, default_value_t = 5.0, value_parser = crate::seconds_arg)]
    pub timeout: f64,
}

fn net(e: gear_net::Error) -> Error {
    Error::Backend(Box::new(e))
}

/// Attaches to a table to look at it. A table whose creator used a
/// strategy of its own type cannot be rebuilt here: inspecting it only
/// reads counters, so plain strategies stand in (`for_sampling` refuses).
fn attach(name: &str, dir: Option<&Path>, for_sampling: bool) -> Result<ReplayTable> {
    let options = || AttachOptions { dir: dir.map(Path::to_path_buf), ..AttachOptions::default() };
    match ReplayTable::attach(name, options()) {
        Err(Error::Config(m)) if !for_sampling && m.contains("of its creator's own type") => {
            let stand_in = AttachOptions {
                sampler: Some(Box::new(gear_sampler::Uniform::new())),
                remover: Some(Box::new(gear_sampler::Fifo::new())),
                ..options()
            };
            ReplayTable::attach(name, stand_in)
        }
        other => other,
    }
}

/// `gear inspect`.
pub fn inspect(t: &Target) -> Result<()> {
    if let Some(file) = &t.cluster {
        return inspect_cluster(file);
    }
    let dir = t.dir.clone().unwrap_or_else(|| PathBuf::from(crate::serve::DEFAULT_TABLE_DIR));
    let Some(name) = &t.name else {
        let names = gear_api::shared_tables(Some(&dir))?;
        if names.is_empty() {
            println!("no GEAR tables in {}", dir.display());
        }
        for n in names {
            let bytes = std::fs::metadata(dir.join(&n)).map(|m| m.len()).unwrap_or(0);
            println!("{n:<32} {:>10}", crate::serve::format_bytes(bytes));
        }
        return Ok(());
    };
    let table = attach(name, t.dir.as_deref(), false)?;
    let info = table.info()?;
    println!("table `{name}` in {} ({})", dir.display(), crate::serve::format_bytes(table.region_bytes()));
    print_spec(table.spec());
    print_fill(&info);
    print_limiter(&info);
    print_waiting(&info);
    Ok(())
}

fn print_spec(spec: &TableSpec) {
    println!("spec: T={}, capacity {} trajectories, {} B per step", spec.max_len(), spec.capacity(), spec.step_bytes());
    for c in spec.columns() {
        println!("  {:<16} {:<5} {:?}", c.name(), c.dtype().name(), c.shape());
    }
}

fn print_fill(i: &TableInfo) {
    println!(
        "fill: {}/{} trajectories (slots: {} committed, {} being written, {} retiring, {} free)",
        i.size, i.capacity, i.slots.committed, i.slots.writing, i.slots.retiring, i.slots.free
    );
    println!(
        "counters: {} inserts, {} rows sampled, {} evicted, {} retired, {} reclaimed from dead writers",
        i.inserts, i.samples, i.evictions, i.retired, i.reclaimed
    );
}

fn print_limiter(i: &TableInfo) {
    let c = i.limiter;
    let ratio = c.min_diff.is_finite() || c.max_diff.is_finite();
    println!("rate limiter: min_size_to_sample {}", c.min_size_to_sample);
    if ratio {
        println!(
            "  samples_per_insert {}: inserts * spi - samples = {:.1}, kept within [{:.1}, {:.1}]",
            c.samples_per_insert, i.limiter_error, c.min_diff, c.max_diff
        );
    }
    let writers_blocked =
        ratio && i.size >= c.min_size_to_sample && i.limiter_error + c.samples_per_insert > c.max_diff;
    let samplers_blocked = i.size == 0 || i.size < c.min_size_to_sample || i.limiter_error - 1.0 < c.min_diff;
    println!(
        "  writers {}, samplers {}",
        if writers_blocked { "wait (samplers must catch up)" } else { "may insert" },
        if samplers_blocked { "wait (too few trajectories or inserts)" } else { "may sample" }
    );
    println!(
        "  time waited in all: writers {:.1} s, samplers {:.1} s",
        i.insert_wait.as_secs_f64(),
        i.sample_wait.as_secs_f64()
    );
}

fn print_waiting(i: &TableInfo) {
    if i.waiting.is_empty() {
        println!("waiting: nobody");
        return;
    }
    println!("waiting: {}", i.waiting_summary());
    for w in &i.waiting {
        println!("  {w}");
    }
}

fn inspect_cluster(file: &Path) -> Result<()> {
    let client = crate::cluster_config::connect(file)?;
    let ask = |s| client.spec(s).and_then(|spec| Ok((spec, client.info(s)?)));
    crate::cluster_config::each_shard(&client, ask, |s, (spec, i)| {
        println!("shard {s}: sampler {} (incarnation {:#x})", spec.sampler, i.incarnation);
        print_spec(&spec.table);
        println!(
            "fill: {}/{} trajectories; {} inserts, {} rows sampled, {} evicted",
            i.size, i.capacity, i.inserts, i.samples, i.evictions
        );
    })
}

/// `gear sample`.
pub fn sample(a: &SampleArgs) -> Result<()> {
    if a.rows == 0 || a.rows > 4096 {
        return Err(Error::Config(format!("--rows {}: expected 1 to 4096", a.rows)));
    }
    let timeout = Duration::try_from_secs_f64(a.timeout).ok();
    if let Some(file) = &a.target.cluster {
        return sample_cluster(file, a);
    }
    let Some(name) = &a.target.name else {
        return Err(Error::Config("give a table name (`gear inspect` lists them) or --cluster FILE".into()));
    };
    let table = attach(name, a.target.dir.as_deref(), true)?;
    let spec = table.spec().clone();
    let window = a.window.unwrap_or(4).min(spec.max_len()).max(1);
    let columns: Vec<String> = if a.columns.is_empty() {
        spec.columns().iter().map(|c| c.name().to_owned()).collect()
    } else {
        a.columns.clone()
    };
    let config = SampleConfig::new(a.rows as usize, WindowSpec::last(window)).columns(columns.clone()).timeout(timeout);
    let mut sampler = table.sampler(config)?;
    let batch = match sampler.sample() {
        Ok(b) => b,
        Err(e @ Error::Timeout { .. }) => {
            let i = table.info()?;
            print_limiter(&i);
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    for r in 0..batch.rows() {
        let key = batch.keys()[r];
        println!(
            "row {r}: slot {} generation {}, {} of {window} steps, probability {:.4}, weight {:.4}",
            key.slot,
            key.generation,
            batch.lengths()[r],
            batch.probabilities()[r],
            batch.weights()[r]
        );
        for name in &columns {
            let c = batch.column(name)?;
            let step_bytes = c.dtype.size() as usize * c.step_shape.iter().product::<u64>() as usize;
            let row = &c.bytes[r * window as usize * step_bytes..(r + 1) * window as usize * step_bytes];
            print_column(name, c.dtype, c.step_shape, row, window as usize, batch.lengths()[r] as usize);
        }
    }
    Ok(())
}

fn sample_cluster(file: &Path, a: &SampleArgs) -> Result<()> {
    let client = crate::cluster_config::connect(file)?;
    let spec = client.spec(0).map_err(net)?.table;
    let window = a.window.unwrap_or(4).min(spec.max_len()).max(1);
    let names: Vec<String> = if a.columns.is_empty() {
        spec.columns().iter().map(|c| c.name().to_owned()).collect()
    } else {
        a.columns.clone()
    };
    let request = gear_net::ClusterSample {
        rows: a.rows,
        window: WindowSpec::last(window),
        columns: names.clone(),
        random_start: false,
    };
    let batch = client.sample(&request).map_err(net)?;
    for lost in &batch.lost {
        println!("shard {} left out: {}", lost.shard, lost.reason);
    }
    for r in 0..batch.keys.len() {
        let k = &batch.keys[r];
        println!(
            "row {r}: shard {} slot {} generation {}, {} of {window} steps, probability {:.4}, weight {:.4}",
            k.shard, k.slot, k.generation, batch.lengths[r], batch.probabilities[r], batch.weights[r]
        );
        for (i, name) in names.iter().enumerate() {
            let (_, col) = spec.column(name)?;
            let step_bytes = col.step_bytes()? as usize;
            let bytes = &batch.columns[i][r * window as usize * step_bytes..(r + 1) * window as usize * step_bytes];
            print_column(name, col.dtype(), col.shape(), bytes, window as usize, batch.lengths[r] as usize);
        }
    }
    Ok(())
}

/// One column of one row: each valid step's values (a summary for steps
/// of more than 8 values).
fn print_column(name: &str, dtype: DType, shape: &[u64], row: &[u8], window: usize, valid: usize) {
    let step_bytes = row.len() / window.max(1);
    let per_step = shape.iter().product::<u64>() as usize;
    let steps: Vec<String> = (window - valid.min(window)..window)
        .map(|s| {
            let bytes = &row[s * step_bytes..(s + 1) * step_bytes];
            let values: Vec<f64> = bytes.chunks_exact(dtype.size() as usize).map(|b| value(dtype, b)).collect();
            if per_step <= 8 {
                let shown: Vec<String> = values.iter().map(|v| format_value(dtype, *v)).collect();
                if shape.is_empty() {
                    shown.join("")
                } else {
                    format!("[{}]", shown.join(", "))
                }
            } else {
                let min = values.iter().copied().fold(f64::INFINITY, f64::min);
                let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
                format!("<{shape:?} min {} max {} mean {mean:.3}>", format_value(dtype, min), format_value(dtype, max))
            }
        })
        .collect();
    println!("  {name:<16} {}", steps.join(" "));
}

/// Element `b` (little-endian bytes of one `dtype` value) as a number.
fn value(dtype: DType, b: &[u8]) -> f64 {
    let bits16 = || u16::from_le_bytes([b[0], b[1]]);
    match dtype {
        DType::Bool | DType::U8 => f64::from(b[0]),
        DType::I8 => f64::from(b[0] as i8),
        DType::I16 => f64::from(bits16() as i16),
        DType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
        DType::F16 => f64::from(f16_to_f32(bits16())),
        DType::BF16 => f64::from(f32::from_bits(u32::from(bits16()) << 16)),
        DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
    }
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = (h >> 10) & 0x1f;
    let frac = f32::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f32.powi(-24),
        0x1f if frac == 0.0 => f32::INFINITY,
        0x1f => f32::NAN,
        e => (1.0 + frac / 1024.0) * 2f32.powi(i32::from(e) - 15),
    }
}

fn format_value(dtype: DType, v: f64) -> String {
    match dtype {
        DType::Bool => (v != 0.0).to_string(),
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => format!("{v:.4}"),
        _ => format!("{v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_decode_from_every_dtype() {
        assert_eq!(value(DType::I16, &(-3i16).to_le_bytes()), -3.0);
        assert_eq!(value(DType::I64, &(-7i64).to_le_bytes()), -7.0);
        assert_eq!(value(DType::F32, &1.5f32.to_le_bytes()), 1.5);
        assert_eq!(value(DType::F64, &(-0.25f64).to_le_bytes()), -0.25);
        assert_eq!(value(DType::F16, &0x3e00u16.to_le_bytes()), 1.5);
        assert_eq!(value(DType::F16, &0xc000u16.to_le_bytes()), -2.0);
        assert_eq!(value(DType::BF16, &0x3fc0u16.to_le_bytes()), 1.5);
        assert_eq!(value(DType::I8, &[0xff]), -1.0);
        assert_eq!(format_value(DType::Bool, 1.0), "true");
    }
}
