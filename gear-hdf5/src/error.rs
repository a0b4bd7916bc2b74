//! The one error type of gear-hdf5: what was wrong, and where (file,
//! dataset, row).

use std::path::PathBuf;

/// Result alias for gear-hdf5.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything an import or an export can refuse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or read as HDF5 (missing, not HDF5,
    /// truncated, corrupt).
    #[error("{}: {problem}", .path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// A dataset could not be read, or does not fit what the layout needs.
    #[error("{}: dataset `{dataset}`: {problem}", .path.display())]
    Dataset {
        /// The file.
        path: PathBuf,
        /// The dataset's path in the file.
        dataset: String,
        /// What went wrong.
        problem: String,
    },
    /// A value that cannot go into the table (a bool byte that is not 0 or
    /// 1, for example).
    #[error("{}: dataset `{dataset}`, row {row}: {problem}", .path.display())]
    Row {
        /// The file.
        path: PathBuf,
        /// The dataset's path in the file.
        dataset: String,
        /// The row (step) of the dataset.
        row: u64,
        /// What went wrong.
        problem: String,
    },
    /// The file and the table disagree: a column with no dataset, a dtype
    /// or shape that differs, an episode longer than the table allows, more
    /// trajectories than the table holds.
    #[error("{}: {problem}", .path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What disagrees.
        problem: String,
    },
    /// Options that cannot work (an unknown layout name, a mapping naming
    /// no column).
    #[error("{0}")]
    Options(String),
    /// The table refused an operation (closed, timed out, ...). When it
    /// happens during an import, `inserted` trajectories of the file are
    /// already in the table.
    #[error("table: {source} ({inserted} trajectories of the file were inserted before)")]
    Table {
        /// The table's error.
        source: gear_api::Error,
        /// Trajectories of this import committed before the error.
        inserted: u64,
    },
    /// Writing the output file failed.
    #[error("{}: cannot write: {problem}", .path.display())]
    Write {
        /// The output file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
}

impl Error {
    /// A table error outside an import.
    pub(crate) fn table(source: gear_api::Error) -> Self {
        Error::Table { source, inserted: 0 }
    }
}
