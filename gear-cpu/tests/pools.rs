//! HostPool and ShmPool: alignment, zeroing, names, life cycle, refusals.

mod common;

use common::{unique_name, TestDir};
use gear_core::{MemoryKind, MemoryRegion};
use gear_cpu::{Error, HostPool, ShmOptions, ShmPool, DEFAULT_SHM_DIR};
use std::path::Path;

fn bytes_of(r: &impl MemoryRegion) -> &[u8] {
    // SAFETY: the region promises `len()` readable bytes at `host_ptr()` for
    // its lifetime, which bounds the returned borrow; no one writes them
    // while the test reads.
    unsafe { std::slice::from_raw_parts(r.host_ptr().unwrap().as_ptr(), r.len() as usize) }
}

fn write_byte(r: &impl MemoryRegion, at: usize, v: u8) {
    assert!((at as u64) < r.len());
    // SAFETY: `at` is inside the region (asserted), which is writable.
    unsafe { r.host_ptr().unwrap().as_ptr().add(at).write_volatile(v) };
}

#[test]
fn host_pool_is_page_aligned_zeroed_and_private() {
    for size in [1u64, 4095, 4096, 1 << 20] {
        let p = HostPool::new(size).unwrap();
        assert_eq!(p.kind(), MemoryKind::Host);
        assert_eq!(p.len(), size);
        assert_eq!(p.alignment(), 4096);
        assert_eq!(p.host_ptr().unwrap().as_ptr() as usize % 4096, 0);
        assert_eq!(p.name(), None);
        assert_eq!(p.device_ptr(), None);
        assert!(bytes_of(&p).iter().all(|&b| b == 0));
    }
}

#[test]
#[cfg_attr(miri, ignore = "Miri aborts on an impossible allocation instead of returning an error")]
fn host_pool_refuses_zero_and_impossible_sizes() {
    assert!(matches!(HostPool::new(0), Err(Error::ZeroSize)));
    for size in [u64::MAX, 1 << 62] {
        let e = HostPool::new(size).unwrap_err();
        assert!(matches!(e, Error::Alloc { bytes, .. } if bytes == size), "{e}");
        assert!(e.to_string().contains(&size.to_string()), "{e}");
    }
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn shm_pool_is_aligned_zeroed_named_and_shared_between_mappings() {
    let name = unique_name("basic");
    let a = ShmPool::create(&name, 10_000, ShmOptions::default()).unwrap();
    assert_eq!(a.kind(), MemoryKind::Shared);
    assert_eq!(a.len(), 10_000);
    assert_eq!(a.name(), Some(name.as_str()));
    assert_eq!(a.alignment(), 4096);
    assert_eq!(a.host_ptr().unwrap().as_ptr() as usize % 4096, 0);
    assert!(a.is_creator() && a.unlinks_on_drop());
    assert_eq!(a.path(), Path::new(DEFAULT_SHM_DIR).join(&name));
    assert!(bytes_of(&a).iter().all(|&b| b == 0));

    let b = ShmPool::open(&name, None).unwrap();
    assert_eq!(b.len(), 10_000);
    assert!(!b.is_creator() && !b.unlinks_on_drop());
    write_byte(&a, 9_999, 0x5a);
    write_byte(&b, 0, 0xa5);
    assert_eq!(bytes_of(&b)[9_999], 0x5a);
    assert_eq!(bytes_of(&a)[0], 0xa5);

    drop(b);
    assert!(a.path().exists(), "an attacher must not unlink");
    let path = a.path();
    drop(a);
    assert!(!path.exists(), "the creator unlinks on drop");
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn create_on_an_existing_name_fails() {
    let name = unique_name("exists");
    let _a = ShmPool::create(&name, 4096, ShmOptions::default()).unwrap();
    let e = ShmPool::create(&name, 4096, ShmOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&name) && msg.contains("already exists") && msg.contains("/dev/shm"), "{msg}");
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn open_of_a_missing_name_names_the_name_and_directory() {
    let name = unique_name("missing");
    let e = ShmPool::open(&name, None).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&name) && msg.contains("/dev/shm") && msg.contains("not found"), "{msg}");

    let dir = TestDir::new("missing-dir");
    let msg = ShmPool::open(&name, Some(dir.path())).unwrap_err().to_string();
    assert!(msg.contains(&name) && msg.contains(&dir.path().display().to_string()), "{msg}");
    assert!(matches!(ShmPool::unlink(&name, None), Err(Error::NotFound { .. })));
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn bad_names_are_refused_everywhere() {
    for bad in ["", "a/b", "../etc", "..", ".", "x y", "ü", &"n".repeat(256)] {
        let e = ShmPool::create(bad, 4096, ShmOptions::default()).unwrap_err();
        assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e}");
        assert!(matches!(ShmPool::open(bad, None), Err(Error::InvalidName { .. })), "{bad:?}");
        assert!(matches!(ShmPool::unlink(bad, None), Err(Error::InvalidName { .. })), "{bad:?}");
    }
    let e = ShmPool::open("a/b", None).unwrap_err().to_string();
    assert!(e.contains("`a/b`"), "{e}");
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn zero_size_is_refused_and_leaves_no_file() {
    let name = unique_name("zero");
    assert!(matches!(ShmPool::create(&name, 0, ShmOptions::default()), Err(Error::ZeroSize)));
    assert!(!Path::new(DEFAULT_SHM_DIR).join(&name).exists());
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn too_large_for_dev_shm_is_a_clear_error_and_leaves_no_file() {
    let name = unique_name("huge");
    let needed = u64::MAX / 2;
    let e = ShmPool::create(&name, needed, ShmOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoSpace { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("/dev/shm is too small"), "{msg}");
    assert!(msg.contains(&needed.to_string()), "{msg}");
    assert!(msg.contains(&name), "{msg}");
    assert!(!Path::new(DEFAULT_SHM_DIR).join(&name).exists(), "partial file left behind");
    // The name is free again.
    drop(ShmPool::create(&name, 4096, ShmOptions::default()).unwrap());
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn too_large_for_a_named_directory_names_that_directory() {
    let dir = TestDir::new("huge-dir");
    let name = unique_name("huge");
    let e = ShmPool::create(&name, u64::MAX / 2, ShmOptions::new().dir(dir.path())).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(&format!("{} is too small", dir.path().display())), "{msg}");
    assert!(!dir.path().join(&name).exists());
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn keep_and_persist_leave_the_name_and_unlink_removes_it() {
    let dir = TestDir::new("keep");
    let kept = unique_name("kept");
    let p = ShmPool::create(&kept, 8192, ShmOptions::new().dir(dir.path()).keep(true)).unwrap();
    assert!(p.is_creator() && !p.unlinks_on_drop());
    write_byte(&p, 100, 42);
    drop(p);
    let again = ShmPool::open(&kept, Some(dir.path())).unwrap();
    assert_eq!(again.len(), 8192);
    assert_eq!(bytes_of(&again)[100], 42, "a kept pool keeps its bytes");
    ShmPool::unlink(&kept, Some(dir.path())).unwrap();
    assert!(!dir.path().join(&kept).exists());
    assert_eq!(bytes_of(&again)[100], 42, "mappings outlive the name");

    let persisted = unique_name("persisted");
    let p = ShmPool::create(&persisted, 4096, ShmOptions::new().dir(dir.path())).unwrap();
    p.persist();
    drop(p);
    assert!(dir.path().join(&persisted).exists());
    ShmPool::unlink(&persisted, Some(dir.path())).unwrap();
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn creator_drop_leaves_a_reused_name_alone() {
    let dir = TestDir::new("reuse");
    let name = unique_name("reused");
    let first = ShmPool::create(&name, 4096, ShmOptions::new().dir(dir.path())).unwrap();
    ShmPool::unlink(&name, Some(dir.path())).unwrap();
    let second = ShmPool::create(&name, 4096, ShmOptions::new().dir(dir.path())).unwrap();
    drop(first);
    assert!(dir.path().join(&name).exists(), "dropping the first creator removed the second's file");
    drop(second);
    assert!(!dir.path().join(&name).exists());
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn open_refuses_an_empty_file() {
    let dir = TestDir::new("empty");
    let name = unique_name("empty");
    std::fs::write(dir.path().join(&name), b"").unwrap();
    let e = ShmPool::open(&name, Some(dir.path())).unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e}");
    assert!(e.to_string().contains(&name));
}

#[test]
#[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
fn file_mode_is_applied() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TestDir::new("mode");
    let name = unique_name("mode");
    let p = ShmPool::create(&name, 4096, ShmOptions::new().dir(dir.path())).unwrap();
    let mode = std::fs::metadata(p.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o077, 0, "default pools are private to the user, got {mode:o}");
}
