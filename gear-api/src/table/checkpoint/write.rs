//! Writing a checkpoint: a metadata snapshot under the table lock, then
//! trajectory bytes copied with the seqlock check and streamed to a
//! temporary file that is fsynced and renamed into place.

use super::files::{self, ReplacingFile};
use super::format::{self, problem, put_string, write_chunk, Tag, CHUNK_TARGET, RECORD_BYTES};
use super::CheckpointReport;
use crate::error::Result;
use crate::table::ReplayTable;
use gear_core::{SlotMeta, SlotState};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What the table lock is held for: everything but trajectory bytes.
struct Snapshot {
    /// Committed slots, oldest insert first (sorted after the lock is
    /// given back).
    slots: Vec<SlotMeta>,
    /// (role, name, state) of the sampler and the remover.
    strategies: Vec<(u8, String, Vec<u8>)>,
    header: Vec<u8>,
}

/// Takes the snapshot; also returns how long the table lock was held.
fn take_snapshot(table: &ReplayTable) -> Result<(Snapshot, std::time::Duration)> {
    let sh = &table.shared;
    let l = sh.lock(None)?;
    let locked = Instant::now();
    let ctl = l.ctl();
    let slots: Vec<SlotMeta> = sh
        .region
        .slots()
        .iter()
        .enumerate()
        .map(|(s, rec)| rec.meta(s as u32))
        .filter(|m| m.state == SlotState::Committed)
        .collect();
    let mut strategies = Vec::with_capacity(2);
    for (role, sel) in [(0u8, &l.local.sampler), (1u8, &l.local.remover)] {
        let mut state = Vec::new();
        sel.export_state(&mut state)?;
        strategies.push((role, sel.name().to_owned(), state));
    }
    let spec = table.spec().encode();
    let mut header = Vec::with_capacity(spec.len() + 160);
    header.extend_from_slice(&(spec.len() as u32).to_le_bytes());
    header.extend_from_slice(&spec);
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    for v in [
        table.seed(),
        now_ms,
        load(&ctl.inserts),
        load(&ctl.samples),
        load(&ctl.evictions),
        load(&ctl.retired),
        load(&ctl.reclaimed),
        load(&ctl.next_seq),
        load(&ctl.bytes_written),
        slots.len() as u64,
    ] {
        header.extend_from_slice(&v.to_le_bytes());
    }
    put_string(&mut header, &strategies[0].1);
    put_string(&mut header, &strategies[1].1);
    drop(l);
    Ok((Snapshot { slots, strategies, header }, locked.elapsed()))
}

/// Writes the checkpoint of `table` to `path`; see the module doc.
pub(super) fn write_checkpoint(table: &ReplayTable, path: &Path) -> Result<CheckpointReport> {
    let started = Instant::now();
    // Refused before the table is paused or anything is written.
    files::check_replaceable(path).map_err(|e| problem(path, e.to_string()))?;
    let (mut snapshot, pause) = take_snapshot(table)?;
    // Sorted by insert (the copy's order is decided in `stream`).
    snapshot.slots.sort_unstable_by_key(|m| m.insert_seq);
    let mut out = ReplacingFile::create(path).map_err(|e| problem(path, e.to_string()))?;
    let tmp = out.path().to_owned();
    // On an error `out` is dropped, which removes the temporary file.
    let (trajectories, data_bytes, file_bytes) = stream(table, &snapshot, out.file(), &tmp)?;
    out.commit().map_err(|e| problem(path, e.to_string()))?;
    Ok(CheckpointReport {
        path: path.to_owned(),
        trajectories,
        dropped: snapshot.slots.len() as u64 - trajectories,
        data_bytes,
        file_bytes,
        pause,
        elapsed: started.elapsed(),
    })
}

/// Streams the snapshot's trajectories to `file` (the caller fsyncs it). Returns
/// (trajectories, data bytes, file bytes).
fn stream(table: &ReplayTable, snapshot: &Snapshot, file: &mut File, tmp: &Path) -> Result<(u64, u64, u64)> {
    let region = &table.shared.region;
    let layout = region.layout();
    let columns = layout.columns();
    let step_bytes: Vec<usize> = (0..columns).map(|c| layout.step_bytes(c) as usize).collect();
    let largest = RECORD_BYTES + layout.slot_stride() as usize;
    // One buffer for the whole checkpoint, zeroed once: trajectories are
    // copied into it with the seqlock check, then written as one chunk.
    let mut buf = vec![0u8; CHUNK_TARGET.max(largest)];
    let mut used = 0usize;
    let werr = format::io(tmp, "write");
    let mut file_bytes = format::PREAMBLE_BYTES as u64;
    file.write_all(&format::preamble()).map_err(werr)?;
    file_bytes += write_chunk(file, Tag::Header, &snapshot.header).map_err(format::io(tmp, "write"))?;
    let (mut trajectories, mut data_bytes) = (0u64, 0u64);
    // Oldest first: under the default FIFO remover these are the next to
    // be evicted, so while the copy outpaces the writers it leaves out
    // none. Once one is found evicted, the writers' eviction front has
    // overtaken the copy, and every older-first step after would lose the
    // same race: the copy goes on from the newest, backwards, and meets the
    // front half way instead of trailing it.
    let (mut lo, mut hi, mut overtaken) = (0usize, snapshot.slots.len(), false);
    while lo < hi {
        let m = if overtaken {
            hi -= 1;
            &snapshot.slots[hi]
        } else {
            lo += 1;
            &snapshot.slots[lo - 1]
        };
        if m.len > layout.max_len() {
            // A record no correct writer leaves (the region is shared):
            // counted as dropped rather than trusted.
            continue;
        }
        let bytes: usize = step_bytes.iter().map(|s| s * m.len as usize).sum();
        if used + RECORD_BYTES + bytes > buf.len() {
            file_bytes += write_chunk(file, Tag::Data, &buf[..used]).map_err(format::io(tmp, "write"))?;
            used = 0;
        }
        let start = used;
        let record = &mut buf[used..used + RECORD_BYTES];
        record[0..4].copy_from_slice(&m.key.slot.to_le_bytes());
        record[4..8].copy_from_slice(&m.key.generation.to_le_bytes());
        record[8..16].copy_from_slice(&m.len.to_le_bytes());
        record[16..24].copy_from_slice(&m.priority.to_bits().to_le_bytes());
        record[24..32].copy_from_slice(&m.times_sampled.to_le_bytes());
        record[32..40].copy_from_slice(&m.insert_seq.to_le_bytes());
        used += RECORD_BYTES;
        let mut intact = true;
        for (c, &s) in step_bytes.iter().enumerate() {
            let n = s * m.len as usize;
            // A key no longer current (evicted) or a copy torn by a reuse:
            // the trajectory is left out.
            match region.read_steps(m.key, c, 0, &mut buf[used..used + n]) {
                Ok(true) => used += n,
                Ok(false) | Err(_) => {
                    intact = false;
                    break;
                }
            }
        }
        if intact {
            trajectories += 1;
            data_bytes += bytes as u64;
        } else {
            used = start;
            overtaken = true;
        }
    }
    if used > 0 {
        file_bytes += write_chunk(file, Tag::Data, &buf[..used]).map_err(format::io(tmp, "write"))?;
    }
    drop(buf);
    for (role, name, state) in &snapshot.strategies {
        let mut payload = Vec::with_capacity(state.len() + name.len() + 3);
        payload.push(*role);
        put_string(&mut payload, name);
        payload.extend_from_slice(state);
        file_bytes += write_chunk(file, Tag::Strategy, &payload).map_err(format::io(tmp, "write"))?;
    }
    let mut end = [0u8; 16];
    end[..8].copy_from_slice(&trajectories.to_le_bytes());
    end[8..].copy_from_slice(&data_bytes.to_le_bytes());
    file_bytes += write_chunk(file, Tag::End, &end).map_err(format::io(tmp, "write"))?;
    Ok((trajectories, data_bytes, file_bytes))
}
