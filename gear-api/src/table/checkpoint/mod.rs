//! Checkpoints: a table's committed trajectories and the state of its
//! strategies and rate limiter, written to a file while writers and
//! samplers keep working, and restored into a fresh table by
//! [`TableBuilder::restore`](crate::TableBuilder::restore).
//!
//! # Consistency and pause
//! [`ReplayTable::checkpoint`] holds the table lock only to take a snapshot
//! of the metadata: the committed slots' records (key, length, priority,
//! times sampled, insertion order), the rate limiter's counters and each
//! strategy's exported state ([`gear_core::Selector::export_state`]). That
//! pause reads 64 bytes per slot and copies the strategies' state (8
//! bytes per held key for uniform); it never touches trajectory bytes.
//! The bytes are then copied trajectory by trajectory, oldest insert
//! first (the next to go under a FIFO remover) until one is found evicted
//! (the writers have overtaken the copy), then from the newest backwards,
//! with no lock and with the
//! seqlock check samplers use: a trajectory evicted between the snapshot and its
//! copy is left out and counted in [`CheckpointReport::dropped`] (a
//! restore skips it in the strategies' state too), so what is restored is
//! the table at the snapshot less those evictions. Slots being written or
//! retiring are not part of a checkpoint.
//!
//! # Crash consistency
//! The file is written under a temporary name (`NAME.tmp.PID.N`) in the
//! target's directory, fsynced, renamed over the target and the directory
//! fsynced, so a process killed at any moment leaves either the previous
//! file or the new one, never a partial file under the target's name
//! ([`files::ReplacingFile`]). A target that exists and is not a regular
//! file (a device such as `/dev/null`, a directory, a FIFO, a socket, a
//! symbolic link) is refused before the table is paused.
//! [`ReplayTable::checkpoint_into`] numbers checkpoints in a directory and
//! keeps the last N; [`latest_checkpoint`] finds the newest and never takes
//! a temporary file for one.
//!
//! A writer holds a lock on its temporary file that the kernel drops when
//! the writer dies; the temporary files of dead writers (killed mid-write)
//! are removed by [`remove_stale_temporaries`], which
//! [`ReplayTable::checkpoint_into`] calls before each checkpoint (and
//! [`ReplayTable::checkpoint`] for its own target's name), never touching
//! a live writer's, even one in another process.
//!
//! # Format (version 1)
//! All integers little-endian. A 16-byte preamble: the magic `GEARCKPT`,
//! the format version (u32), 4 reserved bytes. Then chunks, each
//! `tag: u32, len: u64, payload: [u8; len], crc: u32`, where `crc` is the
//! CRC-32 (IEEE) of tag, len and payload:
//!
//! | tag | chunk | payload |
//! | --- | --- | --- |
//! | 1 | header (first) | spec (u32 length, `TableSpec::encode` bytes), seed, Unix time in ms, the counters inserts, samples, evictions, retired, reclaimed, next insert sequence, bytes written (u64 each), trajectories in the snapshot (u64), sampler and remover names (u16 length, UTF-8) |
//! | 2 | data | whole trajectory records, back to back: slot (u32), generation (u32), length `k` (u64), priority (f64), times sampled (u64), insert sequence (u64), then for each column in spec order its `k * step_bytes` bytes (the table's own layout of one slot, cut at `k`) |
//! | 3 | strategy | role (u8: 0 sampler, 1 remover), name (u16 length, UTF-8), the state `export_state` wrote (the rest) |
//! | 4 | end (last) | trajectories written (u64), trajectory bytes written (u64) |
//!
//! Data chunks are cut near 4 MiB. A reader checks every checksum (the
//! restore reads trajectory bytes straight into their slots and drops the
//! table if the chunk's checksum then fails), bounds every length by what
//! the spec allows before reading, and refuses a file without its end
//! chunk (truncated) or with bytes after it.
//!
//! Why not Arrow IPC: a table's trajectories are ragged (each has its own
//! length up to `T`) and restore places each one into a given slot; Arrow
//! would store them as list or tensor columns whose buffers must be
//! re-sliced into the slot layout anyway, and the arrow crates would add
//! some forty dependencies to the library for a format no replay tool
//! reads. This format is the table's own slot layout with a 40-byte
//! record in front of each trajectory, so write and restore are one
//! sequential copy each, and it is simple enough to read from any
//! language (the table above is the whole of it).

pub mod files;
mod format;
mod read;
mod write;

pub use format::{MAGIC, VERSION};

use super::ReplayTable;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What [`ReplayTable::checkpoint`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointReport {
    /// The checkpoint file.
    pub path: PathBuf,
    /// Trajectories written.
    pub trajectories: u64,
    /// Committed trajectories of the snapshot that were evicted (or
    /// overwritten) before their bytes were copied, and so left out.
    pub dropped: u64,
    /// Bytes of trajectory data written (steps of every column).
    pub data_bytes: u64,
    /// Bytes of the file.
    pub file_bytes: u64,
    /// How long the table lock was held for the snapshot of the metadata
    /// (not counting the wait to take it).
    pub pause: Duration,
    /// How long the whole checkpoint took, fsyncs included.
    pub elapsed: Duration,
}

/// Prefix and suffix of the files [`ReplayTable::checkpoint_into`] names
/// `checkpoint-NNNNNNNNNN.gear`.
const DIR_PREFIX: &str = "checkpoint-";
const DIR_SUFFIX: &str = ".gear";

impl ReplayTable {
    /// Writes a checkpoint of the table to `path` (replacing a regular
    /// file there only once the new one is complete and on disk; any other
    /// kind of file there is refused). Writers and samplers keep working
    /// meanwhile; see the [module doc](self) for what is written and for
    /// how long the table is paused. Temporary files of earlier writers of
    /// `path` that died are removed first.
    pub fn checkpoint(&self, path: impl AsRef<Path>) -> Result<CheckpointReport> {
        let path = path.as_ref();
        files::ReplacingFile::remove_stale_of(path).map_err(|e| format::problem(path, e.to_string()))?;
        write::write_checkpoint(self, path)
    }

    /// Writes a checkpoint into directory `dir` (created if missing) under
    /// the next number, then removes the oldest beyond the newest `keep`
    /// (at least 1 is kept). Temporary files of writers that died while
    /// writing into `dir` are removed first ([`remove_stale_temporaries`]).
    pub fn checkpoint_into(&self, dir: impl AsRef<Path>, keep: usize) -> Result<CheckpointReport> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(format::io(dir, "create the directory"))?;
        remove_stale_temporaries(dir)?;
        let numbered = numbered_checkpoints(dir)?;
        let next = numbered.last().map_or(1, |(n, _)| n + 1);
        let report = write::write_checkpoint(self, &dir.join(format!("{DIR_PREFIX}{next:010}{DIR_SUFFIX}")))?;
        let all = numbered_checkpoints(dir)?;
        let excess = all.len().saturating_sub(keep.max(1));
        for (_, old) in &all[..excess] {
            std::fs::remove_file(old).map_err(format::io(old, "remove an old checkpoint"))?;
        }
        Ok(report)
    }
}

/// Removes the temporary files that writers of numbered checkpoints
/// ([`ReplayTable::checkpoint_into`]) left in `dir` when they died
/// mid-write; a temporary file whose writer lives (in any process, even a
/// stopped one) is kept. Returns how many were removed. `gear serve` calls
/// it at startup; `checkpoint_into` before each checkpoint.
pub fn remove_stale_temporaries(dir: impl AsRef<Path>) -> Result<usize> {
    let dir = dir.as_ref();
    files::ReplacingFile::remove_stale(dir, |target| checkpoint_number(target).is_some())
        .map_err(|e| format::problem(dir, e.to_string()))
}

/// The number of a `checkpoint-N.gear` name.
fn checkpoint_number(name: &str) -> Option<u64> {
    name.strip_prefix(DIR_PREFIX)?.strip_suffix(DIR_SUFFIX)?.parse().ok()
}

/// The newest checkpoint [`ReplayTable::checkpoint_into`] wrote in `dir`,
/// if any. Temporary files of a checkpoint being written (or of a process
/// killed while writing one) are never returned.
pub fn latest_checkpoint(dir: impl AsRef<Path>) -> Result<Option<PathBuf>> {
    Ok(numbered_checkpoints(dir.as_ref())?.pop().map(|(_, p)| p))
}

/// `checkpoint-N.gear` files in `dir`, oldest first.
fn numbered_checkpoints(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(format::io(dir, "list the directory"))? {
        let entry = entry.map_err(format::io(dir, "list the directory"))?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().and_then(checkpoint_number) {
            found.push((n, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// The file a restore reads: `path` itself, or the newest checkpoint in it
/// when it is a directory. Anything else than a regular file (once
/// symbolic links are followed) is refused: a FIFO would block the
/// restore, a device would feed it without end.
pub(crate) fn resolve(path: &Path) -> Result<PathBuf> {
    let file = if path.is_dir() {
        latest_checkpoint(path)?.ok_or_else(|| Error::Checkpoint {
            path: path.to_owned(),
            problem: "the directory holds no checkpoint".into(),
        })?
    } else {
        path.to_owned()
    };
    // A missing file is reported by the open, as an I/O error.
    if file.exists() {
        files::check_readable(&file).map_err(|e| format::problem(&file, e.to_string()))?;
    }
    Ok(file)
}

pub(crate) use read::restore_into;
