//! Export: a table's committed trajectories to a D4RL or Minari file (see
//! [`crate::export`]), and [`crate::describe`].

use crate::error::{Error, Result};
use crate::source::{d4rl_episodes, Source};
use crate::types::{hdf5_type, is_set};
use crate::{DatasetInfo, Element, ExportOptions, ExportReport, FileInfo, Layout};
use gear_api::table::checkpoint::files::{self, ReplacingFile};
use gear_api::ReplayTable;
use gear_core::DType;
use hdf5_pure::{AttrValue, DatasetBuilder, FileBuilder, GroupBuilder};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// A dataset to write.
struct Staged {
    dtype: DType,
    /// Full shape: rows, then the step shape.
    shape: Vec<u64>,
    bytes: Vec<u8>,
}

/// A group to write: its datasets, subgroups and attributes.
#[derive(Default)]
struct Node {
    datasets: Vec<(String, Staged)>,
    groups: BTreeMap<String, Node>,
    attrs: Vec<(String, AttrValue)>,
}

impl Node {
    /// Places `staged` at `path` (`a/b/c`: groups `a`, `b`, dataset `c`).
    fn put(&mut self, path: &str, staged: Staged) {
        match path.split_once('/') {
            Some((g, rest)) => self.groups.entry(g.to_owned()).or_default().put(rest, staged),
            None => self.datasets.push((path.to_owned(), staged)),
        }
    }
}

pub(crate) fn run(table: &ReplayTable, path: &Path, options: &ExportOptions) -> Result<ExportReport> {
    let started = Instant::now();
    let werr = |problem: String| Error::Write { path: path.to_owned(), problem };
    // Refused before the table is read: a device (`/dev/null`), a
    // directory, a FIFO, a socket or a symbolic link is never replaced.
    files::check_replaceable(path).map_err(|e| werr(e.to_string()))?;
    // Temporary files of earlier exports to this path that died.
    ReplacingFile::remove_stale_of(path).map_err(|e| werr(e.to_string()))?;
    let spec = table.spec();
    let names: Vec<String> = spec
        .columns()
        .iter()
        .map(|c| options.rename.iter().find(|(col, _)| col == c.name()).map_or(c.name(), |(_, d)| d).to_owned())
        .collect();
    for (col, _) in &options.rename {
        spec.column_index(col).map_err(|e| Error::Options(format!("rename `{col}`: {e}")))?;
    }
    let step_bytes: Vec<usize> = spec.columns().iter().map(|c| c.step_bytes().unwrap_or(0) as usize).collect();
    // Gather every intact trajectory, column by column.
    let listed = table.committed_trajectories().map_err(Error::table)?;
    let mut data: Vec<Vec<u8>> = vec![Vec::new(); names.len()];
    let mut lens: Vec<u64> = Vec::with_capacity(listed.len());
    let mut scratch: Vec<Vec<u8>> = vec![Vec::new(); names.len()];
    let mut dropped = 0;
    'next: for t in &listed {
        for (c, buf) in scratch.iter_mut().enumerate() {
            buf.resize(t.len as usize * step_bytes[c], 0);
            if !table.read_trajectory(t.key, c, 0, buf).map_err(Error::table)? {
                dropped += 1;
                continue 'next;
            }
        }
        for (out, buf) in data.iter_mut().zip(&scratch) {
            out.extend_from_slice(buf);
        }
        lens.push(t.len);
    }
    if lens.is_empty() {
        return Err(werr("the table holds no committed trajectories: nothing to export".into()));
    }
    let steps: u64 = lens.iter().sum();
    let mut root = Node::default();
    let mut terminals_from_ends = false;
    let episodes = match options.layout {
        Layout::D4rl => {
            for (c, col) in spec.columns().iter().enumerate() {
                let mut shape = vec![steps];
                shape.extend_from_slice(col.shape());
                root.put(&names[c], Staged { dtype: col.dtype(), shape, bytes: std::mem::take(&mut data[c]) });
            }
            if !names.iter().any(|n| n == "terminals") {
                terminals_from_ends = true;
                let mut flags = vec![0u8; steps as usize];
                let mut end = 0;
                for &l in &lens {
                    end += l;
                    flags[end as usize - 1] = 1;
                }
                root.put("terminals", Staged { dtype: DType::Bool, shape: vec![steps], bytes: flags });
            }
            lens.len() as u64
        }
        Layout::Minari => minari(table, options, &names, &step_bytes, &mut data, &lens, &mut root).map_err(werr)?,
    };
    let mut datasets = Vec::new();
    list(&root, "", &mut datasets);
    let mut fb = FileBuilder::new();
    for (name, value) in std::mem::take(&mut root.attrs) {
        fb.set_attr(&name, value);
    }
    for (name, s) in root.datasets.drain(..) {
        fill(fb.create_dataset(&name), s, options).map_err(werr)?;
    }
    for (name, node) in std::mem::take(&mut root.groups) {
        let mut g = fb.create_group(&name);
        emit(&mut g, node, options).map_err(werr)?;
        fb.add_group(g.finish());
    }
    // Written under a locked temporary name, renamed over the target once
    // complete (dropped on an error: the temporary file goes with it).
    let mut out = ReplacingFile::create(path).map_err(|e| werr(e.to_string()))?;
    fb.finish_to(out.file()).map_err(|e| werr(e.to_string()))?;
    out.commit().map_err(|e| werr(e.to_string()))?;
    let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(ExportReport {
        path: path.to_owned(),
        layout: options.layout,
        trajectories: lens.len() as u64,
        episodes,
        steps,
        dropped,
        datasets,
        terminals_from_ends,
        file_bytes,
        elapsed: started.elapsed(),
    })
}

/// Stages a Minari file: episodes from the trajectories, one group each.
/// Returns the number of episodes.
fn minari(
    table: &ReplayTable,
    options: &ExportOptions,
    names: &[String],
    step_bytes: &[usize],
    data: &mut [Vec<u8>],
    lens: &[u64],
    root: &mut Node,
) -> std::result::Result<u64, String> {
    let spec = table.spec();
    let find = |name: &str| names.iter().position(|n| n == name);
    let next = match &options.next_observations {
        Some(col) => Some(spec.column_index(col).map_err(|e| format!("next observations: {e}"))?),
        None => spec.column_index("next_observations").ok(),
    };
    let obs = find("observations");
    if let (Some(o), None) = (obs, next) {
        return Err(format!(
            "column `{}` has one row per step, and Minari needs each episode's final observation too: the table has \
             no next-observation column (import with one, or export as d4rl)",
            spec.columns()[o].name()
        ));
    }
    if let (Some(o), Some(n)) = (obs, next) {
        let (a, b) = (&spec.columns()[o], &spec.columns()[n]);
        if a.dtype() != b.dtype() || a.shape() != b.shape() {
            return Err(format!("columns `{}` and `{}` differ in dtype or shape", a.name(), b.name()));
        }
    }
    // Episode ends: a trajectory whose last step terminates or truncates.
    let flags: Vec<usize> = ["terminations", "truncations"].iter().filter_map(|f| find(f)).collect();
    let mut episodes: Vec<(usize, usize)> = Vec::new(); // trajectories first..last
    let mut offsets = Vec::with_capacity(lens.len() + 1);
    offsets.push(0u64);
    for &l in lens {
        offsets.push(offsets.last().copied().unwrap_or(0) + l);
    }
    let mut first = 0;
    for i in 0..lens.len() {
        let last_step = offsets[i + 1] - 1;
        let ends = flags.is_empty()
            || flags.iter().any(|&c| {
                let s = step_bytes[c];
                let e = &data[c][last_step as usize * s..(last_step as usize + 1) * s];
                is_set(e, Element::Gear(spec.columns()[c].dtype()))
            });
        if ends || i + 1 == lens.len() {
            episodes.push((first, i));
            first = i + 1;
        }
    }
    let mut total_steps = 0u64;
    for (e, &(a, b)) in episodes.iter().enumerate() {
        let (r0, r1) = (offsets[a], offsets[b + 1]);
        let group = format!("episode_{e}");
        for (c, col) in spec.columns().iter().enumerate() {
            if Some(c) == next {
                continue;
            }
            let s = step_bytes[c];
            let mut bytes = data[c][r0 as usize * s..r1 as usize * s].to_vec();
            let mut rows = r1 - r0;
            if Some(c) == obs {
                let n = next.unwrap_or(c);
                bytes.extend_from_slice(&data[n][(r1 as usize - 1) * s..r1 as usize * s]);
                rows += 1;
            }
            let mut shape = vec![rows];
            shape.extend_from_slice(col.shape());
            root.put(&format!("{group}/{}", names[c]), Staged { dtype: col.dtype(), shape, bytes });
        }
        let node = root.groups.entry(group).or_default();
        node.attrs.push(("id".into(), AttrValue::I64(e as i64)));
        node.attrs.push(("total_steps".into(), AttrValue::I64((r1 - r0) as i64)));
        total_steps += r1 - r0;
    }
    for d in data.iter_mut() {
        *d = Vec::new();
    }
    root.attrs.push(("total_episodes".into(), AttrValue::I64(episodes.len() as i64)));
    root.attrs.push(("total_steps".into(), AttrValue::I64(total_steps as i64)));
    Ok(episodes.len() as u64)
}

fn list(node: &Node, prefix: &str, out: &mut Vec<String>) {
    for (name, _) in &node.datasets {
        out.push(format!("{prefix}{name}"));
    }
    for (name, g) in &node.groups {
        list(g, &format!("{prefix}{name}/"), out);
    }
}

fn emit(g: &mut GroupBuilder, mut node: Node, options: &ExportOptions) -> std::result::Result<(), String> {
    for (name, value) in node.attrs.drain(..) {
        g.set_attr(&name, value);
    }
    for (name, s) in node.datasets.drain(..) {
        fill(g.create_dataset(&name), s, options)?;
    }
    for (name, child) in std::mem::take(&mut node.groups) {
        let mut sub = g.create_group(&name);
        emit(&mut sub, child, options)?;
        g.add_group(sub.finish());
    }
    Ok(())
}

fn fill(db: &mut DatasetBuilder, s: Staged, options: &ExportOptions) -> std::result::Result<(), String> {
    let dt = hdf5_type(s.dtype)?;
    let elements = s.bytes.len() as u64 / s.dtype.size();
    let row_bytes = (s.bytes.len() as u64 / s.shape[0].max(1)).max(1);
    db.with_raw_data(dt, s.bytes, elements).with_shape(&s.shape);
    if let Some(level) = options.deflate {
        // Chunks of about 1 MiB of whole rows.
        let mut chunk = s.shape.clone();
        chunk[0] = ((1u64 << 20) / row_bytes).clamp(1, s.shape[0].max(1));
        db.with_chunks(&chunk).with_deflate(level.min(9));
    }
    Ok(())
}

/// See [`crate::describe`].
pub(crate) fn describe(path: &Path, layout: Option<Layout>) -> Result<FileInfo> {
    let source = Source::open(path, layout)?;
    let info = |d: &crate::source::Opened, name: &str| DatasetInfo {
        name: name.to_owned(),
        element: d.ty.element,
        rows: d.rows,
        step_shape: d.step_shape.clone(),
    };
    let mut datasets = Vec::new();
    let lengths: Vec<u64> = match source.layout {
        Layout::D4rl => {
            let n = source.dataset(None, "observations")?.rows;
            for name in source.list(None)? {
                let Ok(d) = source.dataset(None, &name) else { continue };
                if d.rows == n {
                    datasets.push(info(&d, &name));
                }
            }
            let mut ends = Vec::new();
            for flag in ["terminals", "timeouts"] {
                if let Ok(d) = source.dataset(None, flag) {
                    ends.extend(source.set_rows(&d, 1 << 20)?);
                }
            }
            ends.sort_unstable();
            ends.dedup();
            d4rl_episodes(n, &ends).into_iter().map(|e| e.1).collect()
        }
        Layout::Minari => {
            let mut lengths = Vec::new();
            for i in 0..source.episodes.len() {
                let t = source.dataset(Some(i), "actions")?.rows;
                if i == 0 {
                    for name in source.list(Some(i))? {
                        let Ok(d) = source.dataset(Some(i), &name) else { continue };
                        if d.rows == t || d.rows == t + 1 {
                            datasets.push(info(&d, &name));
                        }
                    }
                }
                lengths.push(t);
            }
            lengths
        }
    };
    Ok(FileInfo {
        layout: source.layout,
        datasets,
        episodes: lengths.len() as u64,
        steps: lengths.iter().sum(),
        longest_episode: lengths.iter().copied().max().unwrap_or(0),
        episode_lengths: lengths,
    })
}
