//! Checkpoint targets: paths that are not regular files refused and left
//! alone, version 1 files restored, and stale temporary files removed.

use super::not_regular::{make_fifo, null_device};
use super::{draws, every_dtype_spec, names_in, refused, small_table, temp_dir};
use gear_api::{Error, ReplayTable};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[test]
fn checkpoint_targets_that_are_not_regular_files_are_refused_and_left_alone() {
    use std::os::unix::fs::FileTypeExt;
    let dir = temp_dir("targets");
    let table = small_table();
    let expect_refused = |path: &Path, word: &str| {
        let msg = match table.checkpoint(path) {
            Ok(r) => panic!("{} was replaced by a checkpoint of {} bytes", path.display(), r.file_bytes),
            Err(e @ Error::Checkpoint { .. }) => e.to_string(),
            Err(e) => panic!("expected a checkpoint error, got {e}"),
        };
        assert!(msg.contains(word) && msg.contains(&path.display().to_string()), "{msg}");
    };
    // The device node a new user reaches for to mean "don't keep it".
    if let Some(null) = null_device(&dir) {
        expect_refused(&null, "is a character device, not a regular file");
        assert!(std::fs::symlink_metadata(&null).unwrap().file_type().is_char_device(), "still a device");
    }
    let sub = dir.join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    expect_refused(&sub, "is a directory");
    assert!(sub.is_dir());
    let fifo = dir.join("a-fifo");
    make_fifo(&fifo);
    expect_refused(&fifo, "is a FIFO");
    let socket = dir.join("a-socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    expect_refused(&socket, "is a socket");
    let file = dir.join("kept.gear");
    std::fs::write(&file, b"someone else's bytes").unwrap();
    let link = dir.join("link.gear");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    expect_refused(&link, "is a symbolic link");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&file).unwrap(), b"someone else's bytes");
    let dangling = dir.join("dangling.gear");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    expect_refused(&dangling, "is a symbolic link");
    // Named directly, the regular file is replaced; no temporary file is
    // left by any of the above.
    table.checkpoint(&file).unwrap();
    assert_eq!(
        names_in(&dir),
        ["a-directory", "a-fifo", "a-socket", "dangling.gear", "kept.gear", "link.gear", "null-device"]
            .iter()
            .filter(|n| **n != "null-device" || dir.join(n).exists())
            .map(|n| n.to_string())
            .collect::<Vec<_>>(),
        "only the targets themselves"
    );
    // Restores read regular files only (a FIFO would block, a device would
    // never end), through symbolic links.
    for (source, word) in [(fifo.clone(), "is a FIFO"), (PathBuf::from("/dev/zero"), "is a character device")] {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(refused(&source)));
        let msg = rx.recv_timeout(Duration::from_secs(20)).expect("a restore from a FIFO or a device returns");
        assert!(msg.contains(word), "{msg}");
    }
    ReplayTable::builder(every_dtype_spec(16)).restore(&link).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn version_1_checkpoints_still_restore() {
    let dir = temp_dir("v1");
    let table = small_table();
    let path = dir.join("v2.gear");
    table.checkpoint(&path).unwrap();
    // A table without items writes what version 1 wrote, but for the
    // version and the end chunk's item count: take them out.
    let bytes = std::fs::read(&path).unwrap();
    let end_at = bytes.len() - (12 + 24 + 4);
    assert_eq!(&bytes[end_at..end_at + 4], &4u32.to_le_bytes(), "the end chunk is last");
    let mut v1 = bytes[..end_at].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let mut end = Vec::new();
    end.extend_from_slice(&4u32.to_le_bytes());
    end.extend_from_slice(&16u64.to_le_bytes());
    end.extend_from_slice(&bytes[end_at + 12..end_at + 12 + 16]);
    let crc = crc32fast::hash(&end);
    v1.extend_from_slice(&end);
    v1.extend_from_slice(&crc.to_le_bytes());
    let old = dir.join("v1.gear");
    std::fs::write(&old, &v1).unwrap();
    let restored = ReplayTable::builder(every_dtype_spec(16)).seed(1).restore(&old).unwrap();
    assert_eq!(restored.info().unwrap().size, table.info().unwrap().size);
    assert_eq!(draws(&restored, 2), draws(&table, 2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stale_temporary_files_are_removed_and_live_ones_kept() {
    use gear_api::table::checkpoint::{files::ReplacingFile, remove_stale_temporaries};
    let dir = temp_dir("stale");
    let table = small_table();
    table.checkpoint_into(&dir, 3).unwrap();
    // Left by dead writers: this scheme's names and the names of writers
    // from before it (no number).
    for name in ["checkpoint-0000000002.gear.tmp.4242.0", "checkpoint-0000000002.gear.tmp.4242"] {
        std::fs::write(dir.join(name), b"partial").unwrap();
    }
    // Not temporary files of numbered checkpoints: kept.
    let others = ["notes.txt.tmp.1.0", "checkpoint-x.gear.tmp.1.0", "checkpoint-0000000003.gear.tmp.x"];
    for name in others {
        std::fs::write(dir.join(name), b"keep").unwrap();
    }
    // A FIFO under a temporary name is not a file a writer left: kept,
    // and looking at it does not block.
    make_fifo(&dir.join("checkpoint-0000000004.gear.tmp.7.0"));
    // A live writer's temporary file, from this process (the lock is per
    // open file, so even the writer's own process does not take it).
    let live = ReplacingFile::create(&dir.join("checkpoint-0000000005.gear")).unwrap();
    assert_eq!(remove_stale_temporaries(&dir).unwrap(), 2);
    let names = names_in(&dir);
    assert!(names.contains(&live.path().file_name().unwrap().to_str().unwrap().to_owned()), "{names:?}");
    for name in others {
        assert!(names.contains(&name.to_owned()), "{name} kept: {names:?}");
    }
    assert!(names.contains(&"checkpoint-0000000004.gear.tmp.7.0".to_owned()));
    assert!(!names.iter().any(|n| n.starts_with("checkpoint-0000000002.gear.tmp.")), "{names:?}");
    // Dropped without a commit, the writer removes its own file.
    let path = live.path().to_owned();
    drop(live);
    assert!(!path.exists());
    // `checkpoint(path)` removes stale files of its own target only.
    for name in ["one.gear.tmp.99.0", "two.gear.tmp.99.0"] {
        std::fs::write(dir.join(name), b"partial").unwrap();
    }
    table.checkpoint(dir.join("one.gear")).unwrap();
    let names = names_in(&dir);
    assert!(!names.contains(&"one.gear.tmp.99.0".to_owned()) && names.contains(&"two.gear.tmp.99.0".to_owned()));
    std::fs::remove_dir_all(&dir).unwrap();
}
