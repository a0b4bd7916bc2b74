//! The registration of a table's memory with a device, shared by every
//! device sampler of the table in this process.

use super::device_error;
use crate::error::{Error, Result};
use crate::table::ranges::TableMemory;
use crate::table::ReplayTable;
use gear_core::{Device, DeviceApi, MemoryRegion, TableView};
use std::any::{Any, TypeId};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// A table's memory registered with one device, shared by the table's
/// device samplers in this process.
pub(super) struct Mapping<A: DeviceApi> {
    /// Unregistered when the last [`MappingShare`] goes.
    pub(super) region: A::Registered<TableMemory>,
    /// The registration's own table handle (the one `region` keeps open).
    pub(super) table: ReplayTable,
    pub(super) device: A::Device,
}

/// Live registrations of this process: host address of the table region,
/// the device API, the mapping (a `Mapping<A>` of that API).
type MappingEntry = (usize, TypeId, Weak<dyn Any + Send + Sync>);
static MAPPINGS: Mutex<Vec<MappingEntry>> = Mutex::new(Vec::new());

fn mappings() -> MutexGuard<'static, Vec<MappingEntry>> {
    // The list stays consistent whatever panicked while holding it.
    MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One sampler's share of a [`Mapping`]. Dropped with the registry locked,
/// so a sampler being created meanwhile either finds the registration alive
/// or registers after it was undone (registering a range twice fails).
pub(super) struct MappingShare<A: DeviceApi>(Option<Arc<Mapping<A>>>);

impl<A: DeviceApi> MappingShare<A> {
    /// Shares `table`'s registration with `device`, registering the table's
    /// memory first when no sampler of this process has.
    pub(super) fn for_table(table: &ReplayTable, device: &A::Device) -> Result<Self> {
        let base = table.shared.region.region().host_ptr().map_or(0, |p| p.as_ptr() as usize);
        let mut map = mappings();
        map.retain(|(_, _, m)| m.strong_count() > 0);
        let same_table = |m: &Arc<Mapping<A>>| Arc::ptr_eq(&m.table.shared, &table.shared);
        let found = map
            .iter()
            .filter(|(b, api, _)| *b == base && *api == TypeId::of::<A>())
            .filter_map(|(_, _, m)| m.upgrade()?.downcast::<Mapping<A>>().ok())
            .find(same_table);
        if let Some(m) = found {
            if m.device.ordinal() != device.ordinal() {
                return Err(Error::Config(format!(
                    "{} device {} requested, but this process already mapped the table for device {}; a process \
                     maps a table for one device",
                    A::NAME,
                    device.ordinal(),
                    m.device.ordinal()
                )));
            }
            return Ok(MappingShare(Some(m)));
        }
        let region = device.register(TableMemory::new(table.clone())).map_err(device_error)?;
        let m = Arc::new(Mapping { region, table: table.clone(), device: device.clone() });
        let any: Arc<dyn Any + Send + Sync> = m.clone();
        map.push((base, TypeId::of::<A>(), Arc::downgrade(&any)));
        Ok(MappingShare(Some(m)))
    }

    pub(super) fn get(&self) -> &Mapping<A> {
        self.0.as_ref().expect("a mapping share holds its mapping until dropped")
    }

    /// The table's data area with its host and its device address.
    pub(super) fn view(&self) -> TableView<'_> {
        let m = self.get();
        let region = &m.table.shared.region;
        let mapped = m.region.device_ptr().expect("a registered region has a device address");
        let device = mapped + region.region_layout().data_offset;
        // SAFETY: `data_ptr()` is the table's data area, `layout.total_bytes()`
        // readable bytes inside the region (TableRegion checked the sizes at
        // create/open), alive as long as the table `m` holds. `device` is the
        // device address of the same first byte: `m.region` registered that
        // very region (all of it), so it maps as many bytes, and stays
        // registered while `m` lives, which outlives every gather queued
        // through the view (the sampler waits for its batches before the
        // share goes).
        unsafe { TableView::new(Some(region.data_ptr()), Some(device), region.layout()) }
    }
}

impl<A: DeviceApi> Drop for MappingShare<A> {
    fn drop(&mut self) {
        let mut map = mappings();
        drop(self.0.take());
        map.retain(|(_, _, m)| m.strong_count() > 0);
    }
}
