//! Reading a dataset file: opening it, telling its layout, listing its
//! datasets, and cutting its rows into episodes.
//!
//! Groups are reached through handles opened once, never by paths from
//! the root: hdf5-pure looks a path up component by component, and a
//! lookup in a group of N members may walk all N, so opening a dataset of
//! each of N Minari episodes by its full path cost O(N^2) (97% of a
//! 1000-episode import). Datasets stored as one run of bytes (contiguous,
//! the h5py default) are read with `pread` straight into the caller's
//! buffer; chunked ones through hdf5-pure, which decompresses them.

use crate::error::{Error, Result};
use crate::types::{is_set, source_type, swap_bytes, SourceType};
use crate::Layout;
use hdf5_pure::{Dataset, File, Group};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One dataset of a file as an import sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetInfo {
    /// Its path: from the root (D4RL), or from its episode group (Minari).
    pub name: String,
    /// Its element type.
    pub element: crate::Element,
    /// Rows (the first dimension): steps (D4RL), or steps of the first
    /// episode (Minari).
    pub rows: u64,
    /// The shape of one row (the dimensions after the first).
    pub step_shape: Vec<u64>,
}

/// A Minari episode group.
pub(crate) struct Episode {
    /// Its group's name (`episode_<id>`).
    pub name: String,
    /// Its group, opened once.
    pub group: Group,
}

/// An open file and what every reader of it needs.
pub(crate) struct Source {
    pub path: PathBuf,
    pub file: File,
    /// The same file opened plainly, for reads of contiguous datasets.
    raw: std::fs::File,
    /// Its length when it was opened.
    len: u64,
    pub layout: Layout,
    /// Minari: the episode groups, in id order.
    pub episodes: Vec<Episode>,
}

/// A dataset opened for reading, with its checked type and shape.
pub(crate) struct Opened {
    pub ds: Dataset,
    pub name: String,
    pub ty: SourceType,
    pub rows: u64,
    pub step_shape: Vec<u64>,
    /// The file offset of row 0 when the dataset is stored as one run of
    /// bytes (checked to lie inside the file when opened); `None` when
    /// hdf5-pure reads it (chunked, compact, unallocated, external).
    pub contiguous: Option<u64>,
}

impl Opened {
    /// Bytes of one row as stored.
    pub fn row_bytes(&self) -> usize {
        self.step_shape.iter().product::<u64>() as usize * self.ty.element.size()
    }

    /// Whether reading the rows can show something the metadata cannot:
    /// a chunk that does not decompress or fails its checksum, a bool that
    /// is not 0 or 1. A contiguous dataset of numbers (any bytes are
    /// values) checked to lie inside the file cannot.
    pub fn worth_verifying(&self) -> bool {
        self.contiguous.is_none() || self.ty.element == crate::Element::Gear(gear_core::DType::Bool)
    }
}

impl Source {
    /// Opens `path` (streaming: metadata and chunks are read on demand, the
    /// file is never held whole) and finds its layout.
    pub fn open(path: &Path, layout: Option<Layout>) -> Result<Source> {
        let err = |problem: String| Error::File { path: path.to_owned(), problem };
        // A FIFO would block the open, a device would be read without end.
        gear_api::table::checkpoint::files::check_readable(path).map_err(|e| err(e.to_string()))?;
        let raw = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
        let len = raw.metadata().map_err(|e| err(format!("cannot read its size: {e}")))?.len();
        match hdf5_pure::is_hdf5(path) {
            Ok(true) => {}
            Ok(false) => return Err(err("not an HDF5 file (no HDF5 signature)".into())),
            Err(e) => return Err(err(format!("cannot read: {e}"))),
        }
        let file = File::open_streaming(path).map_err(|e| err(format!("cannot read as HDF5: {e}")))?;
        let root = file.root();
        let datasets = root.datasets().map_err(|e| err(format!("cannot list the root group: {e}")))?;
        let groups = root.iter_groups().map_err(|e| err(format!("cannot list the root group: {e}")))?;
        let mut episodes = Vec::new();
        for (name, group) in groups {
            if let Some(id) = name.strip_prefix("episode_") {
                let id = id.parse::<u64>().map_err(|_| err(format!("group `{name}`: episode id is not a number")))?;
                episodes.push((id, Episode { name, group }));
            }
        }
        episodes.sort_unstable_by_key(|(id, _)| *id);
        let episodes: Vec<Episode> = episodes.into_iter().map(|(_, e)| e).collect();
        let d4rl = datasets.iter().any(|d| d == "observations");
        let found = match layout {
            Some(l) => l,
            None if d4rl => Layout::D4rl,
            None if !episodes.is_empty() => Layout::Minari,
            None => {
                return Err(err(
                    "neither D4RL (no top-level dataset `observations`) nor Minari (no `episode_<id>` groups)".into(),
                ))
            }
        };
        match found {
            Layout::D4rl if !d4rl => {
                return Err(err("not the D4RL layout: no top-level dataset `observations`".into()))
            }
            Layout::Minari if episodes.is_empty() => {
                return Err(err("not the Minari layout: no `episode_<id>` groups".into()))
            }
            _ => {}
        }
        Ok(Source { path: path.to_owned(), file, raw, len, layout: found, episodes })
    }

    /// An error about dataset `name`.
    pub fn ds_err(&self, name: &str, problem: impl Into<String>) -> Error {
        Error::Dataset { path: self.path.clone(), dataset: name.to_owned(), problem: problem.into() }
    }

    /// An error about the file and the table.
    pub fn mismatch(&self, problem: impl Into<String>) -> Error {
        Error::Mismatch { path: self.path.clone(), problem: problem.into() }
    }

    /// The path of `name` below `episode`'s group (from the root when
    /// `None`), as messages show it.
    pub fn shown(&self, episode: Option<usize>, name: &str) -> String {
        match episode {
            Some(e) => format!("{}/{name}", self.episodes[e].name),
            None => name.to_owned(),
        }
    }

    /// Opens dataset `name` (a path below `episode`'s group, or from the
    /// root) and checks that gear can read its type and that it has rows.
    pub fn dataset(&self, episode: Option<usize>, name: &str) -> Result<Opened> {
        let full = self.shown(episode, name);
        let ds = match episode {
            Some(e) => self.episodes[e].group.dataset(name),
            None => self.file.dataset(name),
        }
        .map_err(|e| self.ds_err(&full, format!("cannot open: {e}")))?;
        let dt = ds.datatype().map_err(|e| self.ds_err(&full, format!("cannot read its type: {e}")))?;
        let ty = source_type(&dt).map_err(|p| self.ds_err(&full, p))?;
        let shape = ds.shape().map_err(|e| self.ds_err(&full, format!("cannot read its shape: {e}")))?;
        let Some((&rows, step_shape)) = shape.split_first() else {
            return Err(self.ds_err(&full, "is a scalar; a dataset of steps has one row per step"));
        };
        let mut opened = Opened { ds, name: full, ty, rows, step_shape: step_shape.to_vec(), contiguous: None };
        if let Ok(hdf5_pure::Layout::Contiguous { address: Some(at), size }) = opened.ds.layout() {
            // Read through hdf5-pure unless the run holds exactly the rows.
            if (rows as u128) * (opened.row_bytes() as u128) == u128::from(size) {
                let end = at.saturating_add(size);
                if end > self.len {
                    return Err(self.ds_err(
                        &opened.name,
                        format!(
                            "truncated: its {size} bytes run to byte {end}, the file has {} (the file was cut short)",
                            self.len
                        ),
                    ));
                }
                opened.contiguous = Some(at);
            }
        }
        Ok(opened)
    }

    /// Dataset paths below `episode`'s group (the root when `None`),
    /// depth first.
    pub fn list(&self, episode: Option<usize>) -> Result<Vec<String>> {
        let g = match episode {
            Some(e) => self.episodes[e].group.clone(),
            None => self.file.root(),
        };
        let mut out = Vec::new();
        self.walk(&g, "", episode.is_none(), &mut out)?;
        Ok(out)
    }

    fn walk(&self, g: &Group, prefix: &str, root: bool, out: &mut Vec<String>) -> Result<()> {
        let e = |e: hdf5_pure::Error| {
            self.ds_err(if prefix.is_empty() { "/" } else { prefix }, format!("cannot list: {e}"))
        };
        for d in g.datasets().map_err(e)? {
            out.push(format!("{prefix}{d}"));
        }
        for (name, sub) in g.iter_groups().map_err(e)? {
            // Minari's episode groups are not datasets of the root.
            if root && prefix.is_empty() && name.starts_with("episode_") && self.layout == Layout::Minari {
                continue;
            }
            self.walk(&sub, &format!("{prefix}{name}/"), false, out)?;
        }
        Ok(())
    }

    /// Reads rows `start..start + count` of `d` into `out` (resized to
    /// them), little-endian, checked to be whole rows.
    pub fn read_rows_into(&self, d: &Opened, start: u64, count: u64, out: &mut Vec<u8>) -> Result<()> {
        let rows_err = |problem: String| self.ds_err(&d.name, format!("rows {start}..{}: {problem}", start + count));
        let expected = count as usize * d.row_bytes();
        match d.contiguous {
            Some(at) if start.saturating_add(count) <= d.rows => {
                // Grown (zeroed) only past what earlier windows left: the
                // read overwrites every byte.
                if out.len() < expected {
                    out.resize(expected, 0);
                }
                out.truncate(expected);
                let offset = at + start * d.row_bytes() as u64;
                self.raw
                    .read_exact_at(out, offset)
                    .map_err(|e| rows_err(format!("cannot read {expected} bytes at byte {offset} of the file: {e}")))?;
            }
            _ => {
                *out = d.ds.read_raw_rows(start, count).map_err(|e| rows_err(format!("cannot read: {e}")))?;
                if out.len() != expected {
                    return Err(rows_err(format!("read {} bytes, expected {expected}", out.len())));
                }
            }
        }
        if d.ty.big_endian {
            swap_bytes(out, d.ty.element.size());
        }
        Ok(())
    }

    /// The rows of `d` whose value is nonzero, read `window` rows at a time.
    pub fn set_rows(&self, d: &Opened, window: u64) -> Result<Vec<u64>> {
        if d.row_bytes() != d.ty.element.size() {
            return Err(
                self.ds_err(&d.name, format!("has shape {:?} per row; a flag has one value per row", d.step_shape))
            );
        }
        let mut out = Vec::new();
        let mut bytes = Vec::new();
        let mut start = 0;
        while start < d.rows {
            let n = window.min(d.rows - start);
            self.read_rows_into(d, start, n, &mut bytes)?;
            if d.ty.element.size() == 1 {
                // Bools and bytes, nearly all zero: skip zero blocks with an
                // OR the compiler vectorises.
                for (b, block) in bytes.chunks(64).enumerate() {
                    if block.iter().fold(0u8, |acc, &v| acc | v) != 0 {
                        let first = start + (b * 64) as u64;
                        out.extend(block.iter().enumerate().filter(|(_, &v)| v != 0).map(|(i, _)| first + i as u64));
                    }
                }
            } else {
                for (i, e) in bytes.chunks_exact(d.ty.element.size()).enumerate() {
                    if is_set(e, d.ty.element) {
                        out.push(start + i as u64);
                    }
                }
            }
            start += n;
        }
        Ok(out)
    }
}

/// Episodes of a D4RL file: `(first row, steps)`, cut after every row that
/// is a terminal or a timeout; the rows after the last such row are one
/// more (partial) episode.
pub(crate) fn d4rl_episodes(rows: u64, ends: &[u64]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut start = 0;
    for &e in ends {
        if e >= start && e < rows {
            out.push((start, e + 1 - start));
            start = e + 1;
        }
    }
    if start < rows {
        out.push((start, rows - start));
    }
    out
}

/// One trajectory of an import: `(episode index, first row, steps)`.
pub(crate) type Chunk = (usize, u64, u64);

/// Cuts episodes into trajectories of at most `max_len` steps.
pub(crate) fn chunks(episodes: &[(u64, u64)], max_len: u64) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (i, &(start, len)) in episodes.iter().enumerate() {
        let mut done = 0;
        while done < len {
            let n = max_len.min(len - done);
            out.push((i, start + done, n));
            done += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_end_after_flags_and_keep_the_tail() {
        assert_eq!(d4rl_episodes(10, &[2, 3, 7]), vec![(0, 3), (3, 1), (4, 4), (8, 2)]);
        assert_eq!(d4rl_episodes(4, &[3]), vec![(0, 4)]);
        assert_eq!(d4rl_episodes(3, &[]), vec![(0, 3)]);
        assert_eq!(chunks(&[(0, 5), (5, 2)], 2), vec![(0, 0, 2), (0, 2, 2), (0, 4, 1), (1, 5, 2)]);
    }
}
