//! `gear.import_hdf5` and `gear.export_hdf5`: offline datasets (HDF5 files
//! in the D4RL or Minari layout) into and out of a table, through
//! gear-hdf5. Both release the GIL while they read and write.

use crate::error::{GearError, SpecError, StepError};
use crate::table::Table;
use gear_hdf5::{Error as H5Error, ExportOptions, ImportOptions, Layout};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;
use std::path::PathBuf;

/// The exception class of a gear-hdf5 error: the file and the table
/// disagreeing or bad options are `SpecError`, a value that cannot be
/// stored is `StepError`, a table error keeps its own class, anything
/// about the file itself is `GearError`.
fn to_py(e: H5Error) -> PyErr {
    let msg = e.to_string();
    match e {
        H5Error::Mismatch { .. } | H5Error::Options(_) => SpecError::new_err(msg),
        H5Error::Row { .. } => StepError::new_err(msg),
        H5Error::Table { source, .. } => {
            let class = PyErr::from(crate::error::Error::Gear(source));
            Python::attach(|py| PyErr::from_type(class.get_type(py), msg))
        }
        _ => GearError::new_err(msg),
    }
}

fn layout(name: Option<&str>) -> PyResult<Option<Layout>> {
    name.map(|s| s.parse::<Layout>()).transpose().map_err(to_py)
}

/// Imports the HDF5 file at `path` into `table`: D4RL (top-level
/// `observations`, `actions`, `rewards`, `terminals`, `timeouts`, ...) or
/// Minari (`episode_<id>` groups) layout, found from the file unless
/// `layout` (`"d4rl"` or `"minari"`) says. Each episode becomes a
/// trajectory (episodes longer than the table's `max_len` are cut into
/// several). Columns read the dataset of their name, or the one `mapping`
/// (`{dataset: column}`) maps to them; dtypes must match or widen
/// losslessly. Everything is checked before the first insert, so a file
/// that does not fit raises and leaves the table unchanged. Returns a
/// report (a dict: episodes, trajectories, split_episodes, steps, bytes,
/// columns, unused_datasets, dropped_final_observations, evicted,
/// seconds).
#[pyfunction]
#[pyo3(signature = (table, path, layout=None, mapping=None, next_observations=None, split_long_episodes=true))]
pub fn import_hdf5<'py>(
    py: Python<'py>,
    table: &Table,
    path: PathBuf,
    layout: Option<&str>,
    mapping: Option<HashMap<String, String>>,
    next_observations: Option<String>,
    split_long_episodes: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let mut pairs: Vec<(String, String)> = mapping.unwrap_or_default().into_iter().collect();
    pairs.sort();
    let options = ImportOptions {
        layout: self::layout(layout)?,
        mapping: pairs,
        next_observations,
        split_long_episodes,
        ..ImportOptions::default()
    };
    let inner = table.inner.clone();
    let r = py.detach(|| gear_hdf5::import(&inner, &path, &options)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("layout", r.layout.to_string())?;
    d.set_item("episodes", r.episodes)?;
    d.set_item("trajectories", r.trajectories)?;
    d.set_item("split_episodes", r.split_episodes)?;
    d.set_item("steps", r.steps)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("columns", r.columns)?;
    d.set_item("unused_datasets", r.unused_datasets)?;
    d.set_item("dropped_final_observations", r.dropped_final_observations)?;
    d.set_item("evicted", r.evicted)?;
    d.set_item("seconds", r.elapsed.as_secs_f64())?;
    Ok(d)
}

/// Writes the committed trajectories of `table`, oldest first, to an HDF5
/// file at `path` in the `layout` given (`"d4rl"`, the default, or
/// `"minari"`). Bools are written as h5py writes them, so h5py reads every
/// dataset back with the table's dtypes; a D4RL file imported into
/// columns of its own dtypes exports to equal datasets. `rename`
/// (`{column: dataset}`) writes a column under another name; `deflate`
/// (0-9) stores datasets chunked and compressed. Returns a report (a dict:
/// trajectories, episodes, steps, dropped, datasets, terminals_from_ends,
/// file_bytes, seconds).
#[pyfunction]
#[pyo3(signature = (table, path, layout="d4rl", rename=None, deflate=None))]
pub fn export_hdf5<'py>(
    py: Python<'py>,
    table: &Table,
    path: PathBuf,
    layout: &str,
    rename: Option<HashMap<String, String>>,
    deflate: Option<u32>,
) -> PyResult<Bound<'py, PyDict>> {
    let options = ExportOptions {
        layout: self::layout(Some(layout))?.unwrap_or(Layout::D4rl),
        rename: rename.unwrap_or_default().into_iter().collect(),
        deflate,
        ..ExportOptions::default()
    };
    let inner = table.inner.clone();
    let r = py.detach(|| gear_hdf5::export(&inner, &path, &options)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("layout", r.layout.to_string())?;
    d.set_item("trajectories", r.trajectories)?;
    d.set_item("episodes", r.episodes)?;
    d.set_item("steps", r.steps)?;
    d.set_item("dropped", r.dropped)?;
    d.set_item("datasets", r.datasets)?;
    d.set_item("terminals_from_ends", r.terminals_from_ends)?;
    d.set_item("file_bytes", r.file_bytes)?;
    d.set_item("seconds", r.elapsed.as_secs_f64())?;
    Ok(d)
}
