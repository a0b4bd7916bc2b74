//! The tables one server serves, by name, with what the server keeps per
//! table: its incarnation, its samplers, its RPC byte counts.
//!
//! Every request that touches a table names it (`table` in the request);
//! an empty name means the only table of a one-table server. Each table has
//! an incarnation of its own, drawn when the server starts, which its
//! replies and keys carry: a key of one table sent with another's name is
//! stale there, as a key of a previous run is, so priority updates can
//! never reach the wrong table's slot.

use super::reply::SamplerCache;
use super::StrategyInfo;
use crate::error::{Error, Result};
use crate::metrics::RpcMetrics;
use gear_api::ReplayTable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;
use tonic::Status;

/// The name [`ServerHandle::start`](super::ServerHandle::start) serves its
/// one table under.
pub const DEFAULT_TABLE: &str = "default";

/// Longest table name, in bytes (as for shared-memory names).
pub const MAX_TABLE_NAME: usize = 255;

/// Checks a table name: 1 to [`MAX_TABLE_NAME`] ASCII letters, digits,
/// `_`, `-` and `.`, neither `.` nor containing `..`: the rule of
/// shared-memory names, so any such name is a valid table name. Names
/// become checkpoint directory names and metric label values, so nothing
/// else is allowed.
pub fn check_table_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TABLE_NAME
        && name != "."
        && !name.contains("..")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "table name `{}` is invalid: use 1 to {MAX_TABLE_NAME} ASCII letters, digits, `_`, `-` or `.` \
             (not `.`, no `..`)",
            name.escape_debug()
        )))
    }
}

/// A table name from the network as errors show it: its first 64
/// characters, escaped.
pub(crate) fn shown(name: &str) -> String {
    name.chars().take(64).collect::<String>().escape_debug().to_string()
}

/// A table to serve and the name clients reach it by.
#[derive(Clone)]
pub struct NamedTable {
    /// The name requests give in `table` (see [`check_table_name`]).
    pub name: String,
    /// The table.
    pub table: ReplayTable,
    /// What clients are told of its sampling strategy.
    pub strategy: StrategyInfo,
}

impl NamedTable {
    /// `table` served as `name` with `strategy`.
    pub fn new(name: impl Into<String>, table: ReplayTable, strategy: StrategyInfo) -> Self {
        NamedTable { name: name.into(), table, strategy }
    }
}

impl std::fmt::Debug for NamedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedTable").field("name", &self.name).field("strategy", &self.strategy).finish()
    }
}

/// One served table and what the server keeps for it.
pub(crate) struct ServedTable {
    pub(crate) name: String,
    pub(crate) table: ReplayTable,
    pub(crate) strategy: StrategyInfo,
    /// This table's run: in its replies and keys.
    pub(crate) incarnation: u64,
    /// Samplers kept between calls, by request shape.
    pub(crate) samplers: SamplerCache,
    /// Step bytes received in `Insert` calls.
    pub(crate) rpc_bytes_received: AtomicU64,
    /// Window bytes sent in `Sample` replies.
    pub(crate) rpc_bytes_sent: AtomicU64,
    /// Rows of replies sent from table memory whose slots were reused
    /// while they were sent (the client asked again).
    pub(crate) rows_overwritten: AtomicU64,
    /// Trajectories refused because their begin wait ran out.
    pub(crate) held_inserts: AtomicU64,
}

impl ServedTable {
    pub(crate) fn count_received(&self, bytes: u64) {
        self.rpc_bytes_received.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn count_sent(&self, bytes: u64) {
        self.rpc_bytes_sent.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn count_overwritten(&self, rows: u64) {
        self.rows_overwritten.fetch_add(rows, Ordering::Relaxed);
    }

    pub(crate) fn count_held(&self) {
        self.held_inserts.fetch_add(1, Ordering::Relaxed);
    }
}

struct Inner {
    tables: Vec<ServedTable>,
    /// This server process's run (`Health`).
    incarnation: u64,
    /// When the server started, for the metrics.
    started: SystemTime,
    /// Latency histograms and error counts, per method and table.
    rpc: RpcMetrics,
    /// The shard id, once a gRPC server serves these tables.
    shard: AtomicU64,
}

/// The tables of one server, shared by its gRPC service and its metrics
/// endpoint (cheap to clone).
#[derive(Clone)]
pub struct ServedTables(Arc<Inner>);

impl std::fmt::Debug for ServedTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedTables").field("tables", &self.names().collect::<Vec<_>>()).finish()
    }
}

/// No shard id yet (`Inner::shard`).
const NO_SHARD: u64 = u64::MAX;

/// A number that differs between two runs of a server: a restarted shard's
/// keys are then recognisably stale.
fn process_seed() -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

impl ServedTables {
    /// Serves `tables` under their names: at least one, names valid and
    /// distinct. Draws the server's incarnation and one per table.
    pub fn new(tables: Vec<NamedTable>) -> Result<Self> {
        if tables.is_empty() {
            return Err(Error::Config("a server needs at least one table".into()));
        }
        for (i, t) in tables.iter().enumerate() {
            check_table_name(&t.name)?;
            if tables[..i].iter().any(|o| o.name == t.name) {
                return Err(Error::Config(format!("table name `{}` is given twice", t.name)));
            }
        }
        let mut seed = process_seed();
        // Distinct odd numbers (0 means "any run" in a sample request).
        let mut incarnations: Vec<u64> = Vec::with_capacity(tables.len() + 1);
        while incarnations.len() < tables.len() + 1 {
            let i = gear_core::rng::splitmix64(&mut seed) | 1;
            if !incarnations.contains(&i) {
                incarnations.push(i);
            }
        }
        let served = tables
            .into_iter()
            .zip(&incarnations[1..])
            .map(|(t, &incarnation)| ServedTable {
                name: t.name,
                table: t.table,
                strategy: t.strategy,
                incarnation,
                samplers: SamplerCache::default(),
                rpc_bytes_received: AtomicU64::new(0),
                rpc_bytes_sent: AtomicU64::new(0),
                rows_overwritten: AtomicU64::new(0),
                held_inserts: AtomicU64::new(0),
            })
            .collect::<Vec<_>>();
        let rpc = RpcMetrics::new(served.len());
        Ok(ServedTables(Arc::new(Inner {
            tables: served,
            incarnation: incarnations[0],
            started: SystemTime::now(),
            rpc,
            shard: AtomicU64::new(NO_SHARD),
        })))
    }

    /// One table, served as [`DEFAULT_TABLE`].
    pub fn single(table: ReplayTable, strategy: StrategyInfo) -> Self {
        Self::new(vec![NamedTable::new(DEFAULT_TABLE, table, strategy)]).expect("one table under a valid name")
    }

    /// The tables' names, in the server's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.tables.iter().map(|t| t.name.as_str())
    }

    /// The table served as `name`.
    pub fn table(&self, name: &str) -> Option<&ReplayTable> {
        self.0.tables.iter().find(|t| t.name == name).map(|t| &t.table)
    }

    /// This server process's incarnation (`Health`).
    pub fn incarnation(&self) -> u64 {
        self.0.incarnation
    }

    /// The incarnation of the table served as `name`: what its keys carry.
    pub fn table_incarnation(&self, name: &str) -> Option<u64> {
        self.0.tables.iter().find(|t| t.name == name).map(|t| t.incarnation)
    }

    pub(crate) fn served(&self) -> &[ServedTable] {
        &self.0.tables
    }

    pub(crate) fn rpc(&self) -> &RpcMetrics {
        &self.0.rpc
    }

    pub(crate) fn started(&self) -> SystemTime {
        self.0.started
    }

    /// Records the shard id the gRPC server serves these tables as.
    pub(crate) fn set_shard(&self, shard: u32) {
        self.0.shard.store(u64::from(shard), Ordering::Relaxed);
    }

    /// The shard id, once a gRPC server serves these tables.
    pub(crate) fn shard(&self) -> Option<u32> {
        u32::try_from(self.0.shard.load(Ordering::Relaxed)).ok()
    }

    /// The names, quoted and comma-separated, for errors.
    fn listing(&self) -> String {
        self.names().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
    }

    /// The table a request names (see the module doc): its index and
    /// entry, or a status listing the tables.
    pub(crate) fn find(&self, name: &str) -> std::result::Result<(usize, &ServedTable), Status> {
        let tables = &self.0.tables;
        if name.is_empty() {
            if tables.len() == 1 {
                return Ok((0, &tables[0]));
            }
            return Err(Status::invalid_argument(format!(
                "this server serves {} tables ({}); name one in the request's `table`",
                tables.len(),
                self.listing()
            )));
        }
        tables.iter().enumerate().find(|(_, t)| t.name == name).ok_or_else(|| {
            Status::not_found(format!("no table `{}` here; this server serves {}", shown(name), self.listing()))
        })
    }
}
