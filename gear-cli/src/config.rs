//! Configuration files for `gear serve --config FILE` (TOML): one table
//! with its keys at the top level, or several under `[[tables]]` (with
//! `[grpc]` and `[metrics]` at the top level). Every key, its type, default
//! and an example: docs/CONFIG.md; `gear config example serve|tables`
//! prints a commented config that runs as it is (`examples.rs`). Unknown
//! keys are refused with their line and column.
//!
//! Checkpoints of a `[[tables]]` file go into one subdirectory of
//! `--checkpoint-dir` per table name, and `--restore DIR` reads each table
//! from `DIR/<name>` (a file or a checkpoint directory); a one-table file
//! keeps using the directory itself.

use gear_api::{Error, Result};
use gear_api::{PoolConfig, RateLimiterConfig, ReplayTable, TableBuilder};
use gear_core::{ColumnSpec, DType, TableSpec};
use gear_sampler::{StrategyKind, StrategyParams};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A table described in a config file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// The table's name: what clients name it by, and its shared-memory
    /// name unless `shm_name` is given.
    pub name: String,
    /// Shared-memory name, if not `name` (several servers on one machine
    /// serving tables of one name need distinct ones).
    pub shm_name: Option<String>,
    /// Directory of the backing file (default `/dev/shm`).
    pub dir: Option<PathBuf>,
    /// Maximum trajectory length T.
    pub max_len: u64,
    /// Capacity in trajectories.
    pub capacity: u64,
    /// Seed.
    #[serde(default)]
    pub seed: u64,
    /// Let samplers draw trajectories still being written.
    #[serde(default)]
    pub sample_while_writing: bool,
    /// Remove a trajectory after this many samples.
    pub max_times_sampled: Option<u64>,
    /// The columns, in storage order.
    pub columns: Vec<ColumnConfig>,
    /// The sampling strategy (default uniform).
    #[serde(default)]
    pub sampler: StrategyConfig,
    /// The eviction strategy (default FIFO).
    pub remover: Option<StrategyConfig>,
    /// Flow control (default: sample once one item exists).
    pub rate_limiter: Option<LimiterConfig>,
    /// Serve the table to remote clients over gRPC (a one-table file).
    pub grpc: Option<gear_net::ServerConfig>,
    /// Serve metrics over HTTP (a one-table file).
    pub metrics: Option<gear_net::MetricsConfig>,
}

/// What `gear serve --config FILE` serves: one table or several, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeConfig {
    /// The tables, in the file's order (their `grpc` and `metrics` are
    /// `None`: those are the server's, below).
    pub tables: Vec<TableConfig>,
    /// Serve the tables to remote clients over gRPC.
    pub grpc: Option<gear_net::ServerConfig>,
    /// Serve metrics over HTTP.
    pub metrics: Option<gear_net::MetricsConfig>,
    /// Whether the file lists its tables under `[[tables]]`: their
    /// checkpoints then go into a subdirectory per table (module doc).
    pub several: bool,
}

/// A `[[tables]]` file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TablesFile {
    tables: Vec<TableConfig>,
    grpc: Option<gear_net::ServerConfig>,
    metrics: Option<gear_net::MetricsConfig>,
}

/// Reads the config file at `path` and parses it with `parse`; errors
/// name the file.
fn load_with<T>(path: &Path, parse: impl FnOnce(&str) -> Result<T>) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read config {}: {e}", path.display())))?;
    parse(&text).map_err(|e| in_file(path, e))
}

impl ServeConfig {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Self> {
        load_with(path, Self::parse)
    }

    /// Parses config text: `[[tables]]` entries, or one table's keys at the
    /// top level.
    pub fn parse(text: &str) -> Result<Self> {
        if !has_tables_array(text)? {
            let mut table = TableConfig::parse(text)?;
            let (grpc, metrics) = (table.grpc.take(), table.metrics.take());
            return Ok(ServeConfig { tables: vec![table], grpc, metrics, several: false });
        }
        let file: TablesFile = toml::from_str(text).map_err(|e| {
            let msg = e.to_string();
            if msg.contains("unknown field") && msg.contains("expected one of `tables`") {
                return Error::Config(format!(
                    "{}\nwith [[tables]], each table's keys go inside its [[tables]] entry; only [grpc] and \
                     [metrics] stay at the top level",
                    msg.trim_end()
                ));
            }
            Error::Config(msg)
        })?;
        if file.tables.is_empty() {
            return Err(Error::Config("`tables` lists no table".into()));
        }
        let mut shm_names: Vec<&str> = Vec::new();
        for (i, t) in file.tables.iter().enumerate() {
            let at = |what: String| Error::Config(format!("[[tables]] entry {} (`{}`): {what}", i + 1, t.name));
            gear_net::server::check_table_name(&t.name).map_err(|e| at(strip_net_prefix(e)))?;
            if file.tables[..i].iter().any(|o| o.name == t.name) {
                return Err(at("another entry has the same name".into()));
            }
            if t.grpc.is_some() || t.metrics.is_some() {
                return Err(at("[grpc] and [metrics] belong at the top level, not inside a table".into()));
            }
            if shm_names.contains(&t.shm()) {
                return Err(at(format!("shared-memory name `{}` is another entry's too; give a `shm_name`", t.shm())));
            }
            shm_names.push(t.shm());
        }
        if let Some(grpc) = &file.grpc {
            check_rdma(&grpc.rdma, "grpc.")?;
        }
        Ok(ServeConfig { tables: file.tables, grpc: file.grpc, metrics: file.metrics, several: true })
    }
}

/// Whether the text's top level has a `tables` key (a `[[tables]]` file).
fn has_tables_array(text: &str) -> Result<bool> {
    let top: toml::Table = toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
    Ok(top.contains_key("tables"))
}

fn strip_net_prefix(e: gear_net::Error) -> String {
    match e {
        gear_net::Error::Config(what) => what,
        e => e.to_string(),
    }
}

/// One column.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// Name.
    pub name: String,
    /// Dtype name (`u8`, `f32`, ...).
    pub dtype: String,
    /// Per-step shape (`[]` for scalars).
    #[serde(default)]
    pub shape: Vec<u64>,
}

/// A strategy by name.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StrategyConfig {
    /// `uniform`, `prioritized`, `fifo`, `lifo`, `max-heap`, `min-heap`.
    pub kind: String,
    /// Priority exponent (prioritized).
    pub alpha: Option<f64>,
    /// Importance-sampling exponent (prioritized).
    pub beta: Option<f64>,
    /// Stratified batches (prioritized, default true).
    pub stratified: Option<bool>,
}

impl Default for StrategyConfig {
    fn default() -> Self {
        StrategyConfig { kind: "uniform".into(), alpha: None, beta: None, stratified: None }
    }
}

/// The rate limiter.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimiterConfig {
    /// Items needed before sampling.
    #[serde(default = "one")]
    pub min_size_to_sample: u64,
    /// Samples per insert (with `error_buffer`).
    pub samples_per_insert: Option<f64>,
    /// Slack around the ratio.
    pub error_buffer: Option<f64>,
    /// A queue of this size instead.
    pub queue: Option<u64>,
}

fn one() -> u64 {
    1
}

/// `e`, said of the file `path`: a configuration or spec error gets the
/// file's name in front of its message (once: `invalid configuration: a.toml:
/// TOML parse error ...`), any other error is returned as it is.
pub fn in_file(path: &Path, e: Error) -> Error {
    match e {
        Error::Config(what) => Error::Config(format!("{}: {what}", path.display())),
        // A spec the file describes (an unknown dtype, a zero capacity).
        Error::Core(what) => Error::Config(format!("{}: {what}", path.display())),
        e => e,
    }
}

/// Refuses absurd RDMA settings, naming the key under `prefix` (`grpc.`
/// in a shard config, nothing in a cluster file).
pub fn check_rdma(settings: &gear_net::RdmaSettings, prefix: &str) -> Result<()> {
    settings.validate().map_err(|e| match e {
        gear_net::Error::Config(what) => Error::Config(format!("{prefix}{what}")),
        e => Error::Backend(Box::new(e)),
    })
}

impl TableConfig {
    /// Reads and checks a one-table config file (a `[[tables]]` file is
    /// refused: read it with [`ServeConfig::load`]).
    pub fn load(path: &Path) -> Result<Self> {
        load_with(path, Self::parse)
    }

    /// Parses one-table config text.
    pub fn parse(text: &str) -> Result<Self> {
        if has_tables_array(text)? {
            return Err(Error::Config(
                "this config lists several tables ([[tables]]); this command reads a one-table config".into(),
            ));
        }
        let config: TableConfig = toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        gear_net::server::check_table_name(&config.name).map_err(|e| Error::Config(strip_net_prefix(e)))?;
        if let Some(grpc) = &config.grpc {
            check_rdma(&grpc.rdma, "grpc.")?;
        }
        Ok(config)
    }

    /// The shared-memory name: `shm_name`, else `name`.
    pub fn shm(&self) -> &str {
        self.shm_name.as_deref().unwrap_or(&self.name)
    }

    /// The table spec.
    pub fn spec(&self) -> Result<TableSpec> {
        let columns = self
            .columns
            .iter()
            .map(|c| Ok(ColumnSpec::new(c.name.clone(), DType::from_name(&c.dtype)?, c.shape.clone())))
            .collect::<Result<Vec<_>>>()?;
        Ok(TableSpec::new(columns, self.max_len, self.capacity)?)
    }

    /// The sampling strategy and its parameters.
    pub fn strategy(&self) -> Result<(StrategyKind, StrategyParams)> {
        let sampler: StrategyKind = self.sampler.kind.parse()?;
        let defaults = StrategyParams::default();
        let params = StrategyParams {
            alpha: self.sampler.alpha.unwrap_or(defaults.alpha),
            beta: self.sampler.beta.unwrap_or(defaults.beta),
            stratified: self.sampler.stratified.unwrap_or(defaults.stratified),
        };
        Ok((sampler, params))
    }

    /// A builder for the table this config describes.
    pub fn builder(&self) -> Result<TableBuilder> {
        let (sampler, params) = self.strategy()?;
        let mut b = ReplayTable::builder(self.spec()?)
            .pool(PoolConfig::Shared { name: self.shm().to_owned(), dir: self.dir.clone() })
            .sampler_kind(sampler, params)
            .seed(self.seed)
            .sample_while_writing(self.sample_while_writing);
        if let Some(r) = &self.remover {
            if r.alpha.is_some() || r.beta.is_some() || r.stratified.is_some() {
                return Err(Error::Config(
                    "[remover]: alpha, beta and stratified are [sampler]'s (a prioritized remover uses them too); \
                     give only `kind` here"
                        .into(),
                ));
            }
            b = b.remover_kind(r.kind.parse()?);
        }
        if let Some(n) = self.max_times_sampled {
            b = b.max_times_sampled(n);
        }
        if let Some(l) = &self.rate_limiter {
            b = match (l.queue, l.samples_per_insert) {
                (Some(_), Some(_)) => {
                    return Err(Error::Config("rate_limiter: give either queue or samples_per_insert, not both".into()))
                }
                (Some(size), None) => b.queue(size)?,
                (None, Some(spi)) => {
                    let buffer = l.error_buffer.ok_or_else(|| {
                        Error::Config("rate_limiter: samples_per_insert needs an error_buffer".into())
                    })?;
                    b.rate_limiter(RateLimiterConfig::sample_to_insert_ratio(spi, l.min_size_to_sample, buffer)?)
                }
                (None, None) => b.rate_limiter(RateLimiterConfig::min_size(l.min_size_to_sample)),
            };
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
name = "t"
max_len = 16
capacity = 8
[[columns]]
name = "obs"
dtype = "u8"
shape = [4, 4]
[[columns]]
name = "reward"
dtype = "f32"
[sampler]
kind = "prioritized"
alpha = 0.7
[rate_limiter]
min_size_to_sample = 2
samples_per_insert = 4.0
error_buffer = 16.0
"#;

    #[test]
    fn parses_the_documented_shape() {
        let c = TableConfig::parse(EXAMPLE).unwrap();
        let spec = c.spec().unwrap();
        assert_eq!(spec.columns()[0].shape(), &[4, 4]);
        assert_eq!(spec.columns()[1].dtype(), DType::F32);
        assert_eq!(c.sampler.alpha, Some(0.7));
        c.builder().unwrap();
    }

    const GRPC: &str = "[grpc]\nlisten = \"127.0.0.1:0\"\nshard = 1\n";

    #[test]
    fn rdma_settings_parse_with_defaults() {
        let c = TableConfig::parse(&format!("{EXAMPLE}{GRPC}")).unwrap();
        assert_eq!(c.grpc.unwrap().rdma, gear_net::RdmaSettings::default());
        let text = format!("{EXAMPLE}{GRPC}[grpc.rdma]\ndevice = \"mlx5_1\"\nport = 2\ngid_index = 3\n");
        let rdma = TableConfig::parse(&text).unwrap().grpc.unwrap().rdma;
        assert_eq!(
            rdma,
            gear_net::RdmaSettings {
                device: Some("mlx5_1".into()),
                port: 2,
                gid_index: Some(3),
                ..gear_net::RdmaSettings::default()
            }
        );
        let only_gid = format!("{EXAMPLE}{GRPC}[grpc.rdma]\ngid_index = 3\ntraffic_class = 106\nservice_level = 3\n");
        let rdma = TableConfig::parse(&only_gid).unwrap().grpc.unwrap().rdma;
        assert_eq!((rdma.device, rdma.port, rdma.gid_index), (None, 1, Some(3)));
        assert_eq!((rdma.traffic_class, rdma.service_level), (106, 3));
    }

    #[test]
    fn absurd_rdma_settings_name_the_key() {
        let e =
            |rdma: &str| TableConfig::parse(&format!("{EXAMPLE}{GRPC}[grpc.rdma]\n{rdma}\n")).unwrap_err().to_string();
        assert!(e("port = 0").contains("grpc.rdma.port is 0"), "{}", e("port = 0"));
        assert!(e("device = \"\"").contains("grpc.rdma.device is empty"), "{}", e("device = \"\""));
        assert!(e("port = 256").contains("port"), "{}", e("port = 256"));
        assert!(e("gid_index = -1").contains("gid_index"), "{}", e("gid_index = -1"));
        assert!(e("gid = 3").contains("unknown field `gid`"), "{}", e("gid = 3"));
        let level = e("service_level = 16");
        assert!(level.contains("grpc.rdma.service_level is 16"), "{level}");
        assert!(e("traffic_class = 256").contains("traffic_class"), "{}", e("traffic_class = 256"));
        let bound = e("max_queue_pairs = 0");
        assert!(bound.contains("grpc.rdma.max_queue_pairs is 0"), "{bound}");
    }

    /// Two tables as `[[tables]]` entries (keys of EXAMPLE, prefixed):
    /// `replay` and `second` with `entry` added to its keys, then `file`.
    fn two_tables(second: &str, entry: &str, file: &str) -> String {
        let table = |name: &str, extra: &str| {
            EXAMPLE
                .replace("name = \"t\"", &format!("name = \"{name}\"\n{extra}"))
                .replace("[[columns]]", "[[tables.columns]]")
                .replace("[sampler]", "[tables.sampler]")
                .replace("[rate_limiter]", "[tables.rate_limiter]")
        };
        format!("[[tables]]{}\n[[tables]]{}{file}", table("replay", ""), table(second, entry))
    }

    #[test]
    fn a_one_table_config_serves_its_table_under_its_name() {
        let c = ServeConfig::parse(&format!("{EXAMPLE}{GRPC}[metrics]\nlisten = \"127.0.0.1:9090\"\n")).unwrap();
        assert!(!c.several);
        assert_eq!(c.tables.len(), 1);
        assert_eq!((c.tables[0].name.as_str(), c.tables[0].shm()), ("t", "t"));
        assert_eq!(c.grpc.unwrap().shard, 1);
        assert_eq!(c.metrics.unwrap().listen, "127.0.0.1:9090".parse().unwrap());
        assert!(c.tables[0].grpc.is_none() && c.tables[0].metrics.is_none());
        assert_eq!(TableConfig::parse(EXAMPLE).unwrap(), ServeConfig::parse(EXAMPLE).unwrap().tables[0]);
    }

    #[test]
    fn tables_entries_parse_each_with_its_own_keys() {
        let text = two_tables("queue", "shm_name = \"queue-0\"", GRPC);
        let c = ServeConfig::parse(&text).unwrap();
        assert!(c.several);
        let names: Vec<_> = c.tables.iter().map(|t| (t.name.as_str(), t.shm())).collect();
        assert_eq!(names, [("replay", "replay"), ("queue", "queue-0")]);
        assert_eq!(c.grpc.unwrap().shard, 1);
        for t in &c.tables {
            t.builder().unwrap();
            assert_eq!(t.spec().unwrap().columns().len(), 2);
            assert_eq!(t.sampler.kind, "prioritized");
        }
        // A one-table reader refuses such a file, saying why.
        let e = TableConfig::parse(&text).unwrap_err().to_string();
        assert!(e.contains("several tables"), "{e}");
    }

    #[test]
    fn bad_tables_entries_name_the_entry_and_the_problem() {
        let e = |t: &str| ServeConfig::parse(t).unwrap_err().to_string();
        let same = e(&two_tables("replay", "", ""));
        assert!(same.contains("entry 2 (`replay`)") && same.contains("same name"), "{same}");
        let bad = e(&two_tables("a/b", "", ""));
        assert!(bad.contains("table name `a/b` is invalid"), "{bad}");
        let shm = e(&two_tables("queue", "shm_name = \"replay\"", ""));
        assert!(shm.contains("shared-memory name `replay`"), "{shm}");
        let inside = e(&two_tables("queue", "", "[tables.grpc]\nlisten = \"127.0.0.1:0\"\nshard = 0\n"));
        assert!(inside.contains("belong at the top level"), "{inside}");
        let mixed = e(&format!("max_len = 3\n{}", two_tables("queue", "", "")));
        assert!(mixed.contains("unknown field `max_len`") && mixed.contains("inside its [[tables]] entry"), "{mixed}");
        assert!(e("tables = []").contains("no table"));
        // A bad key inside an entry is reported with its line.
        let typo = e(&two_tables("queue", "", "").replace("capacity = 8", "capacityy = 8"));
        assert!(typo.contains("capacityy") && typo.contains("line"), "{typo}");
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let e = |t: &str| TableConfig::parse(t).and_then(|c| c.builder().map(|_| ())).unwrap_err().to_string();
        assert!(e(&EXAMPLE.replace("\"u8\"", "\"u9\"")).contains("unknown dtype `u9`"));
        assert!(e(&EXAMPLE.replace("prioritized", "best")).contains("unknown selection strategy `best`"));
        assert!(e(&EXAMPLE.replace("capacity = 8", "capacity = 0")).contains("capacity is zero"));
        assert!(e(&EXAMPLE.replace("error_buffer = 16.0", "error_buffer = 1.0")).contains("can deadlock"));
        assert!(e(&format!("{EXAMPLE}[remover]\nkind = \"fifo\"\nalpha = 0.5\n")).contains("give only `kind`"));
        assert!(
            e(&EXAMPLE.replace("seed", "seeds").replace("name = \"t\"", "name = \"t\"\ncolour = 1")).contains("colour")
        );
    }
}
