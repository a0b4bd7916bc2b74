//! DQN-style transitions without storing a frame twice: episodes are
//! written step by step (the observation after the last action as a last
//! step), each transition is an item `[t, t + n]` of its episode
//! ([`ItemPattern::Transitions`](gear_core::ItemPattern::Transitions)), and
//! a [`TransitionSampler`] turns drawn items into the batch a DQN learner
//! expects:
//!
//! * `obs` `[B, k, *shape]` (`k` the frame stack; `[B, *shape]` when
//!   `k = 1`) and `next_obs` the same shape, strided views of the frames
//!   `t - k + 1 ..= t + n` gathered once per row (see gear-cpu's
//!   `TransitionCollector` for the layout and for the batches that keep
//!   `next_obs` apart);
//! * the step columns at `t` (the action), `[B, *shape]`;
//! * `reward`: the `n`-step discounted return, stopping after a terminal
//!   step; `done`; `discount`: `gamma^m` (`m` steps summed), 0 after a
//!   terminal step;
//! * keys (items'), probabilities and importance weights, as every batch.
//!
//! Frame stacks reaching before an episode's first step repeat that frame
//! (an episode starts at its trajectory's first step, or after a step whose
//! done flag is set).

use crate::error::{Error, Result};
use crate::sampler::{row_metadata, BatchMeta, ColumnBatch, Draws, Gather, SampleConfig};
use crate::table::ReplayTable;
use gear_core::{DType, WindowSpec};
pub use gear_cpu::{FrameView, TransitionBatch};
use gear_cpu::{TransitionCollector, TransitionColumns, TransitionLayout, TransitionRule};
use std::time::Duration;

/// What a [`TransitionSampler`] draws and how transitions are made.
#[derive(Clone, Debug, PartialEq)]
pub struct TransitionConfig {
    /// Rows per batch.
    pub batch_size: usize,
    /// Observation columns (frame-stacked; observed at `t` and at the end
    /// of the return).
    pub observations: Vec<String>,
    /// Columns read at `t` alone (the action, ...).
    pub step_columns: Vec<String>,
    /// The reward column (one element per step).
    pub reward: String,
    /// The done column (one element per step, non-zero after the
    /// episode's last action), if any: without one, returns stop only at
    /// the end of a trajectory, and it is never terminal.
    pub done: Option<String>,
    /// Frames per observation (`k`, default 1).
    pub frame_stack: u64,
    /// Steps of the return (`n`, default 1). Items longer than `n + 1`
    /// steps use their first `n + 1`.
    pub n_step: u64,
    /// Discount per step (default 0.99).
    pub gamma: f64,
    /// How long a sample may wait for data or the rate limiter.
    pub timeout: Option<Duration>,
}

impl TransitionConfig {
    /// Batches of `batch_size` transitions of observation column
    /// `observation`, action column `action` and reward column `reward`:
    /// one-step returns, no frame stack, gamma 0.99, no done column,
    /// waiting at most 10 s.
    pub fn new(
        batch_size: usize,
        observation: impl Into<String>,
        action: impl Into<String>,
        reward: impl Into<String>,
    ) -> Self {
        TransitionConfig {
            batch_size,
            observations: vec![observation.into()],
            step_columns: vec![action.into()],
            reward: reward.into(),
            done: None,
            frame_stack: 1,
            n_step: 1,
            gamma: 0.99,
            timeout: Some(Duration::from_secs(10)),
        }
    }

    /// The done column.
    pub fn done(mut self, column: impl Into<String>) -> Self {
        self.done = Some(column.into());
        self
    }

    /// Frames per observation.
    pub fn frame_stack(mut self, k: u64) -> Self {
        self.frame_stack = k;
        self
    }

    /// Steps of the return.
    pub fn n_step(mut self, n: u64) -> Self {
        self.n_step = n;
        self
    }

    /// Discount per step.
    pub fn gamma(mut self, gamma: f64) -> Self {
        self.gamma = gamma;
        self
    }

    /// Wait at most this long (`None`: forever).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Draws batches of transitions from a table with items (see the module
/// doc), with the table's strategy, rate limiter and validation as any
/// sampler.
#[derive(Debug)]
pub struct TransitionSampler {
    table: ReplayTable,
    draws: Draws,
    collector: TransitionCollector,
    /// The batch [`TransitionSampler::sample`] fills, allocated by its
    /// first call: a sampler used only through
    /// [`TransitionSampler::sample_into`] never holds one of its own.
    batch: Option<TransitionBatch>,
    meta: BatchMeta,
    /// Per observation column: name, dtype, per-step shape.
    observations: Vec<(String, DType, Vec<u64>)>,
    /// Per step column: name, dtype, per-step shape.
    step_columns: Vec<(String, DType, Vec<u64>)>,
}

impl ReplayTable {
    /// A sampler of DQN-style transitions over this table's items.
    pub fn transition_sampler(&self, config: TransitionConfig) -> Result<TransitionSampler> {
        TransitionSampler::new(self.clone(), config)
    }
}

impl TransitionSampler {
    fn new(table: ReplayTable, config: TransitionConfig) -> Result<Self> {
        table.shared.check_has_items("sample transitions")?;
        let spec = table.spec().clone();
        let index = |name: &str| spec.column_index(name).map_err(Error::from);
        let observations = config.observations.iter().map(|n| index(n)).collect::<Result<Vec<_>>>()?;
        let step_columns = config.step_columns.iter().map(|n| index(n)).collect::<Result<Vec<_>>>()?;
        let columns = TransitionColumns {
            observations: observations.clone(),
            step_columns: step_columns.clone(),
            reward: index(&config.reward)?,
            done: config.done.as_deref().map(index).transpose()?,
        };
        let rule = TransitionRule { frame_stack: config.frame_stack, n_step: config.n_step, gamma: config.gamma };
        let layout = TransitionLayout::new(&spec, columns.clone(), rule, config.batch_size)?;
        // The draw protocol's own batch layout: every column the rows read
        // and a window of the return's steps (its shape is the collector's).
        let mut names: Vec<String> = Vec::new();
        for c in columns.observations.iter().chain(&columns.step_columns).chain([&columns.reward]).chain(&columns.done)
        {
            let name = spec.columns()[*c].name().to_owned();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let sample = SampleConfig {
            columns: names,
            batch_size: config.batch_size,
            window: WindowSpec::first(config.n_step + 1),
            timeout: config.timeout,
            random_start: false,
        };
        let (draws, meta) = Draws::new(&table, &sample)?;
        let describe = |cs: &[usize]| {
            cs.iter()
                .map(|&c| {
                    let col = &spec.columns()[c];
                    (col.name().to_owned(), col.dtype(), col.shape().to_vec())
                })
                .collect()
        };
        Ok(TransitionSampler {
            observations: describe(&observations),
            step_columns: describe(&step_columns),
            table,
            draws,
            collector: TransitionCollector::new(layout),
            batch: None,
            meta,
        })
    }

    /// Draws and gathers one batch of transitions. Waits (up to the
    /// timeout) while the table is empty or the rate limiter holds
    /// samplers back; rows whose trajectory was evicted and overwritten
    /// during the copy are redrawn.
    pub fn sample(&mut self) -> Result<Transitions<'_>> {
        // Before drawing: a batch that cannot be allocated must not count
        // samples or retire rows.
        let mut batch = match self.batch.take() {
            Some(b) => b,
            None => TransitionBatch::new(self.collector.layout())?,
        };
        let drawn = self.draw(&mut batch);
        let batch = self.batch.insert(batch);
        drawn?;
        Ok(Transitions { batch, meta: &self.meta, observations: &self.observations, step_columns: &self.step_columns })
    }

    /// A zeroed batch of this sampler's layout, for
    /// [`TransitionSampler::sample_into`].
    pub fn new_batch(&self) -> Result<TransitionBatch> {
        Ok(TransitionBatch::new(self.collector.layout())?)
    }

    /// [`TransitionSampler::sample`] into `batch`, a batch the caller owns
    /// (from [`TransitionSampler::new_batch`]): bindings keep a pool of
    /// them, so a batch handed out stays valid while later ones are drawn
    /// and nothing is copied out of the sampler. Everything the returned
    /// [`Transitions`] shows is written by this call, whatever `batch` held.
    /// A batch made for another layout is refused before anything is
    /// drawn.
    pub fn sample_into<'a>(&'a mut self, batch: &'a mut TransitionBatch) -> Result<Transitions<'a>> {
        if batch.layout() != self.collector.layout() {
            return Err(Error::Config(
                "the transition batch was made for another layout than this sampler's (use new_batch)".into(),
            ));
        }
        self.draw(batch)?;
        Ok(Transitions { batch, meta: &self.meta, observations: &self.observations, step_columns: &self.step_columns })
    }

    /// The draw -> gather -> validate -> redraw protocol, into `batch`.
    fn draw(&mut self, batch: &mut TransitionBatch) -> Result<()> {
        let sh = &*self.table.shared;
        let mut copy = Gather { collector: &self.collector, view: sh.region.view(), batch };
        self.draws.sample(&self.table, &mut copy, &mut self.meta)
    }

    /// The table this sampler draws from.
    pub fn table(&self) -> &ReplayTable {
        &self.table
    }
}

/// One batch of transitions (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Transitions<'a> {
    batch: &'a TransitionBatch,
    meta: &'a BatchMeta,
    observations: &'a [(String, DType, Vec<u64>)],
    step_columns: &'a [(String, DType, Vec<u64>)],
}

/// An observation column of a transition batch: a strided view of the
/// frames gathered for the batch.
#[derive(Clone, Copy, Debug)]
pub struct Observations<'a> {
    /// Column name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape of one frame.
    pub frame_shape: &'a [u64],
    /// Where the frames are: row `r`'s stack is `view.row(r)`.
    pub view: FrameView<'a>,
}

impl Observations<'_> {
    /// The batch's logical shape: `[rows, k, *frame]`, or `[rows,
    /// *frame]` without a frame stack (`k = 1`).
    pub fn shape(&self) -> Vec<u64> {
        let mut s = vec![self.view.rows as u64];
        if self.view.frames > 1 {
            s.push(self.view.frames as u64);
        }
        s.extend_from_slice(self.frame_shape);
        s
    }

    /// Byte strides of [`Observations::shape`]'s axes (rows, then frames
    /// when stacked, then the frame's own, C order), for a strided array
    /// over [`FrameView::bytes`] from [`FrameView::offset`].
    pub fn strides(&self) -> Vec<u64> {
        let mut s = vec![self.view.row_stride as u64];
        if self.view.frames > 1 {
            s.push(self.view.frame_bytes as u64);
        }
        let mut inner = Vec::with_capacity(self.frame_shape.len());
        let mut acc = self.dtype.size();
        for d in self.frame_shape.iter().rev() {
            inner.push(acc);
            acc *= d;
        }
        s.extend(inner.into_iter().rev());
        s
    }
}

impl<'a> Transitions<'a> {
    row_metadata!();

    fn observation_index(&self, name: &str) -> Result<usize> {
        self.observations
            .iter()
            .position(|(n, ..)| n == name)
            .ok_or_else(|| Error::Config(format!("column `{name}` is not an observation column of this sampler")))
    }

    fn observations_of(&self, i: usize, view: FrameView<'a>) -> Observations<'a> {
        let (name, dtype, shape) = &self.observations[i];
        Observations { name, dtype: *dtype, frame_shape: shape, view }
    }

    /// The observations (stacks at `t`) of column `name`.
    pub fn obs(&self, name: &str) -> Result<Observations<'a>> {
        let i = self.observation_index(name)?;
        Ok(self.observations_of(i, self.batch.observation(i)))
    }

    /// The next observations (stacks at `t + m`) of column `name`.
    pub fn next_obs(&self, name: &str) -> Result<Observations<'a>> {
        let i = self.observation_index(name)?;
        Ok(self.observations_of(i, self.batch.next_observation(i)))
    }

    /// Step column `name` at each row's `t`, `[rows, *shape]`.
    pub fn column(&self, name: &str) -> Result<ColumnBatch<'a>> {
        let j = self
            .step_columns
            .iter()
            .position(|(n, ..)| n == name)
            .ok_or_else(|| Error::Config(format!("column `{name}` is not a step column of this sampler")))?;
        let (name, dtype, shape) = &self.step_columns[j];
        Ok(ColumnBatch { name, dtype: *dtype, step_shape: shape, bytes: self.batch.column(j) })
    }

    /// Each row's `n`-step discounted return.
    pub fn rewards(&self) -> &'a [f32] {
        self.batch.rewards()
    }

    /// Whether each row's return ended at a terminal step.
    pub fn dones(&self) -> &'a [bool] {
        self.batch.dones()
    }

    /// Each row's bootstrap factor: `gamma^m`, 0 after a terminal step.
    pub fn discounts(&self) -> &'a [f32] {
        self.batch.discounts()
    }

    /// Steps each row's return sums (`m`, at most `n`).
    pub fn n_steps(&self) -> &'a [u64] {
        self.batch.n_steps()
    }

    /// Whether this batch's next observations are in a buffer of their own
    /// (a row's return stopped short of `n` steps with `n` smaller than
    /// the frame stack), rather than a view of the observations' frames.
    pub fn next_is_separate(&self) -> bool {
        self.batch.next_is_separate()
    }

    /// The gathered batch, for bindings that expose its buffers.
    pub fn batch(&self) -> &'a TransitionBatch {
        self.batch
    }
}
