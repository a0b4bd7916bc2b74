//! `cargo xtask compare`: GEAR-rs beside cpprb and DeepMind Reverb on the
//! same workloads, in one run. Sets up each peer's own virtual environment
//! from the package registry (`target/compare-venv`: numpy and cpprb;
//! `target/reverb-venv`: dm-reverb 0.14 with TensorFlow 2.15, which has
//! wheels for CPython 3.8 to 3.11 on x86-64 Linux only), builds `gear`, then
//! for each workload alternates `gear bench --json` and each peer
//! (`xtask/compare/peers.py`) `--runs` times and reports medians, with the
//! ratio gear / peer taken within each run. A peer that cannot be installed
//! here is reported as unavailable, with the reason, and the others still
//! run. Writes `target/compare.md`, the chart `target/compare.svg` and each
//! run's figures in `target/compare-runs.jsonl` (copy them
//! into docs/ to publish a run). Not part of CI: it downloads packages
//! and takes minutes.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A workload: its name, `gear bench` arguments, the peers' workload name
/// and whether the strategy is prioritized.
struct Workload {
    name: &'static str,
    gear_args: Vec<&'static str>,
    peer_workload: &'static str,
    prioritized: bool,
}

fn workloads() -> Vec<Workload> {
    let small = |sampler| [super::SMALL_ITEMS, &["--inserts", "1000000", "--sampler", sampler]].concat();
    let w = |name, gear_args, peer_workload, prioritized| Workload { name, gear_args, peer_workload, prioritized };
    vec![
        w("trajectories 513 KiB, uniform, 50 batches", vec!["--batches", "50"], "trajectories-short", false),
        w(
            "trajectories 513 KiB, prioritized, 50 batches",
            vec!["--batches", "50", "--sampler", "prioritized"],
            "trajectories-short",
            true,
        ),
        w("trajectories 513 KiB, uniform, 400 batches", vec![], "trajectories", false),
        w("trajectories 513 KiB, prioritized, 400 batches", vec!["--sampler", "prioritized"], "trajectories", true),
        w(
            "windows 32 of 128 steps, random starts, uniform",
            vec!["--window-len", "32", "--random-offsets"],
            "windows",
            false,
        ),
        w("2 writer processes + 1 sampler, uniform", vec!["--writers", "2", "--inserts", "16384"], "writers", false),
        w(
            "2 writer processes + 1 sampler, prioritized",
            vec!["--writers", "2", "--inserts", "16384", "--sampler", "prioritized"],
            "writers",
            true,
        ),
        w("transitions 64 B, uniform", small("uniform"), "transitions", false),
        w("transitions 64 B, prioritized", small("prioritized"), "transitions", true),
    ]
}

/// A peer library, in its own virtual environment.
struct Peer {
    /// `cpprb` or `reverb`; the script's peer names add `-uniform` or
    /// `-prioritized`.
    family: &'static str,
    venv: &'static str,
    packages: &'static [&'static str],
}

const PEERS: &[Peer] = &[
    Peer { family: "cpprb", venv: "target/compare-venv", packages: &["numpy", "cpprb"] },
    Peer { family: "reverb", venv: "target/reverb-venv", packages: &["dm-reverb[tensorflow]==0.14.0"] },
];

/// Creates (once) and updates a peer's virtual environment; returns its
/// Python, or why the peer cannot run here.
fn setup(root: &Path, peer: &Peer) -> std::result::Result<PathBuf, String> {
    let venv = root.join(peer.venv);
    let python = venv.join("bin/python");
    if !python.exists() {
        eprintln!("xtask compare: creating {} with {}", venv.display(), peer.packages.join(" "));
        check(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv").map_err(|e| e.to_string())?;
    }
    check(Command::new(&python).args(["-m", "pip", "install", "-q"]).args(peer.packages), "pip install")
        .map_err(|e| format!("{} could not be installed: {e}", peer.packages.join(" ")))?;
    Ok(python)
}

/// One workload beside one peer: medians, or why the peer did not run.
struct Row {
    name: &'static str,
    peer: String,
    gear_insert: f64,
    peer_insert: f64,
    gear_sample: f64,
    peer_sample: f64,
    insert_ratio: f64,
    sample_ratio: f64,
    sample_ratio_range: (f64, f64),
    gear_sample_vs_memcpy: f64,
    /// The lowest of the runs' `gear_sample_vs_memcpy`.
    gear_sample_vs_memcpy_min: f64,
    unavailable: Option<String>,
}

impl Row {
    fn unavailable(name: &'static str, peer: String, why: String) -> Row {
        Row {
            name,
            peer,
            gear_insert: f64::NAN,
            peer_insert: f64::NAN,
            gear_sample: f64::NAN,
            peer_sample: f64::NAN,
            insert_ratio: f64::NAN,
            sample_ratio: f64::NAN,
            sample_ratio_range: (f64::NAN, f64::NAN),
            gear_sample_vs_memcpy: f64::NAN,
            gear_sample_vs_memcpy_min: f64::NAN,
            unavailable: Some(why),
        }
    }
}

/// One workload's figures beside one peer, run by run.
#[derive(Default)]
struct Samples {
    gear_insert: Vec<f64>,
    peer_insert: Vec<f64>,
    gear_sample: Vec<f64>,
    peer_sample: Vec<f64>,
    insert_ratio: Vec<f64>,
    sample_ratio: Vec<f64>,
    gear_vs_memcpy: Vec<f64>,
    error: Option<String>,
}

impl Samples {
    /// Adds one run: `gear bench --json`'s object and the peer's.
    fn push(&mut self, g: &serde_json::Value, p: &serde_json::Value) -> Result<()> {
        if let Some(e) = p["error"].as_str() {
            bail!("{e}");
        }
        let f = |v: &serde_json::Value, k: &str| v[k].as_f64().with_context(|| format!("{k} missing in {v}"));
        let (g_ins, g_smp) = (f(g, "insert_traj_per_s")?, f(g, "sample_traj_per_s")?);
        let (p_ins, p_smp) = (f(p, "insert_items_per_s")?, f(p, "sample_items_per_s")?);
        self.gear_insert.push(g_ins);
        self.peer_insert.push(p_ins);
        self.gear_sample.push(g_smp);
        self.peer_sample.push(p_smp);
        self.insert_ratio.push(g_ins / p_ins);
        self.sample_ratio.push(g_smp / p_smp);
        self.gear_vs_memcpy.push(f(g, "sample_vs_memcpy")?);
        Ok(())
    }

    fn row(mut self, name: &'static str, peer: String) -> Row {
        let sr = &self.sample_ratio;
        let range = (sr.iter().copied().fold(f64::INFINITY, f64::min), sr.iter().copied().fold(0.0, f64::max));
        let memcpy_min = self.gear_vs_memcpy.iter().copied().fold(f64::INFINITY, f64::min);
        Row {
            name,
            peer,
            gear_insert: super::median(&mut self.gear_insert),
            peer_insert: super::median(&mut self.peer_insert),
            gear_sample: super::median(&mut self.gear_sample),
            peer_sample: super::median(&mut self.peer_sample),
            insert_ratio: super::median(&mut self.insert_ratio),
            sample_ratio: super::median(&mut self.sample_ratio),
            sample_ratio_range: range,
            gear_sample_vs_memcpy: super::median(&mut self.gear_vs_memcpy),
            gear_sample_vs_memcpy_min: memcpy_min,
            unavailable: None,
        }
    }
}

pub fn run(args: &[String]) -> Result<()> {
    let runs: usize = match args.iter().position(|a| a == "--runs") {
        Some(i) => args.get(i + 1).context("--runs takes a number")?.parse().context("--runs takes a whole number")?,
        None => 3,
    };
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let root = super::root();
    let peers: Vec<(&Peer, std::result::Result<PathBuf, String>)> =
        PEERS.iter().map(|p| (p, setup(&root, p))).collect();
    for (p, r) in &peers {
        if let Err(e) = r {
            eprintln!("xtask compare: {} unavailable: {e}", p.family);
        }
    }
    check(Command::new(env!("CARGO")).args(["build", "--release", "--bin", "gear"]).current_dir(&root), "cargo build")?;
    let gear = root.join("target/release/gear");
    let script = root.join("xtask/compare/peers.py");
    let mut rows = Vec::new();
    // Every run's figures, for target/compare-runs.jsonl.
    let mut raw: Vec<serde_json::Value> = Vec::new();
    for w in workloads() {
        let strategy = if w.prioritized { "prioritized" } else { "uniform" };
        // Per peer: the figures of each run, or why the peer did not run.
        let mut per_peer: Vec<Samples> = peers.iter().map(|_| Samples::default()).collect();
        for run in 1..=runs {
            eprintln!("xtask compare: {} ({run}/{runs})", w.name);
            let g = json_of(Command::new(&gear).args(["bench", "--json"]).args(&w.gear_args), "gear bench")?;
            raw.push(serde_json::json!({"workload": w.name, "run": run, "peer": "gear", "figures": g}));
            for ((peer, python), samples) in peers.iter().zip(&mut per_peer) {
                let Ok(python) = python else { continue };
                let name = format!("{}-{strategy}", peer.family);
                let p = json_of(
                    Command::new(python).arg(&script).args([name.as_str(), w.peer_workload]).current_dir(&root),
                    "peers.py",
                );
                if let Ok(p) = &p {
                    raw.push(serde_json::json!({"workload": w.name, "run": run, "peer": name, "figures": p}));
                }
                match p.and_then(|p| samples.push(&g, &p)) {
                    Ok(()) => {}
                    Err(e) => samples.error = Some(format!("{e:#}")),
                }
            }
        }
        for ((peer, python), mut samples) in peers.iter().zip(per_peer) {
            let peer_name = format!("{}-{strategy}", peer.family);
            let unavailable = python.as_ref().err().cloned().or(samples.error.take());
            rows.push(match unavailable {
                Some(why) => Row::unavailable(w.name, peer_name, why),
                None => samples.row(w.name, peer_name),
            });
        }
    }
    let md = table(&rows, runs);
    println!("{md}");
    std::fs::write(root.join("target/compare.md"), &md).context("writing target/compare.md")?;
    let lines: String = raw.iter().map(|v| format!("{v}\n")).collect();
    std::fs::write(root.join("target/compare-runs.jsonl"), lines).context("writing target/compare-runs.jsonl")?;
    std::fs::write(root.join("target/compare.svg"), chart(&rows)).context("writing target/compare.svg")?;
    eprintln!("xtask compare: wrote target/compare.md and target/compare.svg");
    Ok(())
}

pub(crate) fn check(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

pub(crate) fn json_of(cmd: &mut Command, what: &str) -> Result<serde_json::Value> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{')).with_context(|| format!("{what} printed no JSON"))?;
    serde_json::from_str(line).with_context(|| format!("parsing {what}'s JSON"))
}

fn table(rows: &[Row], runs: usize) -> String {
    let mut md = format!(
        "Medians of {runs} alternating runs; ratios gear / peer taken within each run (sample ratio range in \
         parentheses). Items are trajectories or transitions per second.\n\n\
         | workload | peer | gear insert/s | peer insert/s | insert ratio | gear sample/s | peer sample/s | sample ratio | gear sample / memcpy (lowest run) |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for r in rows {
        if let Some(why) = &r.unavailable {
            md += &format!("| {} | {} | unavailable: {} | | | | | | |\n", r.name, r.peer, why.replace('|', "/"));
            continue;
        }
        md += &format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} ({:.2}-{:.2}) | {:.2} (min {:.2}) |\n",
            r.name,
            r.peer,
            r.gear_insert,
            r.peer_insert,
            r.insert_ratio,
            r.gear_sample,
            r.peer_sample,
            r.sample_ratio,
            r.sample_ratio_range.0,
            r.sample_ratio_range.1,
            r.gear_sample_vs_memcpy,
            r.gear_sample_vs_memcpy_min
        );
    }
    md
}

/// A bar chart of the ratios (gear / peer), insert and sample side by side
/// per workload, on a log scale with a line at 1 (parity).
fn chart(rows: &[Row]) -> String {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.unavailable.is_none()).collect();
    let (w, row_h, left, top) = (860.0, 46.0, 430.0, 40.0);
    let h = top + row_h * rows.len() as f64 + 40.0;
    let max = rows.iter().flat_map(|r| [r.insert_ratio, r.sample_ratio]).fold(2.0f64, f64::max).log10().ceil();
    let min = rows.iter().flat_map(|r| [r.insert_ratio, r.sample_ratio]).fold(0.5f64, f64::min).log10().floor();
    let x = |v: f64| left + (v.log10() - min) / (max - min) * (w - left - 100.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">GEAR-rs / peer, same workload, same run (log scale; right of the line: GEAR-rs faster)</text>\n"
    );
    for (i, r) in rows.iter().enumerate() {
        let y = top + row_h * i as f64;
        s += &format!("<text x=\"10\" y=\"{:.0}\">{} / {}</text>\n", y + 22.0, r.name, r.peer);
        for (j, (v, color, label)) in
            [(r.insert_ratio, "#4c78a8", "insert"), (r.sample_ratio, "#f58518", "sample")].into_iter().enumerate()
        {
            let yy = y + 4.0 + 18.0 * j as f64;
            let (x0, x1) = (x(1.0).min(x(v)), x(1.0).max(x(v)));
            s += &format!(
                "<rect x=\"{x0:.1}\" y=\"{yy:.1}\" width=\"{:.1}\" height=\"14\" fill=\"{color}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\">{label} {v:.2}x</text>\n",
                (x1 - x0).max(1.0),
                x1 + 4.0,
                yy + 11.0
            );
        }
    }
    let base = top + row_h * rows.len() as f64;
    s += &format!("<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{base}\" stroke=\"black\"/>\n", x(1.0));
    let mut e = min;
    while e <= max {
        let v = 10f64.powf(e);
        s += &format!("<text x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"middle\">{v}x</text>\n", x(v), base + 16.0);
        e += 1.0;
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_has_a_bar_per_ratio_and_the_table_a_row_per_workload() {
        let row = |name, ins, smp| Row {
            name,
            peer: "cpprb-uniform".into(),
            gear_insert: 1.0,
            peer_insert: 1.0,
            gear_sample: 1.0,
            peer_sample: 1.0,
            insert_ratio: ins,
            sample_ratio: smp,
            sample_ratio_range: (smp, smp),
            gear_sample_vs_memcpy: 1.0,
            gear_sample_vs_memcpy_min: 1.0,
            unavailable: None,
        };
        let rows = [
            row("a", 0.85, 3.5),
            row("b", 1.4, 9.8),
            Row::unavailable("c", "reverb-uniform".into(), "no wheel | here".into()),
        ];
        let svg = chart(&rows);
        assert_eq!(svg.matches("<rect x=").count(), 4, "unavailable peers have no bars");
        assert!(svg.contains("insert 0.85x") && svg.contains("sample 9.80x"), "{svg}");
        let md = table(&rows, 3);
        assert_eq!(md.lines().filter(|l| l.starts_with("| a") || l.starts_with("| b")).count(), 2);
        assert!(md.contains("| c | reverb-uniform | unavailable: no wheel / here |"), "{md}");
    }
}
