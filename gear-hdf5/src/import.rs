//! Import: a file's episodes into a table, one trajectory per episode (or
//! per chunk of at most `T` steps of a longer one).
//!
//! Three steps. The plan reads only metadata and the episode flags: the
//! columns' datasets, their types, shapes and lengths against the table's
//! spec, the episodes and the trajectories they make, the table's
//! capacity. The verification (on by default) reads every row the import
//! will insert, window by window, and checks what only the data can show
//! (a bool that is not 0 or 1, a chunk that does not decompress, a file
//! cut short). Only then are trajectories inserted, window by window
//! again. So a file that is wrong in any way that can be checked changes
//! nothing in the table; what can still fail while inserting is the table
//! itself (closed, or a rate limiter that holds writers back past the
//! timeout), and that error says how many trajectories went in.

use crate::error::{Error, Result};
use crate::source::{chunks, d4rl_episodes, Chunk, Opened, Source};
use crate::types::{conversion, widen, Conversion};
use crate::{Element, ImportOptions, ImportProgress, ImportReport, Layout, Phase};
use gear_api::{ReplayTable, StepValue};
use gear_core::DType;
use std::path::Path;
use std::time::Instant;

/// Where one column's steps come from.
#[derive(Clone, Debug)]
struct Binding {
    column: usize,
    /// The dataset's path (below the episode group for Minari).
    dataset: String,
    element: Element,
    conv: Conversion,
    /// 1 for a Minari next-observation column (`observations[1..]`).
    shift: u64,
    /// Bytes of one step in the table.
    step_bytes: usize,
}

/// Rows read and inserted together.
struct Window {
    /// The Minari episode (an index into the source's episodes); `None`
    /// for D4RL.
    episode: Option<usize>,
    start: u64,
    rows: u64,
    /// `(first row, steps)` of each trajectory, inside the window.
    trajectories: Vec<(u64, u64)>,
}

struct Plan {
    bindings: Vec<Binding>,
    windows: Vec<Window>,
    episodes: u64,
    trajectories: u64,
    split_episodes: u64,
    steps: u64,
    unused: Vec<String>,
    dropped_final_observations: u64,
}

/// See [`crate::import_with_progress`].
pub(crate) fn run(
    table: &ReplayTable,
    path: &Path,
    options: &ImportOptions,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<ImportReport> {
    let started = Instant::now();
    let source = Source::open(path, options.layout)?;
    let plan = match source.layout {
        Layout::D4rl => plan_d4rl(&source, table, options)?,
        Layout::Minari => plan_minari(&source, table, options)?,
    };
    let capacity = table.spec().capacity();
    if plan.trajectories > capacity {
        return Err(source.mismatch(format!(
            "the file makes {} trajectories ({} episodes, cut at T = {} steps), the table holds {capacity}; \
             give the table a capacity of at least {}",
            plan.trajectories,
            plan.episodes,
            table.spec().max_len(),
            plan.trajectories
        )));
    }
    if options.verify {
        pass(&source, &plan, None, options, progress)?;
    }
    let before = table.info().map_err(Error::table)?.evictions;
    pass(&source, &plan, Some(table), options, progress)?;
    let after = table.info().map_err(Error::table)?.evictions;
    let spec = table.spec();
    Ok(ImportReport {
        path: path.to_owned(),
        layout: source.layout,
        episodes: plan.episodes,
        trajectories: plan.trajectories,
        split_episodes: plan.split_episodes,
        steps: plan.steps,
        bytes: plan.steps * spec.step_bytes(),
        columns: plan
            .bindings
            .iter()
            .map(|b| (spec.columns()[b.column].name().to_owned(), b.dataset.clone()))
            .collect(),
        unused_datasets: plan.unused,
        dropped_final_observations: plan.dropped_final_observations,
        evicted: after.saturating_sub(before),
        elapsed: started.elapsed(),
    })
}

/// The dataset a column reads: the one mapped to it, else the one of its
/// name.
fn dataset_for(column: &str, options: &ImportOptions) -> String {
    options.mapping.iter().find(|(_, c)| c == column).map_or_else(|| column.to_owned(), |(d, _)| d.clone())
}

/// Checks the mapping names columns the table has.
fn check_mapping(table: &ReplayTable, options: &ImportOptions) -> Result<()> {
    let spec = table.spec();
    let names: Vec<&str> = spec.columns().iter().map(|c| c.name()).collect();
    for (d, c) in &options.mapping {
        if !names.contains(&c.as_str()) {
            return Err(Error::Options(format!(
                "the mapping `{d}={c}` names column `{c}`; the table's columns are {names:?}"
            )));
        }
    }
    Ok(())
}

/// Checks dataset `d` against column `c` (shape and type) and says how
/// its elements convert.
fn bind(source: &Source, table: &ReplayTable, c: usize, d: &Opened, shown: &str, shift: u64) -> Result<Binding> {
    let col = &table.spec().columns()[c];
    if d.step_shape != col.shape() {
        return Err(source.mismatch(format!(
            "dataset `{shown}` has shape {:?} per step, column `{}` has {:?}",
            d.step_shape,
            col.name(),
            col.shape()
        )));
    }
    let conv = conversion(d.ty.element, col.dtype()).ok_or_else(|| {
        source.mismatch(format!(
            "dataset `{shown}` has dtype {}, column `{}` is {} (only lossless conversions are made: bool to \
             numbers, integers and floats to wider ones)",
            d.ty.element,
            col.name(),
            col.dtype().name()
        ))
    })?;
    let step_bytes = col.step_bytes().map_err(|e| Error::table(e.into()))? as usize;
    Ok(Binding { column: c, dataset: shown.to_owned(), element: d.ty.element, conv, shift, step_bytes })
}

fn plan_d4rl(source: &Source, table: &ReplayTable, options: &ImportOptions) -> Result<Plan> {
    check_mapping(table, options)?;
    let all = source.list(None)?;
    let obs = source.dataset(None, "observations")?;
    let n = obs.rows;
    let opened_rows = |d: &Opened| -> Result<()> {
        if d.rows != n {
            return Err(source.mismatch(format!(
                "dataset `{}` has {} rows, `observations` has {n}: the datasets' lengths disagree",
                d.name, d.rows
            )));
        }
        Ok(())
    };
    let mut bindings = Vec::new();
    let mut contiguous = true;
    for (c, col) in table.spec().columns().iter().enumerate() {
        let name = dataset_for(col.name(), options);
        if !all.contains(&name) {
            return Err(source.mismatch(format!(
                "column `{}` has no dataset `{name}` in the file (datasets: {all:?}); map one with DATASET={}",
                col.name(),
                col.name()
            )));
        }
        let d = source.dataset(None, &name)?;
        opened_rows(&d)?;
        contiguous &= d.contiguous.is_some();
        bindings.push(bind(source, table, c, &d, &name, 0)?);
    }
    let window = options.window_rows(table, contiguous);
    let mut ends = Vec::new();
    for flag in ["terminals", "timeouts"] {
        if all.iter().any(|d| d == flag) {
            let d = source.dataset(None, flag)?;
            opened_rows(&d)?;
            ends.extend(source.set_rows(&d, window)?);
        } else if flag == "terminals" {
            return Err(source.ds_err("terminals", "missing: a D4RL file marks episode ends with it"));
        }
    }
    ends.sort_unstable();
    ends.dedup();
    let episodes = d4rl_episodes(n, &ends);
    let (trajectories, split) = cut(source, table, options, &episodes)?;
    // Windows of whole trajectories, about `window` rows each.
    let mut windows: Vec<Window> = Vec::new();
    for &(_, start, len) in &trajectories {
        match windows.last_mut() {
            Some(w) if w.rows + len <= window => {
                w.rows += len;
                w.trajectories.push((start, len));
            }
            _ => windows.push(Window { episode: None, start, rows: len, trajectories: vec![(start, len)] }),
        }
    }
    let used: Vec<String> =
        bindings.iter().map(|b| b.dataset.clone()).chain(["terminals".into(), "timeouts".into()]).collect();
    let unused = all.iter().filter(|d| !used.contains(d)).cloned().collect();
    Ok(Plan {
        bindings,
        windows,
        episodes: episodes.len() as u64,
        trajectories: trajectories.len() as u64,
        split_episodes: split,
        steps: n,
        unused,
        dropped_final_observations: 0,
    })
}

/// Cuts episodes into trajectories of at most T steps, or refuses a long
/// one when splitting is off. Returns the trajectories and how many
/// episodes were split.
fn cut(
    source: &Source,
    table: &ReplayTable,
    options: &ImportOptions,
    episodes: &[(u64, u64)],
) -> Result<(Vec<Chunk>, u64)> {
    let t = table.spec().max_len();
    let long: Vec<usize> = (0..episodes.len()).filter(|&i| episodes[i].1 > t).collect();
    if let (Some(&i), false) = (long.first(), options.split_long_episodes) {
        let (start, len) = episodes[i];
        let at = match source.layout {
            Layout::D4rl => format!("rows {start}..{}", start + len),
            Layout::Minari => format!("group `{}`", source.episodes[i].name),
        };
        return Err(source.mismatch(format!(
            "episode {i} ({at}) has {len} steps, the table's max_len is {t} ({} episodes are longer; allow \
             splitting them into trajectories of at most {t} steps, or make max_len larger)",
            long.len()
        )));
    }
    Ok((chunks(episodes, t), long.len() as u64))
}

fn plan_minari(source: &Source, table: &ReplayTable, options: &ImportOptions) -> Result<Plan> {
    check_mapping(table, options)?;
    let spec = table.spec();
    let mut first: Option<Vec<Binding>> = None;
    let mut episodes = Vec::with_capacity(source.episodes.len());
    let mut unused = Vec::new();
    let mut dropped = 0;
    for (e, episode) in source.episodes.iter().enumerate() {
        let group = &episode.name;
        let all = source.list(Some(e))?;
        let actions = source.dataset(Some(e), "actions")?;
        let t = actions.rows;
        let mut bindings = Vec::new();
        let mut next_used = false;
        let mut final_obs = false;
        for (c, col) in spec.columns().iter().enumerate() {
            let name = dataset_for(col.name(), options);
            let is_next = options.next_observations.as_deref() == Some(col.name())
                || (options.next_observations.is_none()
                    && col.name() == "next_observations"
                    && !all.contains(&name)
                    && !options.mapping.iter().any(|(_, c)| c == col.name()));
            let (dname, shift) = if is_next { ("observations".to_owned(), 1) } else { (name, 0) };
            if !all.contains(&dname) {
                return Err(source.mismatch(format!(
                    "column `{}` has no dataset `{group}/{dname}` (datasets: {all:?}); map one with DATASET={}",
                    col.name(),
                    col.name()
                )));
            }
            let d = source.dataset(Some(e), &dname)?;
            // Minari's observations (and some infos) have one row more
            // than the episode has steps: the final observation.
            let fits = if shift == 1 { d.rows == t + 1 } else { d.rows == t || d.rows == t + 1 };
            if !fits {
                return Err(source.mismatch(format!(
                    "dataset `{group}/{dname}` has {} rows, the episode has {t} steps (`actions`){}: the \
                     datasets' lengths disagree",
                    d.rows,
                    if shift == 1 { " and the next observations need one more" } else { "" }
                )));
            }
            if dname == "observations" && shift == 0 && d.rows == t + 1 {
                final_obs = true;
            }
            next_used |= shift == 1;
            bindings.push(bind(source, table, c, &d, &dname, shift)?);
        }
        if final_obs && !next_used {
            dropped += 1;
        }
        match &first {
            None => {
                let used: Vec<&str> = bindings.iter().map(|b| b.dataset.as_str()).collect();
                unused = all.iter().filter(|d| !used.contains(&d.as_str())).cloned().collect();
                first = Some(bindings);
            }
            Some(f) => {
                if let Some((a, b)) = f.iter().zip(&bindings).find(|(a, b)| a.element != b.element) {
                    return Err(source.mismatch(format!(
                        "dataset `{group}/{}` has dtype {}, the first episode's has {}",
                        b.dataset, b.element, a.element
                    )));
                }
            }
        }
        episodes.push((0, t));
    }
    let (trajectories, split) = cut(source, table, options, &episodes)?;
    let mut windows: Vec<Window> = Vec::new();
    for (i, start, len) in trajectories.iter().copied() {
        match windows.last_mut() {
            Some(w) if w.episode == Some(i) => {
                w.rows += len;
                w.trajectories.push((start, len));
            }
            _ => windows.push(Window { episode: Some(i), start, rows: len, trajectories: vec![(start, len)] }),
        }
    }
    Ok(Plan {
        bindings: first.unwrap_or_default(),
        windows,
        episodes: episodes.len() as u64,
        trajectories: trajectories.len() as u64,
        split_episodes: split,
        steps: episodes.iter().map(|e| e.1).sum(),
        unused,
        dropped_final_observations: dropped,
    })
}

/// Reads every window; checks its data (`table` = `None`) or inserts its
/// trajectories.
fn pass(
    source: &Source,
    plan: &Plan,
    table: Option<&ReplayTable>,
    options: &ImportOptions,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<()> {
    let phase = if table.is_some() { Phase::Insert } else { Phase::Verify };
    let mut done = 0;
    let mut inserted = 0;
    progress(ImportProgress { phase, steps_done: 0, total_steps: plan.steps });
    let writer = table.map(|t| match options.timeout {
        Some(d) => t.writer().with_timeout(d),
        None => t.writer(),
    });
    let mut columns: Vec<Vec<u8>> = vec![Vec::new(); plan.bindings.len()];
    let mut raw: Vec<u8> = Vec::new();
    // Each dataset is opened once per episode group (D4RL: once).
    let mut opened: Vec<Opened> = Vec::new();
    let mut opened_for: Option<Option<usize>> = None;
    for w in &plan.windows {
        if opened_for != Some(w.episode) {
            opened.clear();
            for b in &plan.bindings {
                opened.push(source.dataset(w.episode, &b.dataset)?);
            }
            opened_for = Some(w.episode);
        }
        for ((b, d), out) in plan.bindings.iter().zip(&opened).zip(columns.iter_mut()) {
            // The verification reads what reading can find wrong; the rest
            // was checked when the dataset was opened (it lies inside the
            // file, and any bytes are values).
            if table.is_none() && !d.worth_verifying() {
                continue;
            }
            match b.conv {
                Conversion::Copy => source.read_rows_into(d, w.start + b.shift, w.rows, out)?,
                Conversion::Widen { from, to } => {
                    source.read_rows_into(d, w.start + b.shift, w.rows, &mut raw)?;
                    out.clear();
                    widen(&raw, from, to, out);
                }
            }
            if out.len() != w.rows as usize * b.step_bytes {
                return Err(source.ds_err(
                    &d.name,
                    format!("rows convert to {} bytes, expected {}", out.len(), w.rows as usize * b.step_bytes),
                ));
            }
            if table.is_none() && b.element == Element::Gear(DType::Bool) {
                if let Some(i) = out.iter().position(|&v| v > 1) {
                    let per_row = b.step_bytes.max(1);
                    return Err(Error::Row {
                        path: source.path.clone(),
                        dataset: d.name.clone(),
                        row: w.start + b.shift + (i / per_row) as u64,
                        problem: format!("a bool holds {} (bools are 0 or 1)", out[i]),
                    });
                }
            }
        }
        for &(start, len) in &w.trajectories {
            if let Some(writer) = &writer {
                let off = (start - w.start) as usize;
                let table_err = |source| Error::Table { source, inserted };
                let mut traj = writer.begin(None).map_err(table_err)?;
                for (b, bytes) in plan.bindings.iter().zip(&columns) {
                    let s = b.step_bytes;
                    let slice = &bytes[off * s..(off + len as usize) * s];
                    traj.append_column(b.column, len, StepValue::bytes(slice)).map_err(table_err)?;
                }
                traj.end().map_err(table_err)?;
                inserted += 1;
            }
            done += len;
        }
        progress(ImportProgress { phase, steps_done: done, total_steps: plan.steps });
    }
    Ok(())
}
