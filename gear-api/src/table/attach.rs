//! Attaching to a table another process created, and what is validated
//! of the region on the way in.

use super::builder::{kind_from_code, lease_io, policy, Opened};
use super::shared::Shared;
use super::ReplayTable;
use crate::error::{Error, Result};
use crate::limiter::RateLimiterConfig;
use gear_core::{ControlBlock, MemoryRegion, Selector, TableRegion, TableSpec};
use gear_cpu::sync::{token_alive, ProcessLease};
use gear_sampler::StrategyParams;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long [`ReplayTable::attach`] waits for the table lock by default.
pub(super) const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// How to attach to a table another process created.
pub struct AttachOptions {
    /// Directory of the backing file (`/dev/shm` when `None`).
    pub dir: Option<PathBuf>,
    /// The spec the table must have.
    pub expected: Option<TableSpec>,
    /// The sampling strategy, required when the creator used a custom one.
    pub sampler: Option<Box<dyn Selector>>,
    /// The eviction strategy, required when the creator used a custom one.
    pub remover: Option<Box<dyn Selector>>,
    /// Threads for the CPU collector.
    pub collector_threads: Option<usize>,
    /// Longest the attach waits for the table lock (default 30 s; `None`:
    /// as long as it takes). A lock held by a dead process is taken over
    /// at once; one held by a live but stopped process makes the attach
    /// fail with [`Error::Timeout`] naming that process.
    pub timeout: Option<Duration>,
}

impl Default for AttachOptions {
    fn default() -> Self {
        AttachOptions {
            dir: None,
            expected: None,
            sampler: None,
            remover: None,
            collector_threads: None,
            timeout: Some(DEFAULT_ATTACH_TIMEOUT),
        }
    }
}

impl std::fmt::Debug for AttachOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachOptions")
            .field("dir", &self.dir)
            .field("expected", &self.expected)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ReplayTable {
    /// Attaches to the shared table `name` (in `/dev/shm` unless
    /// `options.dir`) that another process created. The attached handle
    /// writes, samples and updates priorities like the creator's.
    pub fn attach(name: &str, options: AttachOptions) -> Result<ReplayTable> {
        let pool = gear_cpu::ShmPool::open(name, options.dir.as_deref()).map_err(|e| match e {
            gear_cpu::Error::NotFound { name, dir } => {
                let existing = shared_tables(Some(&dir)).unwrap_or_default();
                Error::TableNotFound { name, dir, existing }
            }
            e => e.into(),
        })?;
        let file = pool.file()?;
        let pool: Box<dyn MemoryRegion> = Box::new(pool);
        let region = TableRegion::open(pool, options.expected.as_ref()).map_err(|e| match e {
            gear_core::Error::Decode(m) => gear_core::Error::Decode(format!("shared memory `{name}`: {m}")),
            other => other,
        })?;
        let ctl = region.control();
        if ctl.closed.load(Ordering::Acquire) != 0 {
            return Err(Error::Closed);
        }
        let server = u32::try_from(ctl.server.load(Ordering::Relaxed)).unwrap_or(0);
        if !token_alive(&file, server, ctl) {
            return Err(Error::ServerGone { name: name.to_owned() });
        }
        let p = &ctl.policy;
        let flags = p[policy::FLAGS].load(Ordering::Relaxed);
        let params = StrategyParams {
            alpha: f64::from_bits(p[policy::ALPHA].load(Ordering::Relaxed)),
            beta: f64::from_bits(p[policy::BETA].load(Ordering::Relaxed)),
            stratified: flags & policy::FLAG_UNSTRATIFIED == 0,
        };
        let strategy = |given: Option<Box<dyn Selector>>, word: usize, role: &str| -> Result<Box<dyn Selector>> {
            if let Some(s) = given {
                return Ok(s);
            }
            match kind_from_code(p[word].load(Ordering::Relaxed)) {
                Some(k) => Ok(gear_sampler::build(k, &params)?),
                None => Err(Error::Config(format!(
                    "table `{name}` uses a {role} strategy of its creator's own type; pass an equivalent one \
                     in AttachOptions {{ {field}: Some(Box::new(...)), .. }} (built-in strategies need none)",
                    field = if word == policy::SAMPLER_KIND { "sampler" } else { "remover" }
                ))),
            }
        };
        let sampler = strategy(options.sampler, policy::SAMPLER_KIND, "sampling")?;
        let remover = strategy(options.remover, policy::REMOVER_KIND, "eviction")?;
        let lease = ProcessLease::acquire(file.try_clone().map_err(lease_io)?, ctl)?;
        let opened = Opened { region, lease, backing: Some(file), creator: false };
        Shared::open_table(opened, sampler, remover, options.collector_threads, options.timeout)
    }
}

/// The names of the GEAR tables in `dir` (default `/dev/shm`): the files
/// there that start with a table region's magic bytes, sorted. Files that
/// cannot be read are left out.
pub fn shared_tables(dir: Option<&std::path::Path>) -> Result<Vec<String>> {
    use std::io::Read;
    let dir = dir.unwrap_or(std::path::Path::new(gear_cpu::DEFAULT_SHM_DIR));
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Error::from(gear_cpu::Error::Io { op: "list the tables in", path: dir.to_path_buf(), source: e })
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let mut magic = [0u8; 8];
            std::fs::File::open(e.path()).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
                && magic == gear_core::region::MAGIC
        })
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// The rate limiter's settings from the policy words, validated: a
/// corrupted word is refused here rather than met as a wait that never ends.
pub(super) fn read_limiter(ctl: &ControlBlock) -> Result<RateLimiterConfig> {
    let p = &ctl.policy;
    RateLimiterConfig {
        samples_per_insert: f64::from_bits(p[policy::SPI].load(Ordering::Relaxed)),
        min_size_to_sample: p[policy::MIN_SIZE].load(Ordering::Relaxed),
        min_diff: f64::from_bits(p[policy::MIN_DIFF].load(Ordering::Relaxed)),
        max_diff: f64::from_bits(p[policy::MAX_DIFF].load(Ordering::Relaxed)),
    }
    .validated()
    .map_err(|e| Error::Corrupted(format!("its rate limiter settings are invalid ({e})")))
}
