//! The CPU device's bookkeeping: every allocation it handed out (live, or
//! freed and poisoned), and who used which bytes of it when, in
//! happens-before order.
//!
//! Ordering is tracked with vector clocks, one component per actor: the
//! host (component 0) and each stream. A stream's clock is its position in
//! program order joined with everything it was made to wait for: the host's
//! knowledge when work is queued (the host queued it after what it had
//! seen), and the clocks of the events it waits on. The host's clock grows
//! when it waits (an event, a stream, the device). An access conflicts with
//! an earlier one by another actor when either writes, their byte ranges
//! overlap, and the new actor's clock does not cover the earlier access:
//! nothing ordered the two, so on a GPU they could run in either order.
//!
//! The checks depend only on that order, never on timing: work that
//! happened to finish before a racing access is still reported, so a
//! missing event wait fails a test every run, not one run in a hundred.
//! A host access made inside a [`Device::host_fn`](gear_core::Device::host_fn)
//! counts as the stream's (it runs at that point of the stream).
//!
//! Registered host regions (the shared table) are checked for liveness
//! only: kernels read them while writer processes write them, which is the
//! table's seqlock protocol's business.

use gear_core::Access;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Actor 0 is the host; stream `i` (1-based) is actor `i`.
pub(crate) const HOST: usize = 0;

/// A vector clock, indexed by actor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Clock(Vec<u64>);

impl Clock {
    pub(crate) fn get(&self, actor: usize) -> u64 {
        self.0.get(actor).copied().unwrap_or(0)
    }

    fn set(&mut self, actor: usize, v: u64) {
        if self.0.len() <= actor {
            self.0.resize(actor + 1, 0);
        }
        self.0[actor] = v;
    }

    pub(crate) fn join(&mut self, other: &Clock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (a, &b) in self.0.iter_mut().zip(&other.0) {
            *a = (*a).max(b);
        }
    }

    fn tick(&mut self, actor: usize) -> u64 {
        let v = self.get(actor) + 1;
        self.set(actor, v);
        v
    }
}

/// What kind of memory an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Device,
    Pinned,
    /// A host region mapped in place: liveness is checked, accesses are not.
    Registered,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Device => "device buffer",
            Kind::Pinned => "pinned buffer",
            Kind::Registered => "registered region",
        }
    }
}

/// One access to an allocation: the latest by an actor, in a mode, over a
/// byte range (offsets into the allocation).
#[derive(Clone, Debug)]
struct Use {
    seq: u64,
    what: String,
}

/// Memory the device owns (device and pinned buffers): allocated with the
/// alignment the device promises, freed when the allocation leaves
/// quarantine.
pub(crate) struct RawMemory {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the memory is plain bytes owned by this value; access is
// synchronised by the device protocol (the tracker checks it).
unsafe impl Send for RawMemory {}

impl RawMemory {
    /// `len` (> 0) bytes aligned to `align`, every byte `fill`.
    pub(crate) fn new(len: u64, align: usize, fill: u8) -> Option<Self> {
        let layout = std::alloc::Layout::from_size_align(usize::try_from(len).ok()?, align).ok()?;
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size (checked).
        let ptr = std::ptr::NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        // SAFETY: `ptr` points to `layout.size()` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), fill, layout.size()) };
        Some(RawMemory { ptr, layout })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn poison(&mut self) {
        // SAFETY: the memory is owned and `layout.size()` bytes long; the
        // tracker poisons only after every use was checked (or reported).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), POISON, self.layout.size()) };
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The byte freed memory is filled with, so a read that slipped through
/// every check still shows garbage in the data it produced.
pub(crate) const POISON: u8 = 0xDB;

struct Allocation {
    id: u64,
    len: u64,
    kind: Kind,
    /// Set when freed: what freed it.
    freed: Option<String>,
    /// Owned memory (device and pinned kinds); dropped on release.
    memory: Option<RawMemory>,
    /// Latest use per (actor, mode, range start, range end).
    uses: HashMap<(usize, bool, u64, u64), Use>,
}

/// Bytes of freed allocations kept (poisoned) so late accesses are caught
/// as use after free rather than as stray addresses.
const QUARANTINE_BYTES: u64 = 256 << 20;

/// Everything the device tracks, behind one lock.
#[derive(Default)]
pub(crate) struct Tracker {
    /// Clock of the host (actor 0).
    host: Clock,
    /// Clock at the end of each stream's queue, by actor index.
    streams: Vec<Clock>,
    allocs: BTreeMap<u64, Allocation>,
    next_id: u64,
    quarantine: VecDeque<u64>,
    quarantined_bytes: u64,
    /// Every misuse found, in order.
    pub(crate) misuse: Vec<String>,
}

/// Who makes an access: the host, or a stream at a position with the
/// clock it had there.
#[derive(Clone, Debug)]
pub(crate) enum Actor {
    Host,
    Stream { actor: usize, seq: u64, clock: Clock },
}

/// One memory use an operation declares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Touch {
    pub(crate) addr: u64,
    /// Bytes from `addr`; `None`: to the end of the allocation.
    pub(crate) len: Option<u64>,
    pub(crate) access: Access,
}

impl Tracker {
    /// Adds a stream; returns its actor index.
    pub(crate) fn add_stream(&mut self) -> usize {
        if self.streams.is_empty() {
            self.streams.push(Clock::default()); // index 0: the host's slot, unused
        }
        self.streams.push(Clock::default());
        self.streams.len() - 1
    }

    /// Registers memory at `addr`; errors when it overlaps a live one.
    pub(crate) fn insert(&mut self, addr: u64, len: u64, kind: Kind, memory: Option<RawMemory>) -> Result<u64, String> {
        if let Some((&start, a)) = self.find_alloc(addr, len.max(1)) {
            if a.freed.is_none() {
                return Err(format!(
                    "{} at {addr:#x}+{len} overlaps {} #{} at {start:#x}+{} (already mapped)",
                    kind.name(),
                    a.kind.name(),
                    a.id,
                    a.len
                ));
            }
        }
        // A stale record of freed memory at the same start makes way.
        self.allocs.remove(&addr);
        self.next_id += 1;
        let id = self.next_id;
        self.allocs.insert(addr, Allocation { id, len, kind, freed: None, memory, uses: HashMap::new() });
        Ok(id)
    }

    /// The allocation overlapping `[addr, addr+len)` that starts last at or
    /// before `addr + len - 1`.
    fn find_alloc(&self, addr: u64, len: u64) -> Option<(&u64, &Allocation)> {
        let end = addr.saturating_add(len.max(1));
        self.allocs.range(..end).next_back().filter(|(&start, a)| start.saturating_add(a.len.max(1)) > addr)
    }

    fn locate(&self, addr: u64) -> Option<u64> {
        self.allocs
            .range(..=addr)
            .next_back()
            .filter(|(&start, a)| addr < start.saturating_add(a.len.max(1)))
            .map(|(&start, _)| start)
    }

    /// The clock a stream's next command will carry: its queue position
    /// joined with the host's knowledge (the host queues it after all it
    /// has seen). Advances the stream's position.
    pub(crate) fn enqueue(&mut self, actor: usize) -> (u64, Clock) {
        let host = self.host.clone();
        let c = &mut self.streams[actor];
        c.join(&host);
        let seq = c.tick(actor);
        (seq, c.clone())
    }

    /// The stream's clock now (what an event recorded there marks).
    pub(crate) fn stream_clock(&self, actor: usize) -> Clock {
        let mut c = self.streams[actor].clone();
        c.join(&self.host);
        c
    }

    /// A stream waits for what `mark` covers.
    pub(crate) fn stream_waits(&mut self, actor: usize, mark: &Clock) {
        self.streams[actor].join(mark);
    }

    /// The host has waited for everything `mark` covers.
    pub(crate) fn host_waited(&mut self, mark: &Clock) {
        self.host.join(mark);
    }

    /// Checks `touches` by `actor` and records them; returns the misuses
    /// found (the accesses are recorded either way).
    pub(crate) fn access(&mut self, actor: &Actor, touches: &[Touch], what: &str) -> Vec<String> {
        let (who, seq, clock) = match actor {
            Actor::Host => {
                let seq = self.host.tick(HOST);
                (HOST, seq, self.host.clone())
            }
            Actor::Stream { actor, seq, clock } => (*actor, *seq, clock.clone()),
        };
        let mut found = Vec::new();
        for t in touches {
            if t.addr == 0 {
                continue;
            }
            let Some(start) = self.locate(t.addr) else {
                found.push(format!("{what} uses address {:#x}, which lies in no allocation of this device", t.addr));
                continue;
            };
            let a = self.allocs.get_mut(&start).expect("located");
            let lo = t.addr - start;
            let hi = match t.len {
                Some(n) => lo.saturating_add(n),
                None => a.len,
            };
            if hi > a.len {
                found.push(format!("{what} uses bytes {lo}..{hi} of {} #{} ({} bytes)", a.kind.name(), a.id, a.len));
            }
            if let Some(freed) = &a.freed {
                found.push(format!("use after free: {what} uses {} #{} freed by {freed}", a.kind.name(), a.id));
                continue;
            }
            if a.kind == Kind::Registered {
                // Only so that unmapping it under a pending read is caught.
                let u = a.uses.entry((who, false, 0, a.len)).or_insert(Use { seq: 0, what: String::new() });
                u.seq = seq;
                u.what = what.to_owned();
                continue;
            }
            let write = t.access == Access::Write;
            for (&(other, other_write, s, e), u) in &a.uses {
                if other == who || !(write || other_write) || e <= lo || hi <= s {
                    continue;
                }
                if clock.get(other) < u.seq {
                    found.push(format!(
                        "{} of {} #{} bytes {lo}..{hi} by {what} is not ordered after the {} of bytes {s}..{e} by {}: \
                         a missing event wait or host synchronisation",
                        if write { "write" } else { "read" },
                        a.kind.name(),
                        a.id,
                        if other_write { "write" } else { "read" },
                        u.what
                    ));
                }
            }
            let u = a.uses.entry((who, write, lo, hi)).or_insert(Use { seq: 0, what: String::new() });
            u.seq = seq;
            u.what = what.to_owned();
        }
        self.misuse.extend(found.iter().cloned());
        found
    }

    /// Frees the allocation at `addr` (the host frees): every use must be
    /// ordered before (the host waited for it). Poisons it and keeps it in
    /// quarantine. Returns the misuses found.
    pub(crate) fn free(&mut self, addr: u64, what: &str) -> Vec<String> {
        let Some(a) = self.allocs.get_mut(&addr) else {
            let m = format!("{what}: address {addr:#x} was not allocated by this device");
            self.misuse.push(m.clone());
            return vec![m];
        };
        let mut found = Vec::new();
        if a.freed.is_some() {
            found.push(format!("{what}: {} #{} freed twice", a.kind.name(), a.id));
        }
        for (&(other, other_write, s, e), u) in &a.uses {
            if other != HOST && self.host.get(other) < u.seq {
                found.push(format!(
                    "{what} frees {} #{} while its {} of bytes {s}..{e} by {} may still run: the owner must wait \
                     for that work first",
                    a.kind.name(),
                    a.id,
                    if other_write { "write" } else { "read" },
                    u.what
                ));
            }
        }
        if a.kind == Kind::Registered {
            // The owner unmaps the host memory next, and the addresses may
            // be reused: keep no record that could shadow a later mapping.
            self.allocs.remove(&addr);
            self.misuse.extend(found.iter().cloned());
            return found;
        }
        a.freed = Some(what.to_owned());
        a.uses.clear();
        if let Some(m) = &mut a.memory {
            m.poison();
        }
        self.quarantine.push_back(addr);
        self.quarantined_bytes += a.len;
        while self.quarantined_bytes > QUARANTINE_BYTES {
            let Some(old) = self.quarantine.pop_front() else { break };
            if let Some(gone) = self.allocs.remove(&old) {
                self.quarantined_bytes -= gone.len;
            }
        }
        self.misuse.extend(found.iter().cloned());
        found
    }

    /// Whether `[addr, addr+len)` lies inside one live allocation, and
    /// which (for checks made while a kernel runs).
    pub(crate) fn live_range(&self, addr: u64, len: u64) -> Result<(u64, Kind), String> {
        let Some(start) = self.locate(addr) else {
            return Err(format!("address {addr:#x} lies in no allocation of this device"));
        };
        let a = &self.allocs[&start];
        if let Some(freed) = &a.freed {
            return Err(format!("use after free: {} #{} was freed by {freed}", a.kind.name(), a.id));
        }
        if addr - start + len > a.len {
            return Err(format!(
                "bytes {}..{} run past the end of {} #{} ({} bytes)",
                addr - start,
                addr - start + len,
                a.kind.name(),
                a.id,
                a.len
            ));
        }
        Ok((start, a.kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(addr: u64, access: Access) -> Touch {
        Touch { addr, len: None, access }
    }

    #[test]
    fn unordered_uses_conflict_and_event_waits_order_them() {
        let mut tr = Tracker::default();
        let (s1, s2) = (tr.add_stream(), tr.add_stream());
        let mem = RawMemory::new(64, 64, 0).unwrap();
        let addr = mem.addr();
        tr.insert(addr, 64, Kind::Device, Some(mem)).unwrap();
        let (seq, clock) = tr.enqueue(s1);
        assert!(tr.access(&Actor::Stream { actor: s1, seq, clock }, &[t(addr, Access::Write)], "a").is_empty());
        // A write on another stream with no wait: reported.
        let (seq, clock) = tr.enqueue(s2);
        let found = tr.access(&Actor::Stream { actor: s2, seq, clock }, &[t(addr, Access::Write)], "b");
        assert_eq!(found.len(), 1, "{found:?}");
        // After waiting on the first stream's clock: fine.
        let mark = tr.stream_clock(s1);
        tr.stream_waits(s2, &mark);
        let (seq, clock) = tr.enqueue(s2);
        assert!(tr.access(&Actor::Stream { actor: s2, seq, clock }, &[t(addr, Access::Read)], "c").is_empty());
        // The host reading before it waited: reported; after: fine.
        // (two unordered writes: one report each)
        assert_eq!(tr.access(&Actor::Host, &[t(addr, Access::Read)], "host read").len(), 2);
        let mark = tr.stream_clock(s2);
        tr.host_waited(&mark);
        assert!(tr.access(&Actor::Host, &[t(addr, Access::Read)], "host read").is_empty());
        // Reads do not conflict with reads.
        let (seq, clock) = tr.enqueue(s1);
        assert!(tr.access(&Actor::Stream { actor: s1, seq, clock }, &[t(addr, Access::Read)], "d").is_empty());
        // Freeing while that read is pending: reported, then use after free.
        let found = tr.free(addr, "drop");
        assert_eq!(found.len(), 1, "{found:?}");
        let (seq, clock) = tr.enqueue(s1);
        let found = tr.access(&Actor::Stream { actor: s1, seq, clock }, &[t(addr, Access::Read)], "e");
        assert!(found[0].starts_with("use after free"), "{found:?}");
    }

    #[test]
    fn disjoint_ranges_do_not_conflict() {
        let mut tr = Tracker::default();
        let (s1, s2) = (tr.add_stream(), tr.add_stream());
        let mem = RawMemory::new(64, 64, 0).unwrap();
        let addr = mem.addr();
        tr.insert(addr, 64, Kind::Device, Some(mem)).unwrap();
        let (seq, clock) = tr.enqueue(s1);
        let r = Touch { addr, len: Some(32), access: Access::Read };
        assert!(tr.access(&Actor::Stream { actor: s1, seq, clock }, &[r], "a").is_empty());
        let (seq, clock) = tr.enqueue(s2);
        let w = Touch { addr: addr + 32, len: Some(32), access: Access::Write };
        assert!(tr.access(&Actor::Stream { actor: s2, seq, clock: clock.clone() }, &[w], "b").is_empty());
        let w = Touch { addr: addr + 31, len: Some(2), access: Access::Write };
        assert_eq!(tr.access(&Actor::Stream { actor: s2, seq, clock }, &[w], "c").len(), 1);
    }
}
