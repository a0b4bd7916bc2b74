//! `cargo xtask compare`: GEAR-rs beside cpprb on the same workloads, in one
//! run. Sets up its own virtual environment (`target/compare-venv`, numpy
//! and cpprb from the package registry), builds `gear`, then for each
//! workload alternates `gear bench --json` and the peer script
//! (`xtask/compare/peers.py`) `--runs` times and reports medians, with the
//! ratio gear / peer taken within each run. Writes `target/compare.md` and
//! the chart `target/compare.svg` (copy both into docs/ to publish a run).
//! Not part of CI: it downloads packages and takes minutes.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// (name, gear bench arguments, peer, peer workload)
fn workloads() -> Vec<(&'static str, Vec<&'static str>, &'static str, &'static str)> {
    let small = |sampler| [super::SMALL_ITEMS, &["--inserts", "1000000", "--sampler", sampler]].concat();
    vec![
        ("trajectories 513 KiB, uniform, 50 batches", vec!["--batches", "50"], "cpprb-uniform", "trajectories-short"),
        ("trajectories 513 KiB, uniform, 400 batches", vec![], "cpprb-uniform", "trajectories"),
        (
            "trajectories 513 KiB, prioritized, 400 batches",
            vec!["--sampler", "prioritized"],
            "cpprb-prioritized",
            "trajectories",
        ),
        ("transitions 64 B, uniform", small("uniform"), "cpprb-uniform", "transitions"),
        ("transitions 64 B, prioritized", small("prioritized"), "cpprb-prioritized", "transitions"),
    ]
}

/// One workload's medians.
struct Row {
    name: &'static str,
    peer: &'static str,
    gear_insert: f64,
    peer_insert: f64,
    gear_sample: f64,
    peer_sample: f64,
    insert_ratio: f64,
    sample_ratio: f64,
    sample_ratio_range: (f64, f64),
    gear_sample_vs_memcpy: f64,
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
    let venv = root.join("target/compare-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        eprintln!("xtask compare: creating {} with numpy and cpprb", venv.display());
        check(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
    }
    check(Command::new(&python).args(["-m", "pip", "install", "-q", "numpy", "cpprb"]), "pip install numpy cpprb")?;
    check(Command::new(env!("CARGO")).args(["build", "--release", "--bin", "gear"]).current_dir(&root), "cargo build")?;
    let gear = root.join("target/release/gear");
    let script = root.join("xtask/compare/peers.py");
    let mut rows = Vec::new();
    for (name, gear_args, peer, peer_workload) in workloads() {
        let (mut gi, mut pi, mut gs, mut ps, mut ir, mut sr, mut gm) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for run in 1..=runs {
            eprintln!("xtask compare: {name} ({run}/{runs})");
            let g = json_of(Command::new(&gear).args(["bench", "--json"]).args(&gear_args), "gear bench")?;
            let p = json_of(Command::new(&python).arg(&script).args([peer, peer_workload]), "peers.py")?;
            if let Some(e) = p["error"].as_str() {
                bail!("{peer}: {e}");
            }
            let f = |v: &serde_json::Value, k: &str| v[k].as_f64().with_context(|| format!("{k} missing in {v}"));
            let (g_ins, g_smp) = (f(&g, "insert_traj_per_s")?, f(&g, "sample_traj_per_s")?);
            let (p_ins, p_smp) = (f(&p, "insert_items_per_s")?, f(&p, "sample_items_per_s")?);
            gi.push(g_ins);
            pi.push(p_ins);
            gs.push(g_smp);
            ps.push(p_smp);
            ir.push(g_ins / p_ins);
            sr.push(g_smp / p_smp);
            gm.push(f(&g, "sample_gb_per_s")? / f(&g, "memcpy_gb_per_s")?);
        }
        let range = (sr.iter().copied().fold(f64::INFINITY, f64::min), sr.iter().copied().fold(0.0, f64::max));
        rows.push(Row {
            name,
            peer,
            gear_insert: super::median(&mut gi),
            peer_insert: super::median(&mut pi),
            gear_sample: super::median(&mut gs),
            peer_sample: super::median(&mut ps),
            insert_ratio: super::median(&mut ir),
            sample_ratio: super::median(&mut sr),
            sample_ratio_range: range,
            gear_sample_vs_memcpy: super::median(&mut gm),
        });
    }
    let md = table(&rows, runs);
    println!("{md}");
    std::fs::write(root.join("target/compare.md"), &md).context("writing target/compare.md")?;
    std::fs::write(root.join("target/compare.svg"), chart(&rows)).context("writing target/compare.svg")?;
    eprintln!("xtask compare: wrote target/compare.md and target/compare.svg");
    Ok(())
}

fn check(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn json_of(cmd: &mut Command, what: &str) -> Result<serde_json::Value> {
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
         | workload | peer | gear insert/s | peer insert/s | insert ratio | gear sample/s | peer sample/s | sample ratio | gear sample / memcpy |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for r in rows {
        md += &format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} ({:.2}-{:.2}) | {:.2} |\n",
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
            r.gear_sample_vs_memcpy
        );
    }
    md
}

/// A bar chart of the ratios (gear / peer), insert and sample side by side
/// per workload, on a log scale with a line at 1 (parity).
fn chart(rows: &[Row]) -> String {
    let (w, row_h, left, top) = (760.0, 46.0, 330.0, 40.0);
    let h = top + row_h * rows.len() as f64 + 40.0;
    let max = rows.iter().flat_map(|r| [r.insert_ratio, r.sample_ratio]).fold(2.0f64, f64::max).log10().ceil();
    let min = rows.iter().flat_map(|r| [r.insert_ratio, r.sample_ratio]).fold(0.5f64, f64::min).log10().floor();
    let x = |v: f64| left + (v.log10() - min) / (max - min) * (w - left - 100.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">GEAR-rs / cpprb, same workload, same run (log scale; right of the line: GEAR-rs faster)</text>\n"
    );
    for (i, r) in rows.iter().enumerate() {
        let y = top + row_h * i as f64;
        s += &format!("<text x=\"10\" y=\"{:.0}\">{}</text>\n", y + 22.0, r.name);
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
            peer: "cpprb-uniform",
            gear_insert: 1.0,
            peer_insert: 1.0,
            gear_sample: 1.0,
            peer_sample: 1.0,
            insert_ratio: ins,
            sample_ratio: smp,
            sample_ratio_range: (smp, smp),
            gear_sample_vs_memcpy: 1.0,
        };
        let rows = [row("a", 0.85, 3.5), row("b", 1.4, 9.8)];
        let svg = chart(&rows);
        assert_eq!(svg.matches("<rect x=").count(), 4);
        assert!(svg.contains("insert 0.85x") && svg.contains("sample 9.80x"), "{svg}");
        let md = table(&rows, 3);
        assert_eq!(md.lines().filter(|l| l.starts_with("| a") || l.starts_with("| b")).count(), 2);
    }
}
