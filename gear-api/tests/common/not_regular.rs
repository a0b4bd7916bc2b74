//! Targets that are not regular files, for the tests that check they are
//! refused (gear-api's checkpoints, gear-hdf5's imports and exports,
//! gear-cli's outputs: the latter two include this file by `#[path]`).

use std::path::{Path, PathBuf};

/// A character device to aim a write at: a node like `/dev/null` made in
/// `dir` where this process may (as root), so that a regression replaces
/// that copy, never the machine's `/dev/null`; `/dev/null` itself where
/// the process may not replace it anyway; `None` (with the reason
/// printed) for root without the right to make device nodes.
pub fn null_device(dir: &Path) -> Option<PathBuf> {
    let node = dir.join("null-device");
    let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the call.
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0 {
        return Some(node);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some(PathBuf::from("/dev/null"));
    }
    eprintln!("skipping the device-node target: root without CAP_MKNOD (would risk the real /dev/null)");
    None
}

/// Makes a FIFO at `path`.
#[allow(dead_code)] // gear-cli's tests make none.
pub fn make_fifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}
