//! Waits: a writer's or sampler's wait until its limit allows it, listed
//! in the control block while it lasts, and the list of the waits now.

use super::{Locked, WAIT_SLICE};
use crate::error::{Error, Result};
use crate::table::ReplayTable;
use gear_core::{WaitReason, WaitRole};
use gear_cpu::sync::{futex_wait, wait_warning_after, WaitListing};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What a wait in [`ReplayTable::wait_until`] waits for, and so where it
/// is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::table) enum LimiterWait {
    /// A writer admitted by the rate limiter.
    Insert,
    /// A sampler admitted by the rate limiter, or waiting for items.
    Sample,
}

/// What a writer's or sampler's wait is: the operation named in a timeout,
/// the role and limit it is listed with, and the counters its time adds to.
pub(in crate::table) struct WaitFor<R> {
    /// The operation, as a timeout names it ("insert (rate limiter)").
    pub(in crate::table) op: &'static str,
    pub(in crate::table) role: WaitRole,
    /// Which limit holds the caller back, read under the lock at each turn.
    pub(in crate::table) reason: R,
    /// Which totals the time waited adds to: the control block's (every
    /// process) and this process's (`ReplayTable::wait_stats`).
    pub(in crate::table) kind: LimiterWait,
}

impl ReplayTable {
    /// Waits until `ready` holds, the table closes, the server dies or the
    /// deadline passes; adds the time waited to `what.kind`'s totals. While it
    /// waits the wait is listed in the control block (for `info()` in every
    /// process) and, past [`wait_warning_after`], logged as a warning that
    /// names the limit and its counters.
    pub(in crate::table) fn wait_until<'a>(
        &'a self,
        mut l: Locked<'a>,
        deadline: Option<Instant>,
        what: WaitFor<impl Fn(&Locked<'_>) -> WaitReason>,
        ready: impl Fn(&Locked<'_>) -> bool,
    ) -> Result<Locked<'a>> {
        let sh = &*self.shared;
        let ctl = sh.region.control();
        if ctl.closed.load(Ordering::Acquire) == 0 && ready(&l) {
            return Ok(l);
        }
        let start = Instant::now();
        let mut listing = WaitListing::begin(ctl, &sh.lease, what.role, (what.reason)(&l), Duration::ZERO);
        let mut warn_at = wait_warning_after();
        // Every process's waits add up in the control block; this
        // process's are counted apart too (`ReplayTable::wait_stats`).
        let (waited, local) = match what.kind {
            LimiterWait::Insert => (&ctl.insert_wait_ns, &sh.waits.insert),
            LimiterWait::Sample => (&ctl.sample_wait_ns, &sh.waits.sample),
        };
        let result = loop {
            if ctl.closed.load(Ordering::Acquire) != 0 {
                break Err(Error::Closed);
            }
            if ready(&l) {
                break Ok(());
            }
            let server = u32::try_from(ctl.server.load(Ordering::Relaxed)).unwrap_or(0);
            if !sh.creator && !sh.lease.is_alive(server, ctl) {
                break Err(Error::ServerGone { name: self.name().unwrap_or("?").to_owned() });
            }
            l.maybe_reap()?;
            if ready(&l) {
                break Ok(());
            }
            let reason = (what.reason)(&l);
            listing.set_reason(reason);
            let now = Instant::now();
            if let Some(after) = warn_at.filter(|a| now - start >= *a) {
                tracing::warn!("{}", self.wait_warning(&l, what.role, reason, now - start));
                // Then again at 4, 16, ... times the threshold.
                warn_at = Some(after * 4);
            }
            if deadline.is_some_and(|d| now >= d) {
                break Err(Error::Timeout { op: what.op, waited: start.elapsed(), holder: None });
            }
            let slice = deadline.map_or(WAIT_SLICE, |d| (d - now).min(WAIT_SLICE));
            let seen = ctl.epoch.load(Ordering::Acquire);
            ctl.waiters.fetch_add(1, Ordering::AcqRel);
            drop(l);
            futex_wait(&ctl.epoch, seen, Some(slice));
            ctl.waiters.fetch_sub(1, Ordering::AcqRel);
            let relocked = sh.lock(deadline);
            l = match relocked {
                Ok(l) => l,
                Err(e) => {
                    let elapsed = start.elapsed();
                    waited.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
                    local.record(elapsed);
                    return Err(e);
                }
            };
        };
        drop(listing);
        let elapsed = start.elapsed();
        let ns = elapsed.as_nanos() as u64;
        if ns > 1000 {
            waited.fetch_add(ns, Ordering::Relaxed);
        }
        // Not ready at the first look: a wait, however short.
        local.record(elapsed);
        result.map(|()| l)
    }

    /// The warning logged when a wait lasts: who waits, on which limit,
    /// the counters that keep it waiting, and what usually ends it.
    fn wait_warning(&self, l: &Locked<'_>, role: WaitRole, reason: WaitReason, waited: Duration) -> String {
        let table = self.name().map_or_else(|| "a process-private table".to_owned(), |n| format!("table `{n}`"));
        let ctl = l.ctl();
        let rl = l.limiter();
        let size = ctl.size.load(Ordering::Relaxed);
        let cfg = rl.config;
        let why = match reason {
            WaitReason::MinSize => format!(
                "min size: the table holds {size} trajectories and the rate limiter's min_size_to_sample is {}; \
                 sampling starts once writers have committed that many. Is a writer running?",
                cfg.min_size_to_sample
            ),
            WaitReason::SamplesPerInsert if role == WaitRole::Writer => format!(
                "samples per insert: the rate limiter holds inserts until samplers catch up ({} inserts, {} \
                 samples, samples_per_insert {}: one more insert would take inserts * samples_per_insert - \
                 samples to {:.1}, above max_diff {:.1}). Is a sampler running?",
                rl.inserts,
                rl.samples,
                cfg.samples_per_insert,
                rl.error() + cfg.samples_per_insert,
                cfg.max_diff
            ),
            WaitReason::SamplesPerInsert => format!(
                "samples per insert: the rate limiter holds sampling until writers insert more ({} inserts, {} \
                 samples, samples_per_insert {}: inserts * samples_per_insert - samples is {:.1} and a batch may \
                 not take it below min_diff {:.1}). Is a writer running?",
                rl.inserts,
                rl.samples,
                cfg.samples_per_insert,
                rl.error(),
                cfg.min_diff
            ),
            WaitReason::FullTable => format!(
                "full table: {} trajectories are stored unsampled, the most the table's queue holds, and each \
                 must be sampled before another goes in. Is a sampler running?",
                rl.error().max(0.0) as u64
            ),
            WaitReason::EmptyTable => {
                "empty table: it emptied while a batch was redrawn. Is a writer running?".to_owned()
            }
            WaitReason::TableLock => "the table lock.".to_owned(),
        };
        format!(
            "a {} (process {}) has waited {:.1} s on {table}: {why} A timeout bounds the wait \
             (Writer::with_timeout, SampleConfig::timeout); GEAR_WAIT_WARNING_SECS sets when this is logged",
            role.name(),
            std::process::id(),
            waited.as_secs_f64()
        )
    }

    /// The waits listed now, by every process of the table; entries left by
    /// processes that died while waiting are cleared on the way.
    pub(in crate::table) fn waiting_now(&self) -> Vec<crate::table::Waiting> {
        let sh = &*self.shared;
        let ctl = sh.region.control();
        let now_ms = gear_cpu::sync::unix_ms();
        let mut waiting: Vec<crate::table::Waiting> = ctl
            .waits_now()
            .filter(|w| {
                let alive = sh.lease.is_alive(w.token, ctl);
                if !alive {
                    ctl.clear_wait(w);
                }
                alive
            })
            .map(|w| crate::table::Waiting {
                role: w.role,
                reason: w.reason,
                pid: ctl.lease_pids[gear_cpu::sync::lease_index(w.token)].load(Ordering::Relaxed),
                since: std::time::UNIX_EPOCH + Duration::from_millis(w.since_ms),
                waited: Duration::from_millis(now_ms.saturating_sub(w.since_ms)),
            })
            .collect();
        waiting.sort_by_key(|w| std::cmp::Reverse(w.waited));
        waiting
    }
}
