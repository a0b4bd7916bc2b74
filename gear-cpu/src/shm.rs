//! Shared memory that other processes attach to by name: a file in
//! `/dev/shm` (or a directory the user names) mapped with `MAP_SHARED`.
//!
//! Life cycle: [`ShmPool::create`] makes the file with `O_EXCL`, reserves
//! every byte with `posix_fallocate` (so a too-small `/dev/shm` fails here,
//! with the byte count, instead of a SIGBUS on some later store) and maps
//! it. [`ShmPool::open`] maps an existing file at its current size.
//!
//! Who unlinks: the creator removes the name when it is dropped, unless it
//! was created with [`ShmOptions::keep`] or [`ShmPool::persist`] was called;
//! attachers never remove it. Mappings outlive the name, so attached
//! processes keep working after the creator is gone; only new attaches fail.
//! [`ShmPool::unlink`] removes a name explicitly (a kept pool, or one left
//! by a crashed creator).

use crate::error::{Error, Result};
use crate::raw;
use gear_core::{MemoryKind, MemoryRegion};
use memmap2::{MmapOptions, MmapRaw};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where pools live unless a directory is named.
pub const DEFAULT_SHM_DIR: &str = "/dev/shm";
/// Longest accepted pool name, in bytes (the usual `NAME_MAX`).
pub const MAX_SHM_NAME_BYTES: usize = 255;
/// Alignment of a pool's first byte: mappings start on a page.
pub const SHM_POOL_ALIGN: u64 = 4096;

/// How [`ShmPool::create`] makes a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmOptions {
    /// Directory holding the pool's file; `None` is [`DEFAULT_SHM_DIR`].
    /// A directory on a disk file system gives a file-backed table that
    /// outlives a reboot when kept.
    pub dir: Option<PathBuf>,
    /// Keep the name when the creator is dropped (see the module doc).
    pub keep: bool,
    /// Permission bits of the new file (before the umask); default `0o600`,
    /// so only processes of the same user can attach.
    pub mode: u32,
    /// Map every page up front (`MAP_POPULATE`), default `true`. A replay
    /// table is written everywhere sooner or later; populating it in one
    /// call avoids a page fault per 4 KiB page on the copy paths (measured
    /// here: a 1 GB table written by a freshly attached process spent 0.6 s
    /// of 0.7 s in 262k minor faults). Turn off for huge tables a process
    /// only touches a little of.
    pub populate: bool,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions { dir: None, keep: false, mode: 0o600, populate: true }
    }
}

impl ShmOptions {
    /// The default options: `/dev/shm`, removed on drop, mode `0o600`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates the pool in `dir` instead of `/dev/shm`.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Whether the name outlives the creator.
    pub fn keep(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// Permission bits of the new file.
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }

    /// Whether to map every page up front (see [`ShmOptions::populate`]).
    pub fn populate(mut self, populate: bool) -> Self {
        self.populate = populate;
        self
    }
}

fn map_options(len: usize, populate: bool) -> MmapOptions {
    let mut o = MmapOptions::new();
    o.len(len);
    if populate {
        o.populate();
    }
    o
}

/// Checks a pool name: 1 to [`MAX_SHM_NAME_BYTES`] bytes of
/// `[A-Za-z0-9._-]`, not `.` and without `..`, so it always names a file
/// directly inside the pool directory.
pub fn validate_name(name: &str) -> Result<()> {
    let bad = |reason| Error::InvalidName { name: name.escape_debug().to_string(), reason };
    if name.is_empty() {
        return Err(bad("the name is empty"));
    }
    if name.len() > MAX_SHM_NAME_BYTES {
        return Err(bad("the name is longer than 255 bytes"));
    }
    if name.contains('/') {
        return Err(bad("the name contains `/`; give the directory in the options instead"));
    }
    if name == "." || name.contains("..") {
        return Err(bad("the name is `.` or contains `..`"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err(bad("only ASCII letters, digits, `.`, `_` and `-` are allowed"));
    }
    Ok(())
}

fn dir_or_default(dir: Option<&Path>) -> PathBuf {
    dir.map_or_else(|| PathBuf::from(DEFAULT_SHM_DIR), Path::to_path_buf)
}

/// A named shared-memory mapping (see the module doc for its life cycle).
pub struct ShmPool {
    map: MmapRaw,
    /// The open backing file: its size is checked against the mapping, and
    /// process leases lock bytes of it.
    file: File,
    name: String,
    dir: PathBuf,
    /// `(device, inode)` of the file this value created; `None` for
    /// attachers. Drop unlinks the name only while it still names this
    /// very file, so a name reused by someone else is left alone.
    created: Option<(u64, u64)>,
    /// Whether drop removes the name; only ever true for creators.
    unlink_on_drop: AtomicBool,
}

impl ShmPool {
    /// Creates a new pool of `bytes` zeroed bytes named `name`. Fails if the
    /// name is invalid or already exists, or if the directory's file system
    /// cannot hold `bytes` (the partial file is removed).
    pub fn create(name: &str, bytes: u64, opts: ShmOptions) -> Result<Self> {
        validate_name(name)?;
        if bytes == 0 {
            return Err(Error::ZeroSize);
        }
        let dir = dir_or_default(opts.dir.as_deref());
        let path = dir.join(name);
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(opts.mode).open(&path).map_err(
            |e| match e.kind() {
                ErrorKind::AlreadyExists => Error::Exists { name: name.to_owned(), dir: dir.clone() },
                _ => Error::io("create", &path, e),
            },
        )?;
        // From here on, every failure removes the file we just made.
        let built = Self::size_and_map(&file, &path, name, &dir, bytes, opts.populate);
        match built {
            Ok(map) => {
                let meta = file.metadata().map_err(|e| Error::io("stat", &path, e));
                let meta = match meta {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = std::fs::remove_file(&path);
                        return Err(e);
                    }
                };
                Ok(ShmPool {
                    map,
                    file,
                    name: name.to_owned(),
                    dir,
                    created: Some((meta.dev(), meta.ino())),
                    unlink_on_drop: AtomicBool::new(!opts.keep),
                })
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    fn size_and_map(file: &File, path: &Path, name: &str, dir: &Path, bytes: u64, populate: bool) -> Result<MmapRaw> {
        let no_space =
            |available| Error::NoSpace { name: name.to_owned(), dir: dir.to_path_buf(), needed: bytes, available };
        let free = raw::free_bytes(file).map_err(|e| Error::io("query free space of", dir, e))?;
        // Checked up front so that an absurd size is refused before the
        // file system starts zeroing pages it will not have in the end.
        if free.is_some_and(|f| f < bytes) {
            return Err(no_space(free));
        }
        let len = usize::try_from(bytes).map_err(|_| no_space(free))?;
        raw::fallocate(file, bytes).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EFBIG) => no_space(free),
            _ => Error::io("reserve space for", path, e),
        })?;
        map_options(len, populate).map_raw(file).map_err(|e| Error::io("map", path, e))
    }

    /// Attaches to the pool `name` in `dir` (default `/dev/shm`), mapping
    /// the whole file at its current size, every page up front. Attachers
    /// never unlink.
    pub fn open(name: &str, dir: Option<&Path>) -> Result<Self> {
        Self::open_with(name, dir, true)
    }

    /// [`ShmPool::open`], choosing whether to map every page up front (see
    /// [`ShmOptions::populate`]).
    pub fn open_with(name: &str, dir: Option<&Path>, populate: bool) -> Result<Self> {
        validate_name(name)?;
        let dir = dir_or_default(dir);
        let path = dir.join(name);
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => Error::NotFound { name: name.to_owned(), dir: dir.clone() },
            _ => Error::io("open", &path, e),
        })?;
        let meta = file.metadata().map_err(|e| Error::io("stat", &path, e))?;
        if !meta.is_file() {
            return Err(Error::io("map", &path, std::io::Error::other("not a regular file")));
        }
        if meta.len() == 0 {
            return Err(Error::Empty { name: name.to_owned(), dir });
        }
        let len = usize::try_from(meta.len()).map_err(|_| {
            Error::io("map", &path, std::io::Error::other(format!("{} bytes do not fit the address space", meta.len())))
        })?;
        let map = map_options(len, populate).map_raw(&file).map_err(|e| Error::io("map", &path, e))?;
        Ok(ShmPool { map, file, name: name.to_owned(), dir, created: None, unlink_on_drop: AtomicBool::new(false) })
    }

    /// A new descriptor of the backing file (sharing its open file
    /// description), for process leases and size checks.
    pub fn file(&self) -> Result<File> {
        self.file.try_clone().map_err(|e| Error::io("duplicate the descriptor of", self.path(), e))
    }

    /// Removes the name `name` from `dir` (default `/dev/shm`). Existing
    /// mappings stay valid; a missing name is [`Error::NotFound`].
    pub fn unlink(name: &str, dir: Option<&Path>) -> Result<()> {
        validate_name(name)?;
        let dir = dir_or_default(dir);
        let path = dir.join(name);
        std::fs::remove_file(&path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => Error::NotFound { name: name.to_owned(), dir },
            _ => Error::io("unlink", &path, e),
        })
    }

    /// Keeps the name after this creator is dropped (no effect on
    /// attachers, which never unlink).
    pub fn persist(&self) {
        self.unlink_on_drop.store(false, Ordering::Relaxed);
    }

    /// Whether this value created the pool (rather than attached to it).
    pub fn is_creator(&self) -> bool {
        self.created.is_some()
    }

    /// Whether dropping this value removes the name.
    pub fn unlinks_on_drop(&self) -> bool {
        self.created.is_some() && self.unlink_on_drop.load(Ordering::Relaxed)
    }

    /// The directory holding the pool's file.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The full path of the pool's file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

impl Drop for ShmPool {
    fn drop(&mut self) {
        let Some(id) = self.created else { return };
        if !self.unlink_on_drop.load(Ordering::Relaxed) {
            return;
        }
        let path = self.path();
        // Only our own file: someone may have unlinked ours and created a
        // new pool under the same name meanwhile.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| (m.dev(), m.ino()) == id) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

impl std::fmt::Debug for ShmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPool")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("len", &self.map.len())
            .field("creator", &self.is_creator())
            .field("unlinks_on_drop", &self.unlinks_on_drop())
            .finish()
    }
}

// SAFETY: `map` is a read-write `MAP_SHARED` mapping of `len()` bytes that
// lives as long as `self` and starts on a page (mmap returns page-aligned
// addresses, and pages are at least `SHM_POOL_ALIGN` bytes on the targets
// we build for). Other processes may change the bytes at any time, as the
// trait allows. The file was sized before mapping (reserved with
// `posix_fallocate` by creators); a third party truncating it afterwards
// would break the mapping, which no safe mapping API can prevent.
unsafe impl MemoryRegion for ShmPool {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Shared
    }
    fn len(&self) -> u64 {
        self.map.len() as u64
    }
    fn alignment(&self) -> u64 {
        SHM_POOL_ALIGN
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        NonNull::new(self.map.as_mut_ptr())
    }
    fn name(&self) -> Option<&str> {
        Some(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["a", "gear.table-1_x", "A9", &"n".repeat(255)] {
            validate_name(ok).unwrap();
        }
        for (bad, why) in [
            ("", "empty"),
            ("a/b", "`/`"),
            ("..", "`..`"),
            ("x..y", "`..`"),
            (".", "`.`"),
            ("sp ace", "only ASCII"),
            ("é", "only ASCII"),
            (&"n".repeat(256), "longer"),
        ] {
            let msg = validate_name(bad).unwrap_err().to_string();
            assert!(msg.contains(why), "{bad:?}: {msg}");
            assert!(msg.contains("invalid shared memory name"), "{msg}");
        }
        assert!(validate_name("a/b").unwrap_err().to_string().contains("`a/b`"));
    }

    #[test]
    fn no_space_message_names_bytes_and_directory() {
        let e = Error::NoSpace { name: "t".into(), dir: "/dev/shm".into(), needed: 1 << 40, available: Some(4096) };
        let m = e.to_string();
        assert!(m.contains("/dev/shm is too small"), "{m}");
        assert!(m.contains(&(1u64 << 40).to_string()) && m.contains("4096"), "{m}");
    }
}
