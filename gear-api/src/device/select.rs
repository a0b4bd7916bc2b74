//! Selection on the device for a [`DeviceSampler`](super::DeviceSampler):
//! when the table's strategy names a [`gear_core::SelectionRule`] (uniform,
//! prioritized, max-heap top-k, or gear-device's device strategies),
//! batches are drawn by kernel from a device mirror of the table's slots
//! and gathered without the draw leaving the device (gear-device's
//! `gather_drawn`).
//!
//! Protocol of one batch: the table lock admits and counts the batch (rate
//! limiter, as a host draw) and lists the slots the change log touched
//! since this mirror's cursor ([`ReplayTable::admit_device_draw`]), so an
//! update from any process reaches the device before the draw; only those
//! slots are written. Draw, row tables and gather are queued on the
//! collector's stream; the rows' keys, lengths, probabilities and weights
//! come back in page-locked memory with the batch. Right after the gather,
//! a host function on the stream checks every row against its slot
//! generation; the host then redraws the rows that were torn, drawn by
//! nothing (nothing drawable on the device, e.g. every priority zero) or
//! no longer readable when copied, gathering only those rows again
//! (`Draws::adopt`, then the shared `Draws::finish`).
//!
//! The host selects instead (the ordinary `Draws` path) when the strategy
//! names no rule (FIFO, LIFO, min-heap, user strategies), when the table has
//! `max_times_sampled` or samples trajectories still being written, when
//! the sampler has a device cache (the device path reads rows zero-copy
//! only), or when [`DeviceSamplerOptions::host_selection`](super::DeviceSamplerOptions::host_selection)
//! asks for it.

use super::device_error;
use crate::error::Result;
use crate::table::{DeviceCursor, DeviceSlot, ReplayTable};
use gear_core::{DeviceApi, RandomSource, Sampled, TableView, Xoshiro256};
use gear_device::{DeviceBatch, DeviceCollector, DeviceSlots, DrawnKeys, DrawnRows, SlotUpdate};
use std::time::Instant;

/// A sampler's device mirror of the table's slots and per-batch draw
/// buffers.
pub(super) struct DeviceSelection<A: DeviceApi> {
    slots: DeviceSlots<A>,
    /// One per batch of the ring.
    drawn: Vec<DrawnRows<A>>,
    cursor: DeviceCursor,
    changed: Vec<DeviceSlot>,
    updates: Vec<SlotUpdate>,
    /// Seeds of the draws and of random starts.
    rng: Xoshiro256,
    random_start: bool,
    /// Per batch of the ring: drawn on the device and not yet adopted.
    in_flight: Vec<bool>,
    /// Batches drawn on the device so far.
    batches: u64,
}

impl<A: DeviceApi> std::fmt::Debug for DeviceSelection<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSelection").field("batches", &self.batches).finish()
    }
}

impl<A: DeviceApi> DeviceSelection<A> {
    /// A mirror for `table` (empty until the first batch fills it) on the
    /// collector's stream, with draw buffers for a ring of `ring` batches
    /// of `rows` rows.
    pub(super) fn new(
        device: &A::Device,
        collector: &DeviceCollector<A>,
        table: &ReplayTable,
        ring: usize,
        rows: usize,
        seed: u64,
        random_start: bool,
    ) -> Result<Self> {
        let spec = table.spec();
        let slots = DeviceSlots::<A>::new(device, collector.stream().clone(), spec.capacity(), spec.max_len())
            .map_err(device_error)?;
        let drawn = (0..ring)
            .map(|_| DrawnRows::<A>::new(device, rows))
            .collect::<Result<Vec<_>, _>>()
            .map_err(device_error)?;
        Ok(DeviceSelection {
            slots,
            drawn,
            cursor: DeviceCursor::default(),
            changed: Vec::new(),
            updates: Vec::new(),
            rng: Xoshiro256::seed_from_u64(seed ^ 0xc0da_5e1e_c7ed_0001),
            random_start,
            in_flight: vec![false; ring],
            batches: 0,
        })
    }

    /// Batches drawn on the device so far.
    pub(super) fn batches(&self) -> u64 {
        self.batches
    }

    /// Admits batch `i` and queues its draw and gather into `batch`.
    /// `Ok(false)`: the host must select this batch (nothing admitted).
    pub(super) fn start(
        &mut self,
        table: &ReplayTable,
        collector: &DeviceCollector<A>,
        view: &TableView<'_>,
        i: usize,
        batch: &mut DeviceBatch<A>,
        deadline: Option<Instant>,
    ) -> Result<bool> {
        self.in_flight[i] = false;
        self.changed.clear();
        let rows = batch.layout().rows();
        let Some(rule) = table.admit_device_draw(rows, deadline, &mut self.cursor, &mut self.changed)? else {
            return Ok(false);
        };
        self.updates.clear();
        self.updates.extend(self.changed.iter().map(|c| SlotUpdate {
            slot: c.slot,
            key: c.key,
            priority: c.priority,
            len: c.len,
        }));
        let seed = self.rng.next_u64();
        let random_start = self.random_start.then(|| self.rng.next_u64());
        let queued = self.slots.sync(rule, &self.updates).and_then(|()| {
            collector.gather_drawn(view, &mut self.slots, rule, seed, random_start, &mut self.drawn[i], batch)
        });
        if let Err(e) = queued {
            // Nothing was drawn: the batch goes back to the rate limiter,
            // and since the device arrays may have missed this sync, the
            // next batch describes and writes every slot again.
            table.unadmit_device_draw(rows);
            self.cursor = DeviceCursor::default();
            return Err(device_error(e));
        }
        self.in_flight[i] = true;
        self.batches += 1;
        Ok(true)
    }

    /// Whether batch `i` was drawn on the device and awaits [`Self::adopt`].
    pub(super) fn is_in_flight(&self, i: usize) -> bool {
        self.in_flight[i]
    }

    /// The rows' host copy of batch `i`, for the check queued behind its
    /// gather.
    pub(super) fn keys_handle(&self, i: usize, capacity: u64) -> DrawnKeys<A> {
        self.drawn[i].keys_handle(capacity)
    }

    /// Waits for batch `i` and hands its rows to `draws` for validation:
    /// `checked` (per row, whether its slot held its key when the copy
    /// completed) when that check ran; redraws share `deadline`.
    pub(super) fn adopt(
        &mut self,
        table: &ReplayTable,
        i: usize,
        batch: &mut DeviceBatch<A>,
        draws: &mut crate::sampler::Draws,
        deadline: Option<Instant>,
        checked: Option<Vec<bool>>,
    ) -> Result<()> {
        if !std::mem::take(&mut self.in_flight[i]) {
            return Ok(());
        }
        let rows = self.drawn[i].read_back(batch, table.spec().capacity()).map_err(device_error)?;
        draws.adopt(
            table,
            deadline,
            rows.iter()
                .map(|r| r.key.map(|key| (Sampled { key, probability: r.probability, weight: r.weight }, r.len))),
            checked,
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::{Draws, Gather};
    use crate::table::ReplayTable;
    use crate::{SampleConfig, StepValue};
    use gear_core::{Collector, ColumnSpec, DType, GatherRow, Sampled, SlotKey, TableSpec, WindowSpec};
    use gear_sampler::{StrategyKind, StrategyParams};

    /// The host half of a device batch, with the CPU collector standing in
    /// for the GPU: rows drawn elsewhere are adopted and the shared
    /// `Draws::finish` keeps the valid ones as drawn (probability, weight,
    /// length) and redraws on the host, gathering again, exactly the rows
    /// drawn by nothing, whose key went stale, or whose bytes were
    /// overwritten after the copy.
    #[test]
    fn adopted_rows_keep_their_draws_and_bad_rows_are_redrawn_on_the_host() {
        let spec = TableSpec::new(vec![ColumnSpec::new("x", DType::I32, [])], 4, 6).unwrap();
        let table = ReplayTable::builder(spec)
            .sampler_kind(StrategyKind::Prioritized, StrategyParams::default())
            .remover_kind(StrategyKind::Fifo)
            .build()
            .unwrap();
        let write = |id: u32| {
            let mut tr = table.writer().begin(Some(1.0)).unwrap();
            for s in 0..3u32 {
                tr.append_step(&[StepValue::typed(&[(id * 100 + s) as i32])]).unwrap();
            }
            tr.end().unwrap()
        };
        let keys: Vec<SlotKey> = (0..6).map(write).collect();
        let (mut draws, mut meta) = Draws::new(&table, &SampleConfig::new(5, WindowSpec::last(2))).unwrap();
        let sh = &*table.shared;
        let mut batch = sh.collector.alloc_batch(&draws.layout).unwrap();
        let drawn = |k: SlotKey, p: f64| Some((Sampled { key: k, probability: p, weight: 0.5 }, 3));
        // Row 3's key is made stale before adoption; row 4 is overwritten
        // after its bytes were copied (a torn read).
        let stale = SlotKey { generation: keys[2].generation + 7, ..keys[2] };
        let rows = vec![drawn(keys[0], 0.25), None, drawn(keys[1], 0.125), drawn(stale, 0.5), drawn(keys[0], 0.25)];
        let sampled_before = sh.region.slots()[keys[0].slot as usize].meta(keys[0].slot).times_sampled;
        draws.adopt(&table, None, rows.into_iter(), None).unwrap();
        let gather_rows: Vec<GatherRow> =
            [keys[0], keys[0], keys[1], keys[0], keys[0]].iter().map(|k| GatherRow::whole(k.slot, 3)).collect();
        sh.collector.gather(&sh.region.view(), &gather_rows, &draws.layout, &mut batch).unwrap();
        // Evicting the oldest (keys[0]) through a new insert tears rows 0 and 4.
        let newest = write(9);
        let mut copy = Gather { collector: &sh.collector, view: sh.region.view(), batch: &mut batch };
        draws.finish(&table, &mut copy, &mut meta).unwrap();
        assert_eq!(meta.keys[2], keys[1], "a valid row is kept");
        assert_eq!((meta.probabilities[2], meta.weights[2]), (0.125, 0.5), "with the device's draw");
        for r in [0, 1, 3, 4] {
            let k = meta.keys[r];
            assert!(k != keys[0] && k != stale, "row {r} was redrawn: {k}");
            assert!(keys[1..].contains(&k) || k == newest, "row {r}: {k} is held");
        }
        // Every row holds its trajectory's last two steps.
        let x = batch.column(0);
        let ids: Vec<u32> = (0..6).map(|i| if i == 0 { 9 } else { i }).collect();
        for r in 0..5 {
            let k = meta.keys[r];
            let id = if k == newest { 9 } else { keys.iter().position(|&q| q == k).unwrap() as u32 };
            assert!(ids.contains(&id));
            let got = [
                i32::from_le_bytes(x[8 * r..][..4].try_into().unwrap()) as u32,
                i32::from_le_bytes(x[8 * r + 4..][..4].try_into().unwrap()) as u32,
            ];
            assert_eq!(got, [id * 100 + 1, id * 100 + 2], "row {r} ({k})");
        }
        let sampled_after = sh.region.slots()[keys[1].slot as usize].meta(keys[1].slot).times_sampled;
        assert!(sampled_after >= 1, "adopted rows count as sampled");
        assert_eq!(sampled_before, 0);
    }
}
