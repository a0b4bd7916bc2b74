//! Restoring a checkpoint into a freshly built table: trajectory bytes are
//! read straight into their slots (no staging copy) and each data chunk's
//! checksum is checked at its end, other chunks are checked before they
//! are parsed, every record is bounded by the spec, and the table is handed
//! out only once the whole file has been read and checked (an error drops
//! it: never a half-loaded table).

use super::format::{
    self, check_preamble, problem, ChunkReader, Fields, Tag, CHUNK_TARGET, ITEM_RECORD_BYTES, PREAMBLE_BYTES,
    RECORD_BYTES,
};
use crate::error::Result;
use crate::table::ReplayTable;
use gear_core::{check_priority, item_index, ItemState, MemoryKind, MemoryRegion, SlotKey, TableSpec};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::Ordering;

/// The counters of the header chunk.
struct Header {
    spec: TableSpec,
    inserts: u64,
    samples: u64,
    evictions: u64,
    retired: u64,
    reclaimed: u64,
    next_seq: u64,
    bytes_written: u64,
    snapshot: u64,
}

fn parse_header(payload: &[u8]) -> std::result::Result<Header, String> {
    let mut f = Fields::new(payload, "header chunk");
    let spec_len = f.u32()? as usize;
    let spec = TableSpec::decode(f.take(spec_len)?).map_err(|e| format!("corrupted: the spec cannot be read: {e}"))?;
    let _seed = f.u64()?;
    let _created_ms = f.u64()?;
    let header = Header {
        spec,
        inserts: f.u64()?,
        samples: f.u64()?,
        evictions: f.u64()?,
        retired: f.u64()?,
        reclaimed: f.u64()?,
        next_seq: f.u64()?,
        bytes_written: f.u64()?,
        snapshot: f.u64()?,
    };
    let _sampler = f.string()?;
    let _remover = f.string()?;
    Ok(header)
}

/// Reads the checkpoint at `path` into `table`, which must be freshly
/// built (empty) with the checkpoint's spec.
pub(crate) fn restore_into(table: &ReplayTable, path: &Path) -> Result<()> {
    let path = &super::resolve(path)?;
    let mut file = File::open(path).map_err(format::io(path, "open"))?;
    let mut preamble = [0u8; PREAMBLE_BYTES];
    file.read_exact(&mut preamble).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => problem(path, "truncated: shorter than the 16-byte preamble"),
        _ => format::io(path, "read")(e),
    })?;
    let version = check_preamble(path, &preamble)?;
    advise_sequential(&file);
    let mut chunks = ChunkReader::new(file, path);
    let (tag, payload) = chunks.next(1 << 24)?;
    if tag != Tag::Header {
        return Err(problem(path, format!("corrupted: the first chunk is {tag:?}, not the header")));
    }
    let header = parse_header(payload).map_err(|p| problem(path, p))?;
    let spec = table.spec();
    if header.spec != *spec {
        return Err(problem(
            path,
            format!(
                "spec mismatch: the checkpoint holds {}; the table being restored has {}",
                gear_core::region::summarize(&header.spec),
                gear_core::region::summarize(spec)
            ),
        ));
    }
    let sh = &table.shared;
    let region = &sh.region;
    let layout = region.layout();
    let step_bytes: Vec<usize> = (0..layout.columns()).map(|c| layout.step_bytes(c) as usize).collect();
    let capacity = spec.capacity();
    let owner = u64::from(sh.lease.token());
    let data_limit = (CHUNK_TARGET.max(RECORD_BYTES + layout.slot_stride() as usize)) as u64;
    let strategy_limit = capacity.max(spec.item_capacity()).saturating_mul(16).saturating_add(1 << 16);
    // Held for the whole restore: no process that attaches meanwhile sees
    // a table half restored.
    let mut l = sh.lock(None)?;
    let fresh = l.ctl().next_seq.load(Ordering::Relaxed) == 1 && l.ctl().free_len.load(Ordering::Relaxed) == capacity;
    if !fresh {
        return Err(problem(path, "a checkpoint is restored only into a freshly built table"));
    }
    let mut seen = vec![false; capacity as usize];
    // The restored trajectory of each slot, and its length (items are
    // checked against them).
    let mut restored_slots: Vec<Option<(u32, u64)>> = vec![None; capacity as usize];
    let mut items_seen = vec![false; spec.item_capacity() as usize];
    let (mut restored, mut data_bytes, mut max_seq, mut items) = (0u64, 0u64, 0u64, 0u64);
    let mut states: Vec<(u8, String, Vec<u8>)> = Vec::new();
    loop {
        let (tag, len) = chunks.begin(data_limit.max(strategy_limit))?;
        match tag {
            Tag::Data => {
                // Read straight into the slots; a checksum that then fails
                // drops the table with them.
                while chunks.left() > 0 {
                    let (key, len, seq, bytes) = restore_record(table, &mut chunks, &step_bytes, &mut seen, owner)?;
                    restored_slots[key.slot as usize] = Some((key.generation, len));
                    restored += 1;
                    data_bytes += bytes;
                    max_seq = max_seq.max(seq);
                }
                chunks.finish()?;
            }
            Tag::Items => {
                while chunks.left() > 0 {
                    let mut record = [0u8; ITEM_RECORD_BYTES];
                    chunks.part(&mut record)?;
                    restore_item(table, &record, &restored_slots, &mut items_seen).map_err(|p| problem(path, p))?;
                    items += 1;
                }
                chunks.finish()?;
            }
            Tag::Strategy | Tag::End | Tag::Header => {
                let mut payload = vec![0u8; len as usize];
                chunks.part(&mut payload)?;
                chunks.finish()?;
                let mut f = Fields::new(&payload, "chunk");
                match tag {
                    Tag::Strategy => {
                        let role = f.take(1).map_err(|p| problem(path, p))?[0];
                        let name = f.string().map_err(|p| problem(path, p))?;
                        states.push((role, name, f.rest().to_vec()));
                    }
                    Tag::End => {
                        let count = f.u64().map_err(|p| problem(path, p))?;
                        let bytes = f.u64().map_err(|p| problem(path, p))?;
                        let item_count = if version >= 2 { f.u64().map_err(|p| problem(path, p))? } else { 0 };
                        if item_count != items {
                            return Err(problem(
                                path,
                                format!("corrupted: the end chunk counts {item_count} items, the file held {items}"),
                            ));
                        }
                        if (count, bytes) != (restored, data_bytes) || restored > header.snapshot {
                            return Err(problem(
                                path,
                                format!(
                                    "corrupted: the end chunk counts {count} trajectories of {bytes} bytes, the file held {restored} of {data_bytes}"
                                ),
                            ));
                        }
                        break;
                    }
                    _ => return Err(problem(path, "corrupted: a second header chunk")),
                }
            }
        }
    }
    if !chunks.at_end()? {
        return Err(problem(path, "corrupted: bytes follow the end chunk"));
    }
    let ctl = l.ctl();
    ctl.inserts.store(header.inserts, Ordering::Relaxed);
    ctl.samples.store(header.samples, Ordering::Relaxed);
    ctl.evictions.store(header.evictions, Ordering::Relaxed);
    ctl.retired.store(header.retired, Ordering::Relaxed);
    ctl.reclaimed.store(header.reclaimed, Ordering::Relaxed);
    ctl.bytes_written.store(header.bytes_written, Ordering::Relaxed);
    ctl.next_seq.store(header.next_seq.max(max_seq.saturating_add(1)), Ordering::Relaxed);
    // Free list, size and the strategies from the restored slot records
    // (members re-inserted in insertion order), then what the strategies
    // kept beyond that.
    l.repair();
    for (role, name, state) in &states {
        let sel = if *role == 0 { &mut l.local.sampler } else { &mut l.local.remover };
        // A table restored with other strategies than it was written with
        // starts them from the members alone.
        if sel.name() == name {
            sel.import_state(state).map_err(|e| problem(path, format!("strategy `{name}`: {e}")))?;
        }
    }
    l.wake();
    // The restore built its host pool of small pages, faulted in as the
    // bytes landed (see `HostPool::unpopulated`); from now on the kernel
    // may merge them into huge pages in the background, as a built table
    // has from the start.
    let pool = region.region();
    if let (MemoryKind::Host, Some(p)) = (pool.kind(), pool.host_ptr()) {
        gear_core::hint::advise_huge_pages(p.as_ptr(), usize::try_from(pool.len()).unwrap_or(0));
    }
    Ok(())
}

/// Tells the kernel the file is read once, front to back (a larger
/// read-ahead when it is not cached). Only advice: a failure is ignored.
fn advise_sequential(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: `posix_fadvise` reads and writes no memory of this process;
    // the descriptor is open for the duration of the call (`file` is
    // borrowed).
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
}

/// Restores one item record into its slot's records, live, after its
/// trajectory was restored. An item of a trajectory the file does not
/// hold is refused (the writer writes only the items of the trajectories
/// it wrote), as are windows past the trajectory's steps, indices past the
/// table's items, duplicates and bad priorities.
fn restore_item(
    table: &ReplayTable,
    record: &[u8; ITEM_RECORD_BYTES],
    restored: &[Option<(u32, u64)>],
    seen: &mut [bool],
) -> std::result::Result<(), String> {
    let sh = &table.shared;
    let mut f = Fields::new(record, "item record");
    let (slot, slot_generation, j, generation) = (f.u32()?, f.u32()?, f.u32()?, f.u32()?);
    let (start, len) = (u64::from(f.u32()?), u64::from(f.u32()?));
    let priority = f64::from_bits(f.u64()?);
    let times_sampled = f.u64()?;
    let per_slot = sh.items_per_slot;
    if j >= per_slot {
        return Err(format!("corrupted: item {j} of slot {slot}, the table keeps {per_slot} per trajectory"));
    }
    match restored.get(slot as usize) {
        Some(Some((g, n))) if *g == slot_generation => {
            if len == 0 || start + len > *n {
                return Err(format!("corrupted: item {j} of slot {slot} spans steps {start}..{} of {n}", start + len));
            }
        }
        _ => {
            return Err(format!(
                "corrupted: item {j} names trajectory {slot}@{slot_generation}, which the file does not hold"
            ))
        }
    }
    let index = item_index(slot, j, per_slot);
    match seen.get_mut(index as usize) {
        Some(s) if !*s => *s = true,
        _ => return Err(format!("corrupted: item {j} of slot {slot} appears twice")),
    }
    check_priority(priority).map_err(|e| format!("corrupted: item {j} of slot {slot}: {e}"))?;
    let rec = &sh.region.items_of(slot)[j as usize];
    let key = rec.fill_as(index, generation, slot_generation, start, len, priority, ItemState::Live);
    rec.set_times_sampled(key, times_sampled);
    Ok(())
}

/// Restores one trajectory record of the data chunk being read into its
/// slot. Returns its key, length, insert sequence and data bytes.
fn restore_record<R: Read>(
    table: &ReplayTable,
    chunks: &mut ChunkReader<'_, R>,
    step_bytes: &[usize],
    seen: &mut [bool],
    owner: u64,
) -> Result<(SlotKey, u64, u64, u64)> {
    let region = &table.shared.region;
    let path = chunks.path();
    let mut fixed = [0u8; RECORD_BYTES];
    chunks.part(&mut fixed)?;
    let bad = |p: String| problem(path, p);
    let mut f = Fields::new(&fixed, "record");
    let (slot, generation) = (f.u32().map_err(bad)?, f.u32().map_err(bad)?);
    let len = f.u64().map_err(bad)?;
    let priority = f64::from_bits(f.u64().map_err(bad)?);
    let times_sampled = f.u64().map_err(bad)?;
    let insert_seq = f.u64().map_err(bad)?;
    let key = SlotKey { slot, generation };
    let Some(first) = seen.get_mut(slot as usize) else {
        return Err(bad(format!("corrupted: slot {slot} is beyond the capacity of {}", seen.len())));
    };
    if std::mem::replace(first, true) {
        return Err(bad(format!("corrupted: slot {slot} appears twice")));
    }
    if len > region.spec().max_len() {
        return Err(bad(format!(
            "corrupted: slot {slot} holds {len} steps, more than T = {}",
            region.spec().max_len()
        )));
    }
    check_priority(priority).map_err(|e| bad(format!("corrupted: slot {slot}: {e}")))?;
    let rec = region.slot(slot)?;
    rec.begin_restore(key, owner, insert_seq, priority)?;
    let mut total = 0u64;
    for (c, &s) in step_bytes.iter().enumerate() {
        let n = s * len as usize;
        region.fill_steps(key, c, 0, n, |out| chunks.part(out))??;
        total += n as u64;
    }
    rec.publish_len(key, len)?;
    rec.commit(key)?;
    rec.set_times_sampled(key, times_sampled);
    Ok((key, len, insert_seq, total))
}
