//! # gear-hdf5
//!
//! Offline datasets in and out of a GEAR table: HDF5 files in the
//! [D4RL](https://github.com/Farama-Foundation/D4RL) and
//! [Minari](https://minari.farama.org) layouts, read and written with
//! [`hdf5-pure`](https://docs.rs/hdf5-pure) (pure Rust: no libhdf5, no
//! cmake, nothing to install).
//!
//! ```no_run
//! use gear_api::ReplayTable;
//! use gear_hdf5::{ExportOptions, ImportOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A table for the file's columns, T = 1000, room for every episode.
//! let info = gear_hdf5::describe("hopper-medium-v2.hdf5".as_ref(), None)?;
//! let table = ReplayTable::builder(info.table_spec(Some(1000), None)?).build()?;
//! let report = gear_hdf5::import(&table, "hopper-medium-v2.hdf5".as_ref(), &ImportOptions::default())?;
//! println!("{} episodes, {} trajectories", report.episodes, report.trajectories);
//! gear_hdf5::export(&table, "copy.hdf5".as_ref(), &ExportOptions::default())?;
//! # Ok(()) }
//! ```
//!
//! ## Layouts
//! * **D4RL**: top-level datasets of `N` rows: `observations`, `actions`,
//!   `rewards`, `terminals`, optionally `timeouts`, `next_observations`
//!   and any others (`infos/qpos`, ...). Episodes end after every row whose
//!   `terminals` or `timeouts` is nonzero; the rows after the last end
//!   are one more (partial) episode, kept.
//! * **Minari**: groups `episode_<id>`, imported in id order, each holding
//!   `observations` (`T + 1` rows: the last is the observation after the
//!   final step), `actions`, `rewards`, `terminations`, `truncations` (`T`
//!   rows), and optionally `infos/...`. The final observation goes into the
//!   column [`ImportOptions::next_observations`] names (by default a column
//!   named `next_observations`, when the table has one and the episodes no
//!   dataset of that name): that column holds `observations[1..T+1]`, so
//!   nothing is lost and an export rebuilds the `T + 1` rows. Without such a
//!   column the final observation is dropped (counted in
//!   [`ImportReport::dropped_final_observations`]).
//!
//! The layout is found from the file (a top-level `observations` dataset
//! is D4RL, `episode_*` groups are Minari) or given.
//!
//! ## Columns
//! Each table column reads the dataset of its name, or the one
//! [`ImportOptions::mapping`] maps to it; every column needs one. Shapes
//! must be equal; dtypes equal, or converted where no value can change
//! (bool to any number, an integer or float to a wider one; h5py's bool
//! enum is a bool, unsigned 16- and 32-bit integers widen to signed ones).
//! Anything else is refused with an error naming the dataset and the
//! column. Datasets no column reads are listed in
//! [`ImportReport::unused_datasets`]. Keep `terminals` and `timeouts`
//! (D4RL) or `terminations` and `truncations` (Minari) as columns: an
//! export rebuilds the file's episode ends from them.
//!
//! ## Episodes longer than the table's `T`
//! Each episode becomes one trajectory. One longer than the table's
//! `max_len` is cut into trajectories of at most `max_len` steps (in
//! order; counted in [`ImportReport::split_episodes`]), or refused when
//! [`ImportOptions::split_long_episodes`] is off.
//!
//! ## Memory and order of work
//! The file is opened streaming (hdf5-pure reads metadata and chunks on
//! demand) and read in windows of rows, so an import holds one window,
//! never the whole dataset. Contiguous datasets (h5py's default) are read
//! with `pread` straight into a reused buffer,
//! [`CONTIGUOUS_WINDOW_BYTES`] at a time; chunked ones through hdf5-pure
//! (`read_raw_rows`: only the chunks a window touches are decompressed),
//! about [`ImportOptions::window_bytes`] at a time. Minari episode groups
//! are opened once, by handle (never by a path from the root, which
//! hdf5-pure resolves by walking the root's members: quadratic in the
//! episodes). Everything that can be checked is checked before the first
//! insert: datasets, types, shapes, lengths, episodes against `T` and the
//! capacity, that every contiguous dataset lies inside the file, and (with
//! [`ImportOptions::verify`], the default) every row that reading can find
//! wrong, read once: chunked datasets decompressed (and their checksums
//! checked), bools checked to be 0 or 1. Contiguous numbers are not read
//! twice: any bytes there are values, and their extent was checked. A file
//! that fails changes nothing in the table.
//!
//! Targets and sources that are not regular files are refused: an export
//! never replaces a device (`/dev/null`), a directory, a FIFO, a socket or
//! a symbolic link, and an import never reads from a FIFO or a device.
//! Exports are written under a locked temporary name and renamed into
//! place ([`gear_api::table::checkpoint::files::ReplacingFile`]); the
//! temporary files of exports to the same path that died are removed.
//!
//! An export gathers each dataset whole in memory before writing it:
//! hdf5-pure's `FileBuilder` writes a file from datasets it holds. See
//! [`export`].

// No unsafe code here; keep it that way (Miri and review focus on the crates that have some).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod export;
mod import;
mod source;
mod types;

pub use error::{Error, Result};
pub use source::DatasetInfo;
pub use types::Element;

use gear_api::ReplayTable;
use gear_core::{ColumnSpec, TableSpec};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a file lays its episodes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Top-level datasets of all steps, episodes cut by `terminals` and
    /// `timeouts`.
    D4rl,
    /// One group `episode_<id>` per episode.
    Minari,
}

impl std::str::FromStr for Layout {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "d4rl" => Ok(Layout::D4rl),
            "minari" => Ok(Layout::Minari),
            _ => Err(Error::Options(format!("unknown layout `{s}` (d4rl or minari)"))),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::D4rl => "d4rl",
            Layout::Minari => "minari",
        })
    }
}

/// How [`import`] reads a file.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// The layout; found from the file when `None`.
    pub layout: Option<Layout>,
    /// `(dataset, column)` pairs: the column reads that dataset instead of
    /// the one of its own name (paths below the episode group for Minari).
    pub mapping: Vec<(String, String)>,
    /// Minari: the column that receives `observations[1..T+1]` (each
    /// step's next observation, the final one included). `None`: a column
    /// named `next_observations`, when the table has one and the episodes
    /// no dataset of that name.
    pub next_observations: Option<String>,
    /// Cut episodes longer than the table's `max_len` into several
    /// trajectories (default); refuse the file when off.
    pub split_long_episodes: bool,
    /// Read every row that reading can find wrong once before inserting
    /// anything (default: chunked datasets and bools; see the crate doc),
    /// so a file that is corrupt past its metadata changes nothing in the
    /// table. Off: a bad chunk found mid-import leaves the trajectories
    /// before it in the table.
    pub verify: bool,
    /// About how many bytes of rows are read at a time from chunked
    /// datasets (default 64 MiB; at least one trajectory), so that each
    /// chunk is decompressed about once. Files whose datasets are all
    /// contiguous are read [`CONTIGUOUS_WINDOW_BYTES`] at a time (or this,
    /// when smaller).
    pub window_bytes: u64,
    /// How long one insert may wait for the table's rate limiter (default
    /// 30 s); an import into a table whose limiter holds writers back
    /// fails with the number of trajectories inserted.
    pub timeout: Option<Duration>,
    /// The items each imported trajectory gets, in a table with items
    /// (`None`: the table's own pattern). `ItemPattern::Transitions { n }`
    /// makes one transition item per row that has a next row in its
    /// trajectory, so observations are stored once and the table's
    /// `TransitionSampler` serves (obs, next_obs) pairs from them; a file's
    /// `next_observations` dataset then needs no column (leave it out of
    /// the spec: it is listed as unused). A trajectory's last row has no
    /// next row: it gets no transition item.
    pub items: Option<gear_api::ItemPattern>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            layout: None,
            mapping: Vec::new(),
            next_observations: None,
            split_long_episodes: true,
            verify: true,
            window_bytes: 64 << 20,
            timeout: Some(Duration::from_secs(30)),
            items: None,
        }
    }
}

/// Bytes of rows an import reads at a time when every dataset it reads
/// is contiguous: the rows go from the file into a buffer with `pread`
/// and from there into the table, and a buffer this small stays in the
/// CPU's caches between the two copies (a 1M-step file imported 1.9x
/// faster than with 64 MiB windows; see docs/PERFORMANCE.md).
pub const CONTIGUOUS_WINDOW_BYTES: u64 = 2 << 20;

impl ImportOptions {
    /// Rows per read window for `table`: `window_bytes` worth (at most
    /// [`CONTIGUOUS_WINDOW_BYTES`] when every dataset is `contiguous`), at
    /// least T.
    pub(crate) fn window_rows(&self, table: &ReplayTable, contiguous: bool) -> u64 {
        let row = table.spec().step_bytes().max(1);
        let bytes = if contiguous { self.window_bytes.min(CONTIGUOUS_WINDOW_BYTES) } else { self.window_bytes };
        (bytes / row).max(table.spec().max_len()).max(1)
    }
}

/// Which pass of an import a [`ImportProgress`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reading every row to check it ([`ImportOptions::verify`]).
    Verify,
    /// Inserting trajectories.
    Insert,
}

/// Progress of an import, reported after each window of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportProgress {
    /// The pass.
    pub phase: Phase,
    /// Steps (rows) done in this pass.
    pub steps_done: u64,
    /// Steps the pass will do.
    pub total_steps: u64,
}

/// What [`import`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportReport {
    /// The file.
    pub path: PathBuf,
    /// Its layout.
    pub layout: Layout,
    /// Episodes in the file (a D4RL file's trailing partial one included).
    pub episodes: u64,
    /// Trajectories inserted: one per episode, more for split episodes.
    pub trajectories: u64,
    /// Episodes longer than the table's `max_len`, cut into several
    /// trajectories.
    pub split_episodes: u64,
    /// Steps inserted.
    pub steps: u64,
    /// Bytes of step data inserted.
    pub bytes: u64,
    /// `(column, dataset)` for every column of the table.
    pub columns: Vec<(String, String)>,
    /// Datasets of the file no column read (`terminals`/`timeouts` count
    /// as read: they cut the episodes).
    pub unused_datasets: Vec<String>,
    /// Minari episodes whose final observation was not stored (no
    /// next-observation column).
    pub dropped_final_observations: u64,
    /// Trajectories already in the table that were evicted to make room.
    pub evicted: u64,
    /// Items the imported trajectories got (0 in a table without items).
    pub items: u64,
    /// Time taken.
    pub elapsed: Duration,
}

/// How [`export`] writes a file.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// The layout to write (default D4RL).
    pub layout: Layout,
    /// `(column, dataset)` pairs: the column is written under that dataset
    /// name instead of its own.
    pub rename: Vec<(String, String)>,
    /// Minari: the column holding each step's next observation, folded back
    /// into `observations` as its final row (default: `next_observations`
    /// when the table has it).
    pub next_observations: Option<String>,
    /// Store datasets chunked and deflate-compressed at this level (0-9),
    /// as D4RL's files are; `None` (default): contiguous, uncompressed.
    pub deflate: Option<u32>,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions { layout: Layout::D4rl, rename: Vec::new(), next_observations: None, deflate: None }
    }
}

/// What [`export`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportReport {
    /// The file.
    pub path: PathBuf,
    /// Its layout.
    pub layout: Layout,
    /// Trajectories written.
    pub trajectories: u64,
    /// Episodes written (Minari groups; D4RL: episode ends marked).
    pub episodes: u64,
    /// Steps written.
    pub steps: u64,
    /// Trajectories evicted between the listing and their copy, left out.
    pub dropped: u64,
    /// Datasets written, by path.
    pub datasets: Vec<String>,
    /// Whether the D4RL `terminals` dataset was made from trajectory ends
    /// (the table has no `terminals` column).
    pub terminals_from_ends: bool,
    /// Size of the file.
    pub file_bytes: u64,
    /// Time taken.
    pub elapsed: Duration,
}

/// Imports the episodes of the HDF5 file at `path` into `table`; see the
/// crate documentation.
pub fn import(table: &ReplayTable, path: &Path, options: &ImportOptions) -> Result<ImportReport> {
    import::run(table, path, options, &mut |_| {})
}

/// [`import`], calling `progress` after each window of rows of each pass
/// (for a progress bar).
pub fn import_with_progress(
    table: &ReplayTable,
    path: &Path,
    options: &ImportOptions,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<ImportReport> {
    import::run(table, path, options, progress)
}

/// Writes the committed trajectories of `table`, oldest insert first, to
/// an HDF5 file at `path` in the layout [`ExportOptions::layout`] names.
///
/// * D4RL: every column becomes a top-level dataset of all steps (a name
///   with `/` goes into groups). With no `terminals` column, a `terminals`
///   dataset (bool) marks each trajectory's last step.
/// * Minari: one group `episode_<i>` per episode, numbered from 0. With
///   `terminations`/`truncations` columns, consecutive trajectories are one
///   episode until one ends with either set (episodes an import split are
///   joined again); without them, each trajectory is an episode. The
///   next-observation column is folded into `observations` (`T + 1`
///   rows); a table without one is refused (Minari needs the final
///   observation).
///
/// Bools are written as h5py writes them (an enum `{FALSE, TRUE}` over a
/// byte), other dtypes as little-endian numbers, so a D4RL file imported
/// into columns of its own dtypes and exported again has datasets equal
/// to the original's: names, dtypes, shapes and bytes. The file is
/// written under a temporary name, fsynced and renamed into place; a
/// `path` that exists and is not a regular file (a device such as
/// `/dev/null`, a directory, a FIFO, a socket, a symbolic link) is
/// refused before the table is read. Each dataset
/// is gathered whole in memory first (hdf5-pure writes a file from the
/// data it holds).
pub fn export(table: &ReplayTable, path: &Path, options: &ExportOptions) -> Result<ExportReport> {
    export::run(table, path, options)
}

/// What a file holds, for making a table that fits it
/// ([`FileInfo::table_spec`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FileInfo {
    /// The file's layout.
    pub layout: Layout,
    /// Datasets with one row per step (D4RL: `N` rows; Minari: those of the
    /// first episode with `T` or `T + 1` rows).
    pub datasets: Vec<DatasetInfo>,
    /// Episodes.
    pub episodes: u64,
    /// Steps in all.
    pub steps: u64,
    /// Steps of the longest episode.
    pub longest_episode: u64,
    /// Episode lengths in order (for capacity planning).
    pub episode_lengths: Vec<u64>,
}

impl FileInfo {
    /// A spec with one column per step dataset, named as the dataset
    /// (Minari: plus `next_observations`, which keeps each episode's final
    /// observation). `max_len` defaults to the longest episode, `capacity`
    /// to the number of trajectories the episodes make at that `max_len`.
    /// Datasets of a dtype no column can hold (u64) are left out.
    pub fn table_spec(&self, max_len: Option<u64>, capacity: Option<u64>) -> Result<TableSpec> {
        let t = max_len.unwrap_or(self.longest_episode).max(1);
        let needed: u64 = self.episode_lengths.iter().map(|&l| l.div_ceil(t)).sum();
        let mut columns = Vec::new();
        for d in &self.datasets {
            if let Some(dtype) = d.element.column_dtype() {
                columns.push(ColumnSpec::new(d.name.clone(), dtype, d.step_shape.clone()));
                if self.layout == Layout::Minari && d.name == "observations" {
                    columns.push(ColumnSpec::new("next_observations", dtype, d.step_shape.clone()));
                }
            }
        }
        TableSpec::new(columns, t, capacity.unwrap_or(needed).max(1))
            .map_err(|e| Error::Options(format!("cannot make a table spec for the file: {e}")))
    }
}

/// Describes the HDF5 file at `path`: its layout (found when `None`), its
/// step datasets and its episodes.
pub fn describe(path: &Path, layout: Option<Layout>) -> Result<FileInfo> {
    export::describe(path, layout)
}
