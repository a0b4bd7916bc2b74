//! The gear side of `cargo xtask hdf5-bench`: times imports of one HDF5
//! file into fresh tables and prints one JSON line.
//!
//! ```text
//! cargo run --release -p gear-hdf5 --example import_bench -- FILE [--no-verify] [--repeat R] [--window-bytes N]
//! ```
//!
//! The table has one column per step dataset of the file, named as the
//! dataset (Minari: without `next_observations`, so the import reads the
//! datasets h5py reads and no more), `T` = the longest episode and room
//! for every episode. It is built (its memory allocated and faulted in)
//! before the clock starts; the import (open, plan, verification when on,
//! insert) is what is timed.

use anyhow::{bail, Context, Result};
use gear_api::ReplayTable;
use gear_core::TableSpec;
use gear_hdf5::{ImportOptions, Layout};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<()> {
    let mut file: Option<PathBuf> = None;
    let (mut verify, mut repeat, mut window) = (true, 3usize, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--no-verify" => verify = false,
            "--repeat" => repeat = args.next().context("--repeat needs a value")?.parse().context("bad --repeat")?,
            "--window-bytes" => {
                window =
                    Some(args.next().context("--window-bytes needs a value")?.parse().context("bad --window-bytes")?)
            }
            s if s.starts_with("--") => bail!("unknown option {s}"),
            s => file = Some(PathBuf::from(s)),
        }
    }
    let path = file.context("usage: import_bench FILE [--no-verify] [--repeat R] [--window-bytes N]")?;
    let info = gear_hdf5::describe(&path, None)?;
    let full = info.table_spec(None, None)?;
    let spec = match info.layout {
        Layout::D4rl => full,
        Layout::Minari => TableSpec::new(
            full.columns().iter().filter(|c| c.name() != "next_observations").cloned().collect(),
            full.max_len(),
            full.capacity(),
        )?,
    };
    let mut options = ImportOptions { verify, ..ImportOptions::default() };
    if let Some(w) = window {
        options.window_bytes = w;
    }
    let mut seconds = Vec::new();
    let mut bytes = 0;
    for _ in 0..repeat.max(1) {
        let table = ReplayTable::builder(spec.clone()).build()?;
        let t = Instant::now();
        let report = gear_hdf5::import(&table, &path, &options)?;
        seconds.push(t.elapsed().as_secs_f64());
        bytes = report.bytes;
    }
    let seconds: Vec<String> = seconds.iter().map(|s| format!("{s:.6}")).collect();
    println!(
        "{{\"seconds\": [{}], \"bytes\": {bytes}, \"episodes\": {}, \"verify\": {verify}}}",
        seconds.join(", "),
        info.episodes
    );
    Ok(())
}
