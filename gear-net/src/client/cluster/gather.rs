//! The shard-gather draw: each shard gathers its rows' windows and sends
//! them in its reply, decoded straight into the caller's buffers.

use super::sample::{as_uninit, fill_sample_request, global_probability, refuses_the_request};
use super::{deadline_status, share_of, status, ClientCore};
use crate::client::assemble::{Assembly, Block, ColumnBase};
use crate::client::call::CallError;
use crate::client::concurrent::run_all;
use crate::client::masses::ShardMasses;
use crate::client::session::ShardLink;
use crate::client::weights::WeightNorm;
use crate::client::wire::{ReplyDecoder, ReplyMeta};
use crate::client::{BatchRows, ClusterSample, LostShard};
use crate::error::{Error, Result};
use crate::proto::SampleRequest;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use tokio::time::Instant;
use tonic::Code;

/// What one block of a cross-shard draw asked, for the rows it brings.
#[derive(Clone, Copy, Debug, Default)]
struct BlockAsk {
    shard: usize,
    rows: u64,
    /// The shard's mass and the total the split was made with.
    mass: f64,
    total: f64,
}

/// Buffers one `sample` call uses, kept between calls so that a trainer's
/// steady state allocates no batch-sized memory.
#[derive(Default)]
pub(super) struct SampleScratch {
    row_bytes: Vec<usize>,
    bases: Vec<ColumnBase>,
    blocks: Vec<Block>,
    /// Per block (by tag): what it asked, and its reply's fields.
    asks: Vec<BlockAsk>,
    metas: Vec<ReplyMeta>,
    /// Per block (by tag): its request, filled in place.
    requests: Vec<SampleRequest>,
    /// The blocks' calls as they end: tag and outcome.
    outcomes: Vec<(usize, std::result::Result<(), CallError>)>,
    counts: Vec<u64>,
    /// The blocks of a round that ended, and whether each came whole.
    settled: Vec<(usize, bool)>,
    /// The shards' masses the split is made by.
    masses: ShardMasses,
}

/// A scratch taken for one call, put back when the call ends or its
/// future is dropped.
struct ScratchGuard<'c> {
    core: &'c ClientCore,
    scratch: Option<SampleScratch>,
}

impl Drop for ScratchGuard<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            self.core.scratch.lock().push(s);
        }
    }
}

impl ClientCore {
    fn take_scratch(&self) -> ScratchGuard<'_> {
        let scratch = self.scratch.lock().pop().unwrap_or_default();
        ScratchGuard { core: self, scratch: Some(scratch) }
    }

    /// The shard-gather draw (the shards gather their rows' windows and
    /// send them in their replies) into `columns` (see the module doc).
    pub(super) async fn sample_gathered(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [MaybeUninit<u8>]],
        out: &mut BatchRows,
        deadline: Instant,
    ) -> Result<()> {
        let spec = self.cached_spec(deadline).await?;
        let mut guard = self.take_scratch();
        let scratch = guard.scratch.as_mut().ok_or_else(|| Error::Config("no scratch".into()))?;
        self.check_request(&spec, request, &mut scratch.row_bytes)?;
        let info_deadline = share_of(deadline, 1, 4);
        self.shard_masses(&mut scratch.masses, &mut out.lost, &mut out.rejoined, info_deadline).await?;
        let SampleScratch { row_bytes, bases, blocks, asks, metas, requests, outcomes, counts, settled, masses } =
            scratch;
        let ShardMasses { masses, mins, deterministic } = masses;
        let deterministic = *deterministic;
        let stocked = masses.iter().filter(|&&m| m > 0.0).count() + deterministic;
        if deterministic > 0 && stocked > 1 {
            return Err(Error::Unsupported(
                "a deterministic strategy (FIFO, LIFO, heap) cannot be merged exactly across shards; \
                 sample one shard with `sample_shard`"
                    .into(),
            ));
        }
        let one_shard = if deterministic == 1 {
            (0..self.shards.len()).find(|&s| masses[s] == 0.0 && !out.lost.iter().any(|l| l.shard == s))
        } else {
            None
        };
        // A deterministic strategy's own order and weights: the whole batch
        // from its shard.
        let beta = if one_shard.is_some() { 0.0 } else { self.beta(deadline).await? };
        let rows = request.rows as usize;
        let mut assembly = Assembly::new(columns, row_bytes, rows, bases, blocks).map_err(Error::Config)?;
        asks.clear();
        let mut remaining = request.rows;
        let mut norm = WeightNorm::default();
        let first_total: f64 = masses.iter().sum();
        if let Some(s) = one_shard {
            masses[s] = 1.0;
        }
        let masses: &mut Vec<f64> = masses;
        // A shard failing mid-draw gives its rows to the others.
        for _round in 0..self.shards.len() {
            let total: f64 = masses.iter().sum();
            if remaining == 0 {
                break;
            }
            if total <= 0.0 {
                return Err(Error::NoShard(format!("no shard holds items ({} lost: {:?})", out.lost.len(), out.lost)));
            }
            match one_shard {
                Some(s) => {
                    counts.clear();
                    counts.resize(masses.len(), 0);
                    counts[s] = remaining;
                }
                None => self.allocate(masses, remaining, counts),
            }
            let first_tag = asks.len();
            for (s, &n) in counts.iter().enumerate() {
                if n > 0 {
                    assembly.add_block(asks.len(), n as usize).map_err(|what| Error::Malformed { shard: s, what })?;
                    asks.push(BlockAsk { shard: s, rows: n, mass: masses[s], total });
                }
            }
            if metas.len() < asks.len() {
                metas.resize_with(asks.len(), ReplyMeta::default);
            }
            if requests.len() < asks.len() {
                requests.resize_with(asks.len(), SampleRequest::default);
            }
            // Three quarters of the time left: a shard cut off at its
            // deadline leaves time to draw its rows from the others.
            let round_deadline = share_of(deadline, 3, 4);
            let window = round_deadline.saturating_duration_since(Instant::now());
            let max_message_bytes = self.config.max_message_bytes;
            let calls =
                assembly.targets().zip(metas[first_tag..].iter_mut()).zip(requests[first_tag..].iter_mut()).map(
                    |(((tag, rows_mut), meta), req)| {
                        let ask = asks[tag];
                        let incarnation = self.incarnation_of(ask.shard);
                        fill_sample_request(req, &self.config.table, request, ask.rows, round_deadline, incarnation);
                        req.send_from_table = true;
                        let decoder = ReplyDecoder::new(rows_mut, meta, max_message_bytes);
                        let draw = self.draw_block(ask.shard, req, decoder);
                        async move {
                            let outcome = match tokio::time::timeout_at(round_deadline, draw).await {
                                Ok(r) => r,
                                Err(_) => Err(CallError::Status(deadline_status(window))),
                            };
                            (tag, outcome)
                        }
                    },
                );
            outcomes.clear();
            run_all(calls, outcomes).await;
            settled.clear();
            for (tag, outcome) in outcomes.drain(..) {
                let ask = asks[tag];
                let s = ask.shard;
                let failure = match outcome {
                    Ok(()) => {
                        settled.push((tag, true));
                        continue;
                    }
                    Err(CallError::Malformed(what)) => return Err(Error::Malformed { shard: s, what }),
                    // Only a reply sent from table memory may say so, and
                    // the second ask did not allow that.
                    Err(CallError::Overwritten { count, .. }) => {
                        let what = format!("{count} rows overwritten in a reply the shard was asked to gather");
                        return Err(Error::Malformed { shard: s, what });
                    }
                    Err(CallError::Status(e)) if refuses_the_request(&e) => return Err(status(s, e)),
                    Err(CallError::Status(e)) => e,
                };
                self.mark_lost(s, failure.message());
                out.lost.push(LostShard { shard: s, reason: format!("{}: {}", failure.code(), failure.message()) });
                masses[s] = 0.0;
                settled.push((tag, false));
            }
            // The replies that came whole (their fields are free to read
            // now that the calls are over).
            for &(tag, done) in settled.iter() {
                if done {
                    let (s, meta) = (asks[tag].shard, &metas[tag]);
                    self.check_meta(s, meta)?;
                    if self.mark_alive(s, meta.incarnation) {
                        out.rejoined.push(s);
                    }
                    self.note_mass(s, meta.incarnation, meta.size, meta.total_mass, meta.min_mass);
                    remaining -= asks[tag].rows;
                }
                assembly.settle(tag, done);
            }
            assembly.close_holes();
        }
        if remaining > 0 {
            return Err(Error::NoShard(format!("{remaining} rows could not be drawn; lost: {:?}", out.lost)));
        }
        // The normaliser: every shard's smallest probability, from its
        // reply where it was drawn from, else from its last report.
        for (s, (&mass, &min)) in masses.iter().zip(mins.iter()).enumerate() {
            if mass > 0.0 && !asks.iter().any(|a| a.shard == s) && first_total > 0.0 {
                norm.smallest_probability(min / first_total);
            }
        }
        for (tag, _) in assembly.placed_blocks() {
            let (ask, meta) = (asks[tag], &metas[tag]);
            if meta.total_mass > 0.0 {
                norm.smallest_probability(meta.min_mass / meta.total_mass * ask.mass / ask.total);
            }
        }
        for (tag, _) in assembly.placed_blocks() {
            let (ask, meta) = (asks[tag], &metas[tag]);
            out.keys.extend_from_slice(&meta.keys);
            out.lengths.extend_from_slice(&meta.lengths);
            out.starts.extend_from_slice(&meta.starts);
            if one_shard.is_some() {
                out.probabilities.extend_from_slice(&meta.probabilities);
                out.weights.extend_from_slice(&meta.weights);
                continue;
            }
            for &p in &meta.probabilities {
                let p = global_probability(p, ask.mass, ask.total);
                norm.row(p);
                out.probabilities.push(p);
            }
        }
        if one_shard.is_none() {
            out.weights.extend(out.probabilities.iter().map(|&p| norm.weight(p, beta)));
        }
        Ok(())
    }

    /// One block's draw from `shard` with `req` (which allows a reply sent
    /// from table memory), decoded by `decoder`, on a `SampleStream`
    /// session. If writers reused a row's slot while the shard sent it,
    /// the rows overwritten are drawn again, gathered (and so checked) by
    /// the shard before it sends them, or the whole block when the shard
    /// did not list them.
    async fn draw_block(
        &self,
        shard: usize,
        req: &mut SampleRequest,
        mut decoder: ReplyDecoder<'_>,
    ) -> std::result::Result<(), CallError> {
        let (mut link, kept) = self.shard_link(shard).await?;
        let mut outcome = link.sample(req, &mut decoder).await;
        // A kept session whose stream ended while it was kept (its
        // connection broke, or the shard stopped and restarted) fails
        // before the shard answered: once more, on a new session.
        if let ShardLink::Session(session) = &link {
            let broken_while_kept =
                kept && !session.in_step() && decoder.untouched() && matches!(&outcome, Err(CallError::Status(_)));
            if broken_while_kept {
                link = ShardLink::Session(self.open_session(shard).await?);
                outcome = link.sample(req, &mut decoder).await;
            }
        }
        let max_message_bytes = self.config.max_message_bytes;
        let outcome = match outcome {
            // Only some rows were overwritten: those are drawn again, the
            // rest stand.
            Err(CallError::Overwritten { rows, .. }) if !rows.is_empty() && rows.len() < req.rows as usize => {
                // Boxed: rare, and its future (a second reply's decoder
                // and buffers) would double every block's.
                Box::pin(redraw_rows(&mut link, req, &mut decoder, &rows, max_message_bytes)).await
            }
            Err(CallError::Overwritten { .. }) => Ok(false),
            Ok(()) => Ok(true),
            Err(e) => Err(e),
        };
        let outcome = match outcome {
            Ok(false) => {
                req.send_from_table = false;
                decoder.restart();
                link.sample(req, &mut decoder).await
            }
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        };
        if let ShardLink::Session(session) = link {
            self.keep_session(shard, session);
        }
        outcome
    }

    /// How a block's exchanges reach `shard`: a kept session (and `true`),
    /// a new one, or `Sample` calls where the shard does not serve
    /// `SampleStream` (a `Shard` service served without the shard
    /// server's routes), which is remembered.
    async fn shard_link(&self, shard: usize) -> std::result::Result<(ShardLink<'_>, bool), CallError> {
        let conn = &self.shards[shard];
        let calls = ShardLink::Calls { channel: &conn.channel, token: &self.token };
        if conn.calls_only.load(Ordering::Relaxed) {
            return Ok((calls, false));
        }
        match self.sample_session(shard).await {
            Ok((session, kept)) => Ok((ShardLink::Session(session), kept)),
            Err(CallError::Status(s)) if s.code() == Code::Unimplemented => {
                conn.calls_only.store(true, Ordering::Relaxed);
                Ok((calls, false))
            }
            Err(e) => Err(e),
        }
    }

    /// A decoded reply must come from the shard asked, its keys from the
    /// run it reports.
    fn check_meta(&self, shard: usize, meta: &ReplyMeta) -> Result<()> {
        if meta.shard as usize != shard
            || meta.keys.iter().any(|k| k.shard as usize != shard || k.incarnation != meta.incarnation)
        {
            return Err(Error::Malformed { shard, what: "keys name another shard or run".into() });
        }
        Ok(())
    }
}

/// After a reply sent from table memory whose rows `rows` (ascending, not
/// all of them) were overwritten while it was sent: draws as many rows
/// again from the shard, gathered (so checked before they are sent), and
/// puts them in their place in `decoder`'s block, as the gathered draw
/// puts a fresh draw in place of a torn row. `Ok(false)`: the reply cannot
/// stand in (the shard restarted meanwhile); ask for the whole block.
async fn redraw_rows(
    link: &mut ShardLink<'_>,
    req: &SampleRequest,
    decoder: &mut ReplyDecoder<'_>,
    rows: &[usize],
    max_message_bytes: usize,
) -> std::result::Result<bool, CallError> {
    decoder.finish().map_err(CallError::Malformed)?;
    let row_bytes = decoder.row_bytes().to_vec();
    let k = rows.len();
    let mut columns: Vec<Vec<u8>> = row_bytes.iter().map(|&rb| vec![0u8; rb * k]).collect();
    let mut meta = ReplyMeta::default();
    {
        let mut views: Vec<&mut [u8]> = columns.iter_mut().map(|c| &mut c[..]).collect();
        let uninit = as_uninit(&mut views);
        let (mut bases, mut blocks) = (Vec::new(), Vec::new());
        let mut assembly =
            Assembly::new(uninit, &row_bytes, k, &mut bases, &mut blocks).map_err(CallError::Malformed)?;
        assembly.add_block(0, k).map_err(CallError::Malformed)?;
        let Some((_, view)) = assembly.targets().next() else {
            return Err(CallError::Malformed("no block to draw the rows again into".into()));
        };
        let mut again = ReplyDecoder::new(view, &mut meta, max_message_bytes);
        let req = SampleRequest { rows: k as u64, send_from_table: false, ..req.clone() };
        link.sample(&req, &mut again).await?;
    }
    decoder.replace_rows(rows, &columns, &meta).map_err(CallError::Malformed)
}
