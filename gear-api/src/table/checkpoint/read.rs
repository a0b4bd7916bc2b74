//! Restoring a checkpoint into a freshly built table: trajectory bytes are
//! read straight into their slots (no staging copy) and each data chunk's
//! checksum is checked at its end, other chunks are checked before they
//! are parsed, every record is bounded by the spec and checked against
//! what a real table can hold (see [`Records::check_against`]), and the
//! table is handed out only once the whole file has been read and checked
//! (an error drops it: never a half-loaded table). A second thread faults
//! the table's pages in ahead of the reader ([`Prefault`]).

use super::format::{
    self, check_preamble, problem, ChunkReader, Fields, Tag, CHUNK_TARGET, PREAMBLE_BYTES, RECORD_BYTES,
};
use crate::error::Result;
use crate::table::ReplayTable;
use gear_core::{check_priority, MemoryKind, MemoryRegion, SlotKey, TableSpec};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

impl Header {
    /// Refuses counters no table can have: no insert sequence handed out
    /// (sequences start at 1), more commits than sequences, a snapshot
    /// larger than the table.
    fn check(&self) -> std::result::Result<(), String> {
        if self.next_seq == 0 {
            return Err("corrupted: the header's next insert sequence is 0 (sequences start at 1)".into());
        }
        if self.inserts > self.next_seq - 1 {
            return Err(format!(
                "corrupted: the header counts {} inserts but only {} insert sequences were handed out",
                self.inserts,
                self.next_seq - 1
            ));
        }
        let capacity = self.spec.capacity();
        if self.snapshot > capacity {
            return Err(format!(
                "corrupted: the header's snapshot holds {} trajectories, more than the capacity of {capacity}",
                self.snapshot
            ));
        }
        Ok(())
    }
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
    check_preamble(path, &preamble)?;
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
    header.check().map_err(|p| problem(path, p))?;
    let sh = &table.shared;
    let region = &sh.region;
    let layout = region.layout();
    let step_bytes: Vec<usize> = (0..layout.columns()).map(|c| layout.step_bytes(c) as usize).collect();
    let capacity = spec.capacity();
    let owner = u64::from(sh.lease.token());
    let data_limit = (CHUNK_TARGET.max(RECORD_BYTES + layout.slot_stride() as usize)) as u64;
    let strategy_limit = capacity.saturating_mul(16).saturating_add(1 << 16);
    let limits = ChunkLimits { chunk: data_limit.max(strategy_limit), owner, step_bytes: &step_bytes };
    // Held for the whole restore: no process that attaches meanwhile sees
    // a table half restored.
    let mut l = sh.lock(None)?;
    let fresh = l.ctl().next_seq.load(Ordering::Relaxed) == 1 && l.ctl().free_len.load(Ordering::Relaxed) == capacity;
    if !fresh {
        return Err(problem(path, "a checkpoint is restored only into a freshly built table"));
    }
    let mut records = Records { seen: vec![false; capacity as usize], ..Records::default() };
    // The reader announces the slot it fills; a second thread faults the
    // pool's pages in ahead of it (see `Prefault`).
    let prefault = Prefault::new(table);
    let read = std::thread::scope(|scope| {
        if let Some(p) = &prefault {
            scope.spawn(|| p.run());
        }
        let read = read_chunks(table, &mut chunks, &header, &mut records, prefault.as_ref(), limits);
        if let Some(p) = &prefault {
            p.stop.store(true, Ordering::Relaxed);
        }
        read
    });
    let (restored, states) = read?;
    if !chunks.at_end()? {
        return Err(problem(path, "corrupted: bytes follow the end chunk"));
    }
    records.check_against(&header, restored).map_err(|p| problem(path, p))?;
    let ctl = l.ctl();
    ctl.inserts.store(header.inserts, Ordering::Relaxed);
    ctl.samples.store(header.samples, Ordering::Relaxed);
    ctl.evictions.store(header.evictions, Ordering::Relaxed);
    ctl.retired.store(header.retired, Ordering::Relaxed);
    ctl.reclaimed.store(header.reclaimed, Ordering::Relaxed);
    ctl.bytes_written.store(header.bytes_written, Ordering::Relaxed);
    // Every record's sequence was checked to be below it.
    ctl.next_seq.store(header.next_seq, Ordering::Relaxed);
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

/// What [`read_chunks`] may read and who restores.
#[derive(Clone, Copy)]
struct ChunkLimits<'a> {
    /// The longest chunk payload a correct file has.
    chunk: u64,
    /// The restoring process's lease token, as slot owner.
    owner: u64,
    /// Bytes of one step of each column.
    step_bytes: &'a [usize],
}

/// `(role, name, state)` of each strategy chunk.
type StrategyStates = Vec<(u8, String, Vec<u8>)>;

/// Reads the chunks after the header up to and including the end chunk:
/// trajectory records into their slots, strategy states into the list it
/// returns with the number of trajectories restored.
fn read_chunks<R: Read>(
    table: &ReplayTable,
    chunks: &mut ChunkReader<'_, R>,
    header: &Header,
    records: &mut Records,
    prefault: Option<&Prefault>,
    limits: ChunkLimits<'_>,
) -> Result<(u64, StrategyStates)> {
    let path = chunks.path();
    let (mut restored, mut data_bytes) = (0u64, 0u64);
    let mut states = StrategyStates::new();
    loop {
        let (tag, len) = chunks.begin(limits.chunk)?;
        match tag {
            Tag::Data => {
                // Read straight into the slots; a checksum that then fails
                // drops the table with them.
                while chunks.left() > 0 {
                    data_bytes += restore_record(table, chunks, limits, header, records, prefault)?;
                    restored += 1;
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
                        if role > 1 || states.iter().any(|(r, _, _)| *r == role) {
                            let what = if role > 1 { "unknown" } else { "a second" };
                            return Err(problem(
                                path,
                                format!("corrupted: a strategy chunk of {what} role {role} (0: sampler, 1: remover)"),
                            ));
                        }
                        let name = f.string().map_err(|p| problem(path, p))?;
                        states.push((role, name, f.rest().to_vec()));
                    }
                    Tag::End => {
                        let count = f.u64().map_err(|p| problem(path, p))?;
                        let bytes = f.u64().map_err(|p| problem(path, p))?;
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
    Ok((restored, states))
}

/// Faults the pages of a restored table's data area in from a second
/// thread, ahead of the reader: `madvise(MADV_POPULATE_WRITE)`, 4 MiB at
/// a time, from the slot the reader fills onwards. A restore writes into
/// memory the process did not have; faulted in by the reader's own copies,
/// each 4 KiB page costs a fault, a clear and a second write on the
/// reader's thread (a plain read into a reused buffer pays none of it).
/// Populating never changes a byte (it faults pages in as a write would,
/// without the write), so it may run while the reader writes. Kernels
/// without it (before Linux 5.14) refuse the call, and the reader faults
/// its pages itself, as without this thread.
struct Prefault {
    /// Address and length of the data area.
    base: usize,
    len: usize,
    /// Bytes of one slot.
    stride: usize,
    /// The slot the reader fills (`u64::MAX` before the first).
    reader: AtomicU64,
    /// Set when the reader is done.
    stop: AtomicBool,
}

/// Bytes populated per call.
const PREFAULT_STEP: usize = 4 << 20;

impl Prefault {
    /// `None` for a table whose data area is not host memory, or is too
    /// small for a second thread to pay off.
    fn new(table: &ReplayTable) -> Option<Prefault> {
        let region = &table.shared.region;
        let pool = region.region();
        if pool.kind() != MemoryKind::Host || pool.host_ptr().is_none() {
            return None;
        }
        let stride = usize::try_from(region.layout().slot_stride()).ok()?;
        let len = stride.checked_mul(usize::try_from(region.spec().capacity()).ok()?)?;
        (len >= 16 * PREFAULT_STEP).then(|| Prefault {
            base: region.data_ptr().as_ptr() as usize,
            len,
            stride,
            reader: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
        })
    }

    /// The populating thread: from the reader's step onwards, wrapping
    /// around, each step once; a step the reader reached first is left to
    /// it.
    fn run(&self) {
        let steps = self.len.div_ceil(PREFAULT_STEP);
        let mut done = vec![false; steps];
        let mut left = steps;
        let reader_step = |p: &Prefault| match p.reader.load(Ordering::Relaxed) {
            u64::MAX => None,
            slot => Some((slot as usize).saturating_mul(p.stride) / PREFAULT_STEP % steps),
        };
        let mut cursor = loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            match reader_step(self) {
                Some(s) => break s,
                None => std::thread::yield_now(),
            }
        };
        while left > 0 && !self.stop.load(Ordering::Relaxed) {
            if let Some(r) = reader_step(self) {
                if !done[r] && r != cursor {
                    // The reader overtook (or jumped past) the cursor: it
                    // faults its own step; go on after it.
                    done[r] = true;
                    left -= 1;
                    cursor = (r + 1) % steps;
                    continue;
                }
            }
            if !done[cursor] {
                let at = cursor * PREFAULT_STEP;
                let n = PREFAULT_STEP.min(self.len - at);
                // SAFETY: [base + at, base + at + n) lies inside the data
                // area of the table's mapping (at < len, n <= len - at),
                // which outlives this thread (a scoped thread, joined
                // before the table is handed out or dropped).
                // MADV_POPULATE_WRITE only faults the pages in, as a write
                // would, and changes no byte of them, so the reader's
                // concurrent writes into the same pages are unaffected.
                let rc = unsafe { libc::madvise((self.base + at) as *mut libc::c_void, n, libc::MADV_POPULATE_WRITE) };
                if rc != 0 {
                    return;
                }
                done[cursor] = true;
                left -= 1;
            }
            cursor = (cursor + 1) % steps;
        }
    }
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

/// What the records read so far add up to, for the checks that need all
/// of them ([`Records::check_against`]).
#[derive(Default)]
struct Records {
    /// Slots restored so far.
    seen: Vec<bool>,
    /// Insert sequences, in file order.
    seqs: Vec<u64>,
    /// Sum of the fewest slot reuses each record's generation implies.
    reuses: u128,
    /// Sum of times sampled.
    times_sampled: u128,
}

impl Records {
    /// The checks across records and against the header's counters, once
    /// every record was read. What a real table guarantees:
    /// * every trajectory took its own insert sequence when it began, so
    ///   sequences are distinct (and each is below the next one, checked
    ///   per record);
    /// * each begin bumped one slot's generation by one, so the
    ///   generations (as reuses, see [`fewest_reuses`]) add up to at most
    ///   the sequences handed out;
    /// * each committed trajectory was counted in `inserts`;
    /// * a sampled row counts one sample on its trajectory; a row whose
    ///   copy was overwritten is drawn again, uncounted, at most
    ///   `MAX_COPY_ATTEMPTS - 1` times, so the times sampled add up to at
    ///   most `MAX_COPY_ATTEMPTS` per sampled row.
    fn check_against(&mut self, header: &Header, restored: u64) -> std::result::Result<(), String> {
        let mut sorted = std::mem::take(&mut self.seqs);
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("corrupted: two trajectories have insert sequence {}", w[0]));
        }
        let handed_out = header.next_seq - 1;
        if self.reuses > u128::from(handed_out) {
            return Err(format!(
                "corrupted: the slots' generations add up to {} reuses, but only {handed_out} trajectories were                  ever begun",
                self.reuses
            ));
        }
        if restored > header.inserts {
            return Err(format!(
                "corrupted: the file holds {restored} trajectories, but the header counts {} inserts",
                header.inserts
            ));
        }
        let most = u128::from(header.samples) * u128::from(crate::sampler::MAX_COPY_ATTEMPTS);
        if self.times_sampled > most {
            return Err(format!(
                "corrupted: the trajectories were sampled {} times in all, but the table sampled {} rows (each \
                 counts at most {} times)",
                self.times_sampled,
                header.samples,
                crate::sampler::MAX_COPY_ATTEMPTS
            ));
        }
        Ok(())
    }
}

/// The fewest times a slot was taken for writing if its current
/// generation is `generation`: generations start at 0, each take bumps
/// them by one, and they wrap at 2^32, so generation 0 of a committed
/// trajectory means 2^32 takes at least.
fn fewest_reuses(generation: u32) -> u64 {
    if generation == 0 {
        1 << 32
    } else {
        u64::from(generation)
    }
}

/// Restores one trajectory record of the data chunk being read into its
/// slot, refusing a record no table writes (see the checks below and
/// [`Records::check_against`]). Returns its data bytes.
fn restore_record<R: Read>(
    table: &ReplayTable,
    chunks: &mut ChunkReader<'_, R>,
    limits: ChunkLimits<'_>,
    header: &Header,
    records: &mut Records,
    prefault: Option<&Prefault>,
) -> Result<u64> {
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
    let capacity = records.seen.len();
    let Some(first) = records.seen.get_mut(slot as usize) else {
        return Err(bad(format!("corrupted: slot {slot} is beyond the capacity of {capacity}")));
    };
    if std::mem::replace(first, true) {
        return Err(bad(format!("corrupted: slot {slot} appears twice")));
    }
    let t = region.spec().max_len();
    if len == 0 || len > t {
        return Err(bad(format!(
            "corrupted: slot {slot} holds {len} steps; a committed trajectory holds 1 to T = {t}"
        )));
    }
    if insert_seq == 0 || insert_seq >= header.next_seq {
        return Err(bad(format!(
            "corrupted: slot {slot} has insert sequence {insert_seq}; the table had handed out 1 to {}",
            header.next_seq - 1
        )));
    }
    // The slot was taken at least `fewest_reuses` times, the last time by
    // this trajectory, whose sequence counts every take of any slot.
    if fewest_reuses(generation) > insert_seq {
        return Err(bad(format!(
            "corrupted: slot {slot} has generation {generation}, impossible for insert sequence {insert_seq} \
             (each insert takes one sequence and bumps one slot's generation)"
        )));
    }
    check_priority(priority).map_err(|e| bad(format!("corrupted: slot {slot}: {e}")))?;
    records.seqs.push(insert_seq);
    records.reuses += u128::from(fewest_reuses(generation));
    records.times_sampled += u128::from(times_sampled);
    let rec = region.slot(slot)?;
    rec.begin_restore(key, limits.owner, insert_seq, priority)?;
    if let Some(p) = prefault {
        p.reader.store(u64::from(slot), Ordering::Relaxed);
    }
    let mut total = 0u64;
    for (c, &s) in limits.step_bytes.iter().enumerate() {
        let n = s * len as usize;
        region.fill_steps(key, c, 0, n, |out| chunks.part(out))??;
        total += n as u64;
    }
    rec.publish_len(key, len)?;
    rec.commit(key)?;
    rec.set_times_sampled(key, times_sampled);
    Ok(total)
}
