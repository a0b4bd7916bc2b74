//! Reading a dataset file: opening it, telling its layout, listing its
//! datasets, and cutting its rows into episodes.

use crate::error::{Error, Result};
use crate::types::{is_set, source_type, swap_bytes, SourceType};
use crate::Layout;
use hdf5_pure::{Dataset, File, Group};
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

/// An open file and what every reader of it needs.
pub(crate) struct Source {
    pub path: PathBuf,
    pub file: File,
    pub layout: Layout,
    /// Minari: the episode groups, in id order.
    pub episodes: Vec<(u64, String)>,
}

/// A dataset opened for reading, with its checked type and shape.
pub(crate) struct Opened {
    pub ds: Dataset,
    pub name: String,
    pub ty: SourceType,
    pub rows: u64,
    pub step_shape: Vec<u64>,
}

impl Opened {
    /// Bytes of one row as stored.
    pub fn row_bytes(&self) -> usize {
        self.step_shape.iter().product::<u64>() as usize * self.ty.element.size()
    }
}

impl Source {
    /// Opens `path` (streaming: metadata and chunks are read on demand, the
    /// file is never held whole) and finds its layout.
    pub fn open(path: &Path, layout: Option<Layout>) -> Result<Source> {
        let err = |problem: String| Error::File { path: path.to_owned(), problem };
        match std::fs::metadata(path) {
            Err(e) => return Err(err(format!("cannot open: {e}"))),
            Ok(m) if m.is_dir() => return Err(err("is a directory, not an HDF5 file".into())),
            Ok(_) => {}
        }
        match hdf5_pure::is_hdf5(path) {
            Ok(true) => {}
            Ok(false) => return Err(err("not an HDF5 file (no HDF5 signature)".into())),
            Err(e) => return Err(err(format!("cannot read: {e}"))),
        }
        let file = File::open_streaming(path).map_err(|e| err(format!("cannot read as HDF5: {e}")))?;
        let root = file.root();
        let datasets = root.datasets().map_err(|e| err(format!("cannot list the root group: {e}")))?;
        let groups = root.groups().map_err(|e| err(format!("cannot list the root group: {e}")))?;
        let mut episodes = Vec::new();
        for g in &groups {
            if let Some(id) = g.strip_prefix("episode_") {
                let id = id.parse::<u64>().map_err(|_| err(format!("group `{g}`: episode id is not a number")))?;
                episodes.push((id, g.clone()));
            }
        }
        episodes.sort_unstable();
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
        Ok(Source { path: path.to_owned(), file, layout: found, episodes })
    }

    /// An error about dataset `name`.
    pub fn ds_err(&self, name: &str, problem: impl Into<String>) -> Error {
        Error::Dataset { path: self.path.clone(), dataset: name.to_owned(), problem: problem.into() }
    }

    /// An error about the file and the table.
    pub fn mismatch(&self, problem: impl Into<String>) -> Error {
        Error::Mismatch { path: self.path.clone(), problem: problem.into() }
    }

    /// Opens dataset `name` (a path below `group`, or from the root) and
    /// checks that gear can read its type and that it has rows.
    pub fn dataset(&self, group: Option<&str>, name: &str) -> Result<Opened> {
        let full = match group {
            Some(g) => format!("{g}/{name}"),
            None => name.to_owned(),
        };
        let ds = self.file.dataset(&full).map_err(|e| self.ds_err(&full, format!("cannot open: {e}")))?;
        let dt = ds.datatype().map_err(|e| self.ds_err(&full, format!("cannot read its type: {e}")))?;
        let ty = source_type(&dt).map_err(|p| self.ds_err(&full, p))?;
        let shape = ds.shape().map_err(|e| self.ds_err(&full, format!("cannot read its shape: {e}")))?;
        let Some((&rows, step_shape)) = shape.split_first() else {
            return Err(self.ds_err(&full, "is a scalar; a dataset of steps has one row per step"));
        };
        Ok(Opened { ds, name: full, ty, rows, step_shape: step_shape.to_vec() })
    }

    /// Dataset paths below `group` (the root when `None`), depth first.
    pub fn list(&self, group: Option<&str>) -> Result<Vec<String>> {
        let g = match group {
            Some(name) => self.file.group(name).map_err(|e| self.ds_err(name, format!("cannot open group: {e}")))?,
            None => self.file.root(),
        };
        let mut out = Vec::new();
        self.walk(&g, "", &mut out)?;
        Ok(out)
    }

    fn walk(&self, g: &Group, prefix: &str, out: &mut Vec<String>) -> Result<()> {
        let e = |e: hdf5_pure::Error| {
            self.ds_err(if prefix.is_empty() { "/" } else { prefix }, format!("cannot list: {e}"))
        };
        for d in g.datasets().map_err(e)? {
            out.push(format!("{prefix}{d}"));
        }
        for (name, sub) in g.iter_groups().map_err(e)? {
            // Minari's episode groups are not datasets of the root.
            if prefix.is_empty() && name.starts_with("episode_") && self.layout == Layout::Minari {
                continue;
            }
            self.walk(&sub, &format!("{prefix}{name}/"), out)?;
        }
        Ok(())
    }

    /// Rows `start..start + count` of `d`, little-endian, checked to be
    /// whole rows.
    pub fn read_rows(&self, d: &Opened, start: u64, count: u64) -> Result<Vec<u8>> {
        let mut bytes =
            d.ds.read_raw_rows(start, count)
                .map_err(|e| self.ds_err(&d.name, format!("cannot read rows {start}..{}: {e}", start + count)))?;
        let expected = count as usize * d.row_bytes();
        if bytes.len() != expected {
            return Err(self.ds_err(
                &d.name,
                format!("rows {start}..{}: read {} bytes, expected {expected}", start + count, bytes.len()),
            ));
        }
        if d.ty.big_endian {
            swap_bytes(&mut bytes, d.ty.element.size());
        }
        Ok(bytes)
    }

    /// The rows of `d` whose value is nonzero, read `window` rows at a time.
    pub fn set_rows(&self, d: &Opened, window: u64) -> Result<Vec<u64>> {
        if d.row_bytes() != d.ty.element.size() {
            return Err(
                self.ds_err(&d.name, format!("has shape {:?} per row; a flag has one value per row", d.step_shape))
            );
        }
        let mut out = Vec::new();
        let mut start = 0;
        while start < d.rows {
            let n = window.min(d.rows - start);
            let bytes = self.read_rows(d, start, n)?;
            for (i, e) in bytes.chunks_exact(d.ty.element.size()).enumerate() {
                if is_set(e, d.ty.element) {
                    out.push(start + i as u64);
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
