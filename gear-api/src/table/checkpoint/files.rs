//! Files replaced whole: written under a temporary name next to their
//! target, fsynced and renamed over it, so a process killed at any moment
//! leaves the old file or the new one and never a partial file under the
//! target's name. Checkpoints use it, and so does gear-hdf5's export.
//!
//! # Targets
//! Only a regular file (or a path where nothing exists) is replaced: a
//! rename over a device node, a FIFO or a socket would replace the node
//! every other process uses (`/dev/null`), one over a directory fails late,
//! and one over a symbolic link replaces the link, not the file it points
//! to. Such targets are refused before anything is written, and checked
//! again just before the rename.
//!
//! # Temporary files of dead writers
//! A temporary file is named `TARGET.tmp.PID.N` and its writer holds an
//! exclusive open-file-description lock on it (`F_OFD_SETLK`, the lock
//! gear-cpu's slot leases use) from before it has its name (made unnamed
//! with `O_TMPFILE`, locked, then linked to its name; on file systems
//! without `O_TMPFILE`, from just after creating it) until it is renamed
//! or removed. The kernel drops that lock when the writer closes
//! the file or dies, so a temporary file whose lock can be taken belongs
//! to no live writer: [`ReplacingFile::remove_stale`] removes those, and
//! only those, whatever their process ids say (a container's restarted
//! server has the same pid as its dead predecessor; a live writer in
//! another PID namespace may have any). The remover checks, under the lock
//! it took, that the name still names the file it locked, so it never
//! removes a file that replaced the one it looked at. A writer that finds
//! its fresh file locked by a remover, or already removed, takes the next
//! name: a remover can cost a writer a retry, never its file.
//!
//! Writers from before this scheme (`TARGET.tmp.PID`, no lock) are taken
//! for dead too: a directory is not shared with a writer of an older
//! version while it is being cleaned.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What separates a target's name from the writer's pid and number in a
/// temporary file's name.
pub const TEMPORARY_MARK: &str = ".tmp.";

/// Names tried before giving up on creating a temporary file (each retry
/// follows a remover that took the previous one, or a name in use).
const CREATE_ATTEMPTS: u32 = 64;

/// Numbers this process's temporary files, so two writers of one process
/// never share a name.
static NEXT_TEMPORARY: AtomicU64 = AtomicU64::new(0);

/// A file being written under a temporary name next to `target`, renamed
/// over it by [`ReplacingFile::commit`]. Dropped without a commit, the
/// temporary file is removed. See the [module doc](self).
#[derive(Debug)]
pub struct ReplacingFile {
    /// Holds the lock that marks the temporary file as a live writer's.
    file: File,
    temporary: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl ReplacingFile {
    /// Refuses a target that is not a regular file (see
    /// [`check_replaceable`]), then creates and locks a temporary file next
    /// to it. Errors say what was being done and name the path.
    pub fn create(target: &Path) -> io::Result<ReplacingFile> {
        check_replaceable(target)?;
        let name = target.file_name().ok_or_else(|| refused("names no file"))?;
        // Where the file system allows, the file is made unnamed, locked,
        // and only then given its name, so no remover ever sees it
        // unlocked; elsewhere it is created by name and locked just after.
        let mut unnamed = locked_unnamed_file(directory_of(target));
        for _ in 0..CREATE_ATTEMPTS {
            let n = NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed);
            let mut temporary = name.to_owned();
            temporary.push(format!("{TEMPORARY_MARK}{}.{n}", std::process::id()));
            let temporary = target.with_file_name(temporary);
            if let Some(file) = unnamed.take() {
                match link_unnamed(&file, &temporary) {
                    Ok(()) => {
                        return Ok(ReplacingFile { file, temporary, target: target.to_owned(), committed: false })
                    }
                    // The name is in use: the next one, still unnamed.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        unnamed = Some(file);
                        continue;
                    }
                    // No /proc to link through, or linking refused: by name.
                    Err(_) => {}
                }
            }
            let file = match OpenOptions::new().read(true).write(true).create_new(true).open(&temporary) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(context(e, "create the temporary file", &temporary)),
            };
            // A remover may have opened the file between its creation and
            // this lock: it then holds the lock (and removes the file), or
            // has removed it already. Either way the name is lost.
            if !try_lock(&file).map_err(|e| context(e, "lock the temporary file", &temporary))? {
                continue;
            }
            if names_file(&temporary, &file).map_err(|e| context(e, "inspect the temporary file", &temporary))? {
                return Ok(ReplacingFile { file, temporary, target: target.to_owned(), committed: false });
            }
        }
        Err(io::Error::other(format!(
            "cannot create a temporary file next to `{}`: {CREATE_ATTEMPTS} names were taken or removed while \
             being created",
            target.display()
        )))
    }

    /// The temporary file's path.
    pub fn path(&self) -> &Path {
        &self.temporary
    }

    /// The temporary file, open for reading and writing.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Fsyncs the temporary file, checks the target again, renames the
    /// file over it and fsyncs the directory (so the rename is durable).
    pub fn commit(mut self) -> io::Result<()> {
        self.file.sync_all().map_err(|e| context(e, "fsync", &self.temporary))?;
        check_replaceable(&self.target)?;
        std::fs::rename(&self.temporary, &self.target)
            .map_err(|e| context(e, "rename the finished file onto", &self.target))?;
        self.committed = true;
        let dir = directory_of(&self.target);
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| context(e, "fsync the directory", dir))
    }

    /// Removes the temporary files of `target` that no live writer holds
    /// (see [`ReplacingFile::remove_stale`]); none when its directory does
    /// not exist. Returns how many were removed.
    pub fn remove_stale_of(target: &Path) -> io::Result<usize> {
        let Some(name) = target.file_name().and_then(|n| n.to_str()) else { return Ok(0) };
        let dir = directory_of(target);
        if !dir.is_dir() {
            return Ok(0);
        }
        ReplacingFile::remove_stale(dir, |t| t == name)
    }

    /// Removes the temporary files in `dir` that no live writer holds,
    /// among those of targets whose names `is_target` accepts. Returns how
    /// many were removed. Files being written (their lock held, even by a
    /// stopped process), files of other shapes and files this process may
    /// not open for writing are left alone.
    pub fn remove_stale(dir: &Path, is_target: impl Fn(&str) -> bool) -> io::Result<usize> {
        let entries = std::fs::read_dir(dir).map_err(|e| context(e, "list the directory", dir))?;
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| context(e, "list the directory", dir))?;
            let name = entry.file_name();
            let Some(target) = name.to_str().and_then(temporary_target) else { continue };
            if !is_target(target) {
                continue;
            }
            let path = entry.path();
            if remove_if_stale(&path).map_err(|e| context(e, "remove the stale temporary file", &path))? {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

impl Drop for ReplacingFile {
    fn drop(&mut self) {
        if !self.committed {
            // Still locked by `self.file`: no remover has touched it.
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

/// The target name of a temporary file's name (`TARGET.tmp.PID.N`, or
/// `TARGET.tmp.PID` of writers before the lock), or `None` when `name` is
/// not one.
pub fn temporary_target(name: &str) -> Option<&str> {
    let (target, suffix) = name.rsplit_once(TEMPORARY_MARK)?;
    let mut parts = suffix.split('.');
    let numbers = parts.by_ref().take(2).all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    (numbers && parts.next().is_none() && !target.is_empty()).then_some(target)
}

/// Refuses a path that exists and is not a regular file: a directory, a
/// device node (`/dev/null`), a FIFO, a socket, or a symbolic link (a
/// rename replaces the link, not what it points to). A path where nothing
/// exists is fine.
pub fn check_replaceable(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(context(e, "inspect", path)),
        Ok(m) if m.file_type().is_file() => Ok(()),
        Ok(m) if m.file_type().is_symlink() => {
            let to = std::fs::read_link(path).map_or_else(|_| "?".into(), |p| p.display().to_string());
            Err(refused(&format!(
                "is a symbolic link (to `{to}`), and replacing it would replace the link, not the file it \
                 points to; name that file itself"
            )))
        }
        Ok(m) => Err(refused(&format!(
            "is {}, not a regular file; only a regular file is replaced (name a new file to write one)",
            kind_of(&m.file_type())
        ))),
    }
}

/// Refuses a path to read a whole file from that is not a regular file
/// once symbolic links are followed (a FIFO would block the reader, a
/// device would never end), or that does not exist.
pub fn check_readable(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path) {
        Err(e) => Err(context(e, "open", path)),
        Ok(m) if m.file_type().is_file() => Ok(()),
        Ok(m) => Err(refused(&format!("is {}, not a regular file", kind_of(&m.file_type())))),
    }
}

/// "a directory", "a character device", ... for messages.
fn kind_of(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a file"
    }
}

/// Removes `path` when no live writer holds its lock and the name still
/// names the file whose lock was taken. Returns whether it was removed.
fn remove_if_stale(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    // Read-write: a write lock needs a descriptor open for writing. No
    // symlink is followed, and a FIFO swapped in meanwhile cannot block.
    let file =
        match OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path) {
            Ok(f) => f,
            // Gone meanwhile (its writer finished), replaced by a symlink, or
            // not this user's to remove.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.kind() == io::ErrorKind::PermissionDenied
                    || e.raw_os_error() == Some(libc::ELOOP) =>
            {
                return Ok(false)
            }
            Err(e) => return Err(e),
        };
    if !file.metadata()?.file_type().is_file() || !try_lock(&file)? {
        return Ok(false);
    }
    // Locked: its writer is gone. Names are never reused while a file
    // holds them (creation is exclusive), so the name, if still there,
    // names this file or a newer writer's; only the former is removed.
    if !names_file(path, &file)? {
        return Ok(false);
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// An unnamed regular file in `dir` (`O_TMPFILE`), already locked, or
/// `None` where the file system or kernel cannot make one.
fn locked_unnamed_file(dir: &Path) -> Option<File> {
    let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(dir).ok()?;
    // Nobody else can open it yet: the lock is free.
    try_lock(&file).ok()?.then_some(file)
}

/// Gives the unnamed `file` the name `path` (failing with `AlreadyExists`
/// where the name is taken), through its `/proc/self/fd` link, which
/// unlike `AT_EMPTY_PATH` needs no privilege.
fn link_unnamed(file: &File, path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(io::Error::other)?;
    let to = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: both are valid NUL-terminated paths for the call, and the
    // descriptor `from` names is open for its duration (`file` is borrowed).
    let rc =
        unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes the exclusive lock on the whole of `file` if no other open file
/// description holds it; true when taken. Released when `file` is closed,
/// which the kernel does when its process dies.
fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: `flock` is plain data; all-zero is a valid value to start
    // from, and every field fcntl reads is set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 0;
    // SAFETY: the descriptor is open for the call (borrowed from `file`);
    // `fl` is a valid flock that fcntl only reads for SETLK.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl as *mut libc::flock) };
    if rc == -1 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(true)
}

/// Whether `path` names the open `file` (same device and inode).
fn names_file(path: &Path, file: &File) -> io::Result<bool> {
    let open = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(named) => Ok(named.dev() == open.dev() && named.ino() == open.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// A refusal of a target (its message says why; the caller names it).
fn refused(problem: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, problem.to_owned())
}

/// `e` with what was being done and to which path.
fn context(e: io::Error, op: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("cannot {op} `{}`: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_are_told_from_other_files() {
        assert_eq!(temporary_target("checkpoint-0000000003.gear.tmp.123.4"), Some("checkpoint-0000000003.gear"));
        assert_eq!(temporary_target("table.gear.tmp.77"), Some("table.gear"));
        assert_eq!(temporary_target("a.tmp.b.tmp.1.2"), Some("a.tmp.b"));
        for name in ["table.gear", "x.tmp.", "x.tmp.1.", "x.tmp.1.2.3", "x.tmp.a", ".tmp.1", "x.tmp.1.b"] {
            assert_eq!(temporary_target(name), None, "{name}");
        }
    }
}
