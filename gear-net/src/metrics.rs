//! A server's metrics in Prometheus's text format (version 0.0.4), served
//! over HTTP by [`MetricsServer`] (`gear serve`'s `[metrics]` section).
//!
//! Two sources:
//! * per table, read when scraped: the table's counters and the writers
//!   and samplers of every process waiting on it now
//!   ([`gear_api::TableInfo`]), this process's waits on it
//!   ([`gear_api::WaitStats`]), and the step bytes its RPCs moved;
//! * per RPC method and table, recorded as calls end: a latency histogram
//!   and an error count (`RpcMetrics`). A `Sample` that the shard draws
//!   while its reply is encoded ends when the encode does.
//!
//! Every family is documented in `docs/CONFIG.md` ("Metrics"); a test
//! scrapes a server and checks that the two lists agree. A per-table
//! figure is one entry of `TABLE_FAMILIES`.

mod endpoint;

pub use endpoint::{MetricsConfig, MetricsServer};

use crate::server::ServedTables;
use gear_api::{TableInfo, WaitReason, WaitRole, WaitStats};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

/// The `gear.v1.Shard` methods, as the metrics name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Health,
    ListTables,
    GetSpec,
    Info,
    Sample,
    UpdatePriorities,
    Insert,
    ConnectDataPlane,
}

impl Method {
    const ALL: [Method; 8] = [
        Method::Health,
        Method::ListTables,
        Method::GetSpec,
        Method::Info,
        Method::Sample,
        Method::UpdatePriorities,
        Method::Insert,
        Method::ConnectDataPlane,
    ];

    fn name(self) -> &'static str {
        match self {
            Method::Health => "Health",
            Method::ListTables => "ListTables",
            Method::GetSpec => "GetSpec",
            Method::Info => "Info",
            Method::Sample => "Sample",
            Method::UpdatePriorities => "UpdatePriorities",
            Method::Insert => "Insert",
            Method::ConnectDataPlane => "ConnectDataPlane",
        }
    }

    fn index(self) -> usize {
        Method::ALL.iter().position(|&m| m == self).unwrap_or(0)
    }
}

/// Upper bounds of the latency buckets, in seconds: 100 µs (a small call
/// on loopback) to a minute (the longest wait a sample may ask for).
const BUCKETS: [f64; 18] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// One method's calls on one table.
#[derive(Default)]
struct CallStats {
    /// Calls per bucket (not cumulative; the last counts calls above every bound).
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    errors: AtomicU64,
}

impl CallStats {
    fn record(&self, elapsed: Duration, ok: bool) {
        let s = elapsed.as_secs_f64();
        let b = BUCKETS.iter().position(|&le| s <= le).unwrap_or(BUCKETS.len());
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Latency and errors of every method on every table, and on no table
/// (calls that name none: `Health`, `ListTables`, a refused table name).
pub(crate) struct RpcMetrics {
    tables: usize,
    /// `[method][table]`, the last table slot for "no table".
    calls: Vec<CallStats>,
}

impl RpcMetrics {
    pub(crate) fn new(tables: usize) -> Self {
        let calls = (0..Method::ALL.len() * (tables + 1)).map(|_| CallStats::default()).collect();
        RpcMetrics { tables, calls }
    }

    fn stats(&self, method: Method, table: Option<usize>) -> &CallStats {
        let t = table.filter(|&t| t < self.tables).unwrap_or(self.tables);
        &self.calls[method.index() * (self.tables + 1) + t]
    }
}

/// Times one call; recorded when finished, or as failed when dropped
/// unfinished (a handler that returned early with an error, a reply whose
/// encode never ran because the client went away).
pub(crate) struct RpcTimer {
    tables: ServedTables,
    method: Method,
    table: Option<usize>,
    start: Instant,
    done: bool,
}

impl RpcTimer {
    pub(crate) fn start(tables: &ServedTables, method: Method) -> Self {
        RpcTimer { tables: tables.clone(), method, table: None, start: Instant::now(), done: false }
    }

    /// The call turned out to be about table `index`.
    pub(crate) fn table(&mut self, index: usize) {
        self.table = Some(index);
    }

    /// Records the call as ended, `ok` or not.
    pub(crate) fn finish(mut self, ok: bool) {
        self.record(ok);
    }

    fn record(&mut self, ok: bool) {
        if !self.done {
            self.done = true;
            self.tables.rpc().stats(self.method, self.table).record(self.start.elapsed(), ok);
        }
    }
}

impl Drop for RpcTimer {
    fn drop(&mut self) {
        self.record(false);
    }
}

/// What one table's figures are read from when scraped.
pub(crate) struct TableFigures<'a> {
    info: &'a TableInfo,
    waits: &'a WaitStats,
    rpc_bytes_received: u64,
    rpc_bytes_sent: u64,
    rows_overwritten: u64,
    held_inserts: u64,
}

/// Kinds of metric families.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// Extra labels of a per-table series (beside `table`).
type Labels = &'static [(&'static str, &'static str)];

/// A per-table metric family: for each table, its series' extra labels
/// and values.
pub(crate) struct TableFamily {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    series: fn(&TableFigures<'_>) -> Vec<(Labels, f64)>,
}

const INSERT: Labels = &[("op", "insert")];
const SAMPLE: Labels = &[("op", "sample")];

/// The waits a table can list (gear-api's [`gear_api::Waiting`]): who
/// waits on which limit, as the labels of `gear_table_waiting`.
const WAIT_KINDS: [(Labels, WaitRole, WaitReason); 6] = [
    (&[("role", "writer"), ("reason", "samples_per_insert")], WaitRole::Writer, WaitReason::SamplesPerInsert),
    (&[("role", "writer"), ("reason", "full_table")], WaitRole::Writer, WaitReason::FullTable),
    (&[("role", "sampler"), ("reason", "min_size")], WaitRole::Sampler, WaitReason::MinSize),
    (&[("role", "sampler"), ("reason", "samples_per_insert")], WaitRole::Sampler, WaitReason::SamplesPerInsert),
    (&[("role", "sampler"), ("reason", "empty_table")], WaitRole::Sampler, WaitReason::EmptyTable),
    (&[("role", "caller"), ("reason", "table_lock")], WaitRole::Other, WaitReason::TableLock),
];

/// The roles, as the labels of `gear_table_longest_wait_seconds`.
const WAIT_ROLES: [(Labels, WaitRole); 3] = [
    (&[("role", "writer")], WaitRole::Writer),
    (&[("role", "sampler")], WaitRole::Sampler),
    (&[("role", "caller")], WaitRole::Other),
];

/// How many waits of `role` on `reason` the table lists now.
fn waiting(info: &TableInfo, role: WaitRole, reason: WaitReason) -> f64 {
    info.waiting.iter().filter(|w| w.role == role && w.reason == reason).count() as f64
}

/// The longest wait of `role` listed now, in seconds (0 when none).
fn longest_wait(info: &TableInfo, role: WaitRole) -> f64 {
    info.waiting.iter().filter(|w| w.role == role).map(|w| w.waited.as_secs_f64()).fold(0.0, f64::max)
}

/// Every per-table family, in the order scraped. A new per-table figure
/// is one more entry here and one line in docs/CONFIG.md.
pub(crate) const TABLE_FAMILIES: &[TableFamily] = &[
    TableFamily {
        name: "gear_table_size",
        kind: Kind::Gauge,
        help: "Trajectories that can be sampled.",
        series: |f| vec![(&[], f.info.size as f64)],
    },
    TableFamily {
        name: "gear_table_capacity",
        kind: Kind::Gauge,
        help: "Slots of the table.",
        series: |f| vec![(&[], f.info.capacity as f64)],
    },
    TableFamily {
        name: "gear_table_inserts_total",
        kind: Kind::Counter,
        help: "Trajectories committed, by every process.",
        series: |f| vec![(&[], f.info.inserts as f64)],
    },
    TableFamily {
        name: "gear_table_samples_total",
        kind: Kind::Counter,
        help: "Rows sampled, by every process.",
        series: |f| vec![(&[], f.info.samples as f64)],
    },
    TableFamily {
        name: "gear_table_evictions_total",
        kind: Kind::Counter,
        help: "Trajectories evicted to make room.",
        series: |f| vec![(&[], f.info.evictions as f64)],
    },
    TableFamily {
        name: "gear_table_retired_total",
        kind: Kind::Counter,
        help: "Trajectories removed after max_times_sampled samples.",
        series: |f| vec![(&[], f.info.retired as f64)],
    },
    TableFamily {
        name: "gear_table_bytes_in_total",
        kind: Kind::Counter,
        help: "Step bytes written into the table, by every process.",
        series: |f| vec![(&[], f.info.bytes_written as f64)],
    },
    TableFamily {
        name: "gear_table_bytes_out_total",
        kind: Kind::Counter,
        help: "Bytes gathered from the table into batches, by every process.",
        series: |f| vec![(&[], f.info.bytes_gathered as f64)],
    },
    TableFamily {
        name: "gear_table_rpc_received_bytes_total",
        kind: Kind::Counter,
        help: "Step bytes received in Insert calls.",
        series: |f| vec![(&[], f.rpc_bytes_received as f64)],
    },
    TableFamily {
        name: "gear_table_rpc_sent_bytes_total",
        kind: Kind::Counter,
        help: "Window bytes sent in Sample replies.",
        series: |f| vec![(&[], f.rpc_bytes_sent as f64)],
    },
    TableFamily {
        name: "gear_table_rpc_overwritten_rows_total",
        kind: Kind::Counter,
        help: "Rows of Sample replies sent from table memory whose slots were reused while they were sent (the \
               client asked that shard again).",
        series: |f| vec![(&[], f.rows_overwritten as f64)],
    },
    TableFamily {
        name: "gear_table_held_inserts_total",
        kind: Kind::Counter,
        help: "Trajectories refused because the server could not begin them within their insert stream's begin \
               wait (held by the rate limiter); a spreading client sends them to another shard.",
        series: |f| vec![(&[], f.held_inserts as f64)],
    },
    TableFamily {
        name: "gear_table_rate_limiter_waits_total",
        kind: Kind::Counter,
        help: "Calls of the server process that waited: writers for the rate limiter (op=insert), samplers for it \
               or for data (op=sample).",
        series: |f| vec![(INSERT, f.waits.insert_waits as f64), (SAMPLE, f.waits.sample_waits as f64)],
    },
    TableFamily {
        name: "gear_table_rate_limiter_wait_seconds_total",
        kind: Kind::Counter,
        help: "Time those calls waited, by op.",
        series: |f| vec![(INSERT, f.waits.insert_wait.as_secs_f64()), (SAMPLE, f.waits.sample_wait.as_secs_f64())],
    },
    TableFamily {
        name: "gear_table_lock_waits_total",
        kind: Kind::Counter,
        help: "Takes of the table lock by this process that found it held.",
        series: |f| vec![(&[], f.waits.lock_waits as f64)],
    },
    TableFamily {
        name: "gear_table_lock_wait_seconds_total",
        kind: Kind::Counter,
        help: "Time those takes waited.",
        series: |f| vec![(&[], f.waits.lock_wait.as_secs_f64())],
    },
    TableFamily {
        name: "gear_table_waiting",
        kind: Kind::Gauge,
        help: "Writers and samplers of any process waiting now, by role and the limit they wait on (callers: the \
               table lock, listed once a take has waited 100 ms).",
        series: |f| WAIT_KINDS.iter().map(|&(labels, role, reason)| (labels, waiting(f.info, role, reason))).collect(),
    },
    TableFamily {
        name: "gear_table_longest_wait_seconds",
        kind: Kind::Gauge,
        help: "How long the longest of those waits has lasted so far, by role (0 when none waits).",
        series: |f| WAIT_ROLES.iter().map(|&(labels, role)| (labels, longest_wait(f.info, role))).collect(),
    },
];

/// Writes a label value with the text format's escapes.
fn escape(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// One sample line: `name{labels} value`.
fn line(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape(out, v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{value}");
    }
    out.push('\n');
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl ServedTables {
    /// Every metric of this server in Prometheus's text format (module
    /// doc). Reads each table's counters (under its lock, as
    /// [`gear_api::ReplayTable::info`] does); a table that cannot answer
    /// is left out of the per-table families.
    pub fn metrics_text(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        let shard = self.shard().map(|s| s.to_string()).unwrap_or_default();
        let incarnation = format!("{:#018x}", self.incarnation());
        header(&mut out, "gear_shard_info", "gauge", "This server: its shard id and incarnation (value 1).");
        line(&mut out, "gear_shard_info", &[("shard", &shard), ("incarnation", &incarnation)], 1.0);
        header(&mut out, "gear_shard_start_time_seconds", "gauge", "When this server started, in Unix seconds.");
        let started = self.started().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        line(&mut out, "gear_shard_start_time_seconds", &[], started);

        header(
            &mut out,
            "gear_table_info",
            "gauge",
            "Each served table: its incarnation and sampling strategy (value 1).",
        );
        for t in self.served() {
            let incarnation = format!("{:#018x}", t.incarnation);
            let labels =
                [("table", t.name.as_str()), ("incarnation", &incarnation), ("sampler", t.strategy.kind.name())];
            line(&mut out, "gear_table_info", &labels, 1.0);
        }
        let figures: Vec<(&str, TableInfo, WaitStats, [u64; 4])> = self
            .served()
            .iter()
            .filter_map(|t| {
                let info = t.table.info().ok()?;
                let received = t.rpc_bytes_received.load(Ordering::Relaxed);
                let sent = t.rpc_bytes_sent.load(Ordering::Relaxed);
                let overwritten = t.rows_overwritten.load(Ordering::Relaxed);
                let held = t.held_inserts.load(Ordering::Relaxed);
                Some((t.name.as_str(), info, t.table.wait_stats(), [received, sent, overwritten, held]))
            })
            .collect();
        for family in TABLE_FAMILIES {
            header(&mut out, family.name, family.kind.name(), family.help);
            for (name, info, waits, [received, sent, overwritten, held]) in &figures {
                let f = TableFigures {
                    info,
                    waits,
                    rpc_bytes_received: *received,
                    rpc_bytes_sent: *sent,
                    rows_overwritten: *overwritten,
                    held_inserts: *held,
                };
                for (extra, value) in (family.series)(&f) {
                    let mut labels: Vec<(&str, &str)> = vec![("table", name)];
                    labels.extend_from_slice(extra);
                    line(&mut out, family.name, &labels, value);
                }
            }
        }
        self.render_rpc(&mut out);
        out
    }

    /// The RPC families: a latency histogram and an error count per
    /// method and table, for the pairs that saw calls.
    fn render_rpc(&self, out: &mut String) {
        let rpc = self.rpc();
        let names: Vec<&str> = self.names().chain(std::iter::once("")).collect();
        let pairs = || {
            Method::ALL.iter().flat_map(|&m| {
                names
                    .iter()
                    .enumerate()
                    .map(move |(t, &name)| (m, name, rpc.stats(m, Some(t).filter(|&t| t < rpc.tables))))
            })
        };
        header(
            out,
            "gear_rpc_duration_seconds",
            "histogram",
            "Time from a call's arrival to its reply's end, by method and table.",
        );
        for (m, table, stats) in pairs() {
            let counts: Vec<u64> = stats.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
            let total: u64 = counts.iter().sum();
            if total == 0 {
                continue;
            }
            let mut cumulative = 0;
            for (le, n) in BUCKETS.iter().zip(&counts) {
                cumulative += n;
                let le = le.to_string();
                let labels = [("method", m.name()), ("table", table), ("le", le.as_str())];
                line(out, "gear_rpc_duration_seconds_bucket", &labels, cumulative as f64);
            }
            let labels = [("method", m.name()), ("table", table), ("le", "+Inf")];
            line(out, "gear_rpc_duration_seconds_bucket", &labels, total as f64);
            let labels = [("method", m.name()), ("table", table)];
            let sum = stats.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
            line(out, "gear_rpc_duration_seconds_sum", &labels, sum);
            line(out, "gear_rpc_duration_seconds_count", &labels, total as f64);
        }
        header(out, "gear_rpc_errors_total", "counter", "Calls that ended with an error status, by method and table.");
        for (m, table, stats) in pairs() {
            let calls: u64 = stats.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum();
            if calls > 0 {
                let labels = [("method", m.name()), ("table", table)];
                line(out, "gear_rpc_errors_total", &labels, stats.errors.load(Ordering::Relaxed) as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        line(&mut out, "m", &[("a", "x\"y\\z\nw")], 1.5);
        assert_eq!(out, "m{a=\"x\\\"y\\\\z\\nw\"} 1.5\n");
        let mut out = String::new();
        line(&mut out, "m", &[], f64::INFINITY);
        assert_eq!(out, "m +Inf\n");
    }

    #[test]
    fn calls_land_in_the_bucket_of_their_time() {
        let stats = CallStats::default();
        stats.record(Duration::from_micros(50), true);
        stats.record(Duration::from_millis(3), false);
        stats.record(Duration::from_secs(100), true);
        let counts: Vec<u64> = stats.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        assert_eq!(counts[0], 1);
        assert_eq!(counts[BUCKETS.iter().position(|&b| b == 0.005).unwrap()], 1);
        assert_eq!(counts[BUCKETS.len()], 1);
        assert_eq!(stats.errors.load(Ordering::Relaxed), 1);
    }
}
