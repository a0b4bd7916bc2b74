//! Trainers sample batches of windows. A [`Sampler`] owns its batch buffers
//! and reuses them, so steady-state sampling allocates nothing.

use crate::error::{Error, Result};
use crate::table::ReplayTable;
use gear_core::{BatchLayout, Collector, DType, Element, GatherRow, Sampled, SlotKey, WindowSpec};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Attempts at copying a batch before giving up with [`Error::Torn`].
const MAX_COPY_ATTEMPTS: u32 = 16;

/// What a sampler draws.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleConfig {
    /// Columns to gather, by name; empty means every column.
    pub columns: Vec<String>,
    /// Rows per batch.
    pub batch_size: usize,
    /// Which steps of each trajectory fill a row.
    pub window: WindowSpec,
    /// How long a sample may wait for data or the rate limiter (`None`:
    /// forever).
    pub timeout: Option<Duration>,
}

impl SampleConfig {
    /// All columns, `batch_size` rows of `window`, waiting at most 10 s.
    pub fn new(batch_size: usize, window: WindowSpec) -> Self {
        SampleConfig { columns: Vec::new(), batch_size, window, timeout: Some(Duration::from_secs(10)) }
    }

    /// Only these columns.
    pub fn columns<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.columns = names.into_iter().map(Into::into).collect();
        self
    }

    /// Wait at most this long (`None`: forever).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }
}

/// One sampled batch: per column a `[rows, window, *shape]` buffer, the
/// valid length of each row, and per row the key, probability and
/// importance weight.
#[derive(Debug)]
pub struct SampledBatch {
    host: gear_cpu::HostBatch,
    names: Vec<String>,
    dtypes: Vec<DType>,
    shapes: Vec<Vec<u64>>,
    keys: Vec<SlotKey>,
    probabilities: Vec<f64>,
    weights: Vec<f64>,
}

/// One column of a batch.
#[derive(Clone, Copy, Debug)]
pub struct ColumnBatch<'a> {
    /// Column name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Per-step shape (the buffer is `[rows, window, *shape]`).
    pub step_shape: &'a [u64],
    /// The bytes.
    pub bytes: &'a [u8],
}

impl<'a> ColumnBatch<'a> {
    /// The buffer as typed elements; the type must match the dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::Config(format!("column `{}` holds {}, not {}", self.name, self.dtype, T::DTYPE)));
        }
        // A `bool` may only hold 0 or 1; the bytes may come from another
        // process, so check them rather than trust them.
        if T::DTYPE == DType::Bool {
            if let Some(i) = self.bytes.iter().position(|&b| b > 1) {
                return Err(Error::Integrity(format!(
                    "column `{}` byte {i} is {}, not a bool (0 or 1)",
                    self.name, self.bytes[i]
                )));
            }
        }
        let (head, body, tail) = {
            // SAFETY: `T: Element` is a primitive for which every bit pattern
            // of its size is a valid value, except `bool`, whose bytes were
            // checked to be 0 or 1 above; align_to only yields a correctly
            // aligned middle part.
            unsafe { self.bytes.align_to::<T>() }
        };
        if !head.is_empty() || !tail.is_empty() {
            return Err(Error::Config(format!("column `{}` buffer is not aligned for {}", self.name, T::DTYPE)));
        }
        Ok(body)
    }
}

impl SampledBatch {
    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.keys.len()
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Result<ColumnBatch<'_>> {
        let i = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| Error::Config(format!("column `{name}` was not requested by this sampler")))?;
        Ok(self.column_at(i))
    }

    /// The `i`-th requested column.
    pub fn column_at(&self, i: usize) -> ColumnBatch<'_> {
        ColumnBatch {
            name: &self.names[i],
            dtype: self.dtypes[i],
            step_shape: &self.shapes[i],
            bytes: self.host.column(i),
        }
    }

    /// Valid steps of each row.
    pub fn lengths(&self) -> &[u64] {
        self.host.lengths()
    }

    /// The key of each row (for priority updates).
    pub fn keys(&self) -> &[SlotKey] {
        &self.keys
    }

    /// The probability each row was drawn with.
    pub fn probabilities(&self) -> &[f64] {
        &self.probabilities
    }

    /// The importance-sampling weight of each row.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// The batch layout (columns, rows, window).
    pub fn layout(&self) -> &BatchLayout {
        self.host.layout()
    }
}

/// Draws batches from one table.
#[derive(Debug)]
pub struct Sampler {
    table: ReplayTable,
    batch: SampledBatch,
    /// A copy of the batch buffers' layout, borrowed while they are filled.
    layout: BatchLayout,
    timeout: Option<Duration>,
    draws: Vec<(Sampled, u64)>,
    redraws: Vec<(Sampled, u64)>,
    rows: Vec<GatherRow>,
    retiring: Vec<SlotKey>,
    /// Bytes of every column of one step, summed over requested columns.
    step_bytes: u64,
}

impl Sampler {
    pub(crate) fn new(table: ReplayTable, config: SampleConfig) -> Result<Self> {
        if config.batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        let spec = table.spec().clone();
        let columns: Vec<usize> = if config.columns.is_empty() {
            (0..spec.columns().len()).collect()
        } else {
            config.columns.iter().map(|n| spec.column_index(n)).collect::<gear_core::Result<_>>()?
        };
        let layout = BatchLayout::new(table.shared.region.layout(), &columns, config.batch_size, config.window)?;
        let host = table.shared.collector.alloc_batch(&layout)?;
        let cols = columns.iter().map(|&c| &spec.columns()[c]);
        let batch = SampledBatch {
            host,
            names: cols.clone().map(|c| c.name().to_owned()).collect(),
            dtypes: cols.clone().map(|c| c.dtype()).collect(),
            shapes: cols.map(|c| c.shape().to_vec()).collect(),
            keys: Vec::with_capacity(config.batch_size),
            probabilities: Vec::with_capacity(config.batch_size),
            weights: Vec::with_capacity(config.batch_size),
        };
        let step_bytes = layout.step_bytes.iter().sum();
        Ok(Sampler {
            table,
            batch,
            layout,
            timeout: config.timeout,
            draws: Vec::with_capacity(config.batch_size),
            redraws: Vec::new(),
            rows: Vec::with_capacity(config.batch_size),
            retiring: Vec::new(),
            step_bytes,
        })
    }

    /// Draws and gathers one batch. Waits (up to the timeout) while the
    /// table is empty or the rate limiter holds samplers back. Rows whose
    /// trajectory was evicted and overwritten during the copy are redrawn,
    /// so a returned batch never mixes two trajectories in a row.
    pub fn sample(&mut self) -> Result<&SampledBatch> {
        let n = self.layout.rows;
        self.draws.clear();
        self.retiring.clear();
        let result = self.sample_into(n);
        // Rows retired by max_times_sampled are freed only after the copy.
        self.table.retire(&self.retiring);
        result?;
        let b = &mut self.batch;
        b.keys.clear();
        b.probabilities.clear();
        b.weights.clear();
        for (s, _) in &self.draws {
            b.keys.push(s.key);
            b.probabilities.push(s.probability);
            b.weights.push(s.weight);
        }
        let valid: u64 = b.host.lengths().iter().sum();
        self.table.shared.region.control().bytes_gathered.fetch_add(valid * self.step_bytes, Ordering::Relaxed);
        Ok(&self.batch)
    }

    fn sample_into(&mut self, n: usize) -> Result<()> {
        self.table.select(n, self.timeout, true, &mut self.draws, &mut self.retiring)?;
        let sh = &*self.table.shared;
        self.rows.clear();
        self.rows.extend(self.draws.iter().map(|(s, len)| GatherRow { slot: s.key.slot, len: *len }));
        sh.collector.gather(&sh.region.view(), &self.rows, &self.layout, &mut self.batch.host)?;
        let mut torn = Vec::new();
        for attempt in 1..=MAX_COPY_ATTEMPTS {
            torn.clear();
            torn.extend((0..n).filter(|&r| {
                let key = self.draws[r].0.key;
                !sh.region.slots()[key.slot as usize].read_validate(key)
            }));
            if torn.is_empty() {
                return Ok(());
            }
            if attempt == MAX_COPY_ATTEMPTS {
                break;
            }
            self.redraws.clear();
            self.table.select(torn.len(), None, false, &mut self.redraws, &mut self.retiring)?;
            for (&r, d) in torn.iter().zip(&self.redraws) {
                self.draws[r] = *d;
                self.rows[r] = GatherRow { slot: d.0.key.slot, len: d.1 };
            }
            sh.collector.regather(&sh.region.view(), &self.rows, &self.layout, &torn, &mut self.batch.host)?;
        }
        Err(Error::Torn { attempts: MAX_COPY_ATTEMPTS })
    }

    /// The table this sampler draws from.
    pub fn table(&self) -> &ReplayTable {
        &self.table
    }
}
