//! Cluster files (parsed by gear-net's [`ClusterFile`]; every key:
//! docs/CONFIG.md, and `gear config example cluster` prints a commented
//! one) and `gear cluster-info`, which reads one and asks every shard its
//! tables' counters (once, or live with `--watch`), waiting a while for
//! shards that are still starting.

use gear_api::{Error, Result};
pub use gear_net::cluster_file::ClusterFile;
use gear_net::ClusterClient;
use std::path::Path;
use std::time::{Duration, Instant};

fn net(e: gear_net::Error) -> Error {
    Error::Backend(Box::new(e))
}

/// Reads a cluster file; errors name it.
pub fn load(path: &Path) -> Result<ClusterFile> {
    ClusterFile::load(path).map_err(net)
}

/// A client of the cluster the file at `path` describes.
pub fn connect(path: &Path) -> Result<ClusterClient> {
    ClusterClient::new(load(path)?.client_config().map_err(net)?).map_err(net)
}

/// Whether `e` says the shard is not listening (yet): refused or
/// unreachable connections, as right after `gear serve` starts (it listens
/// once its tables exist).
fn not_up(e: &gear_net::Error) -> bool {
    match e {
        gear_net::Error::Status { status, .. } => status.code() == tonic::Code::Unavailable,
        gear_net::Error::Transport(_) => true,
        _ => false,
    }
}

/// Asks `ask` again, for up to `wait`, while shard `s` is not listening
/// yet, saying so once on stderr.
fn ask_waiting<T>(s: usize, wait: Duration, ask: impl Fn() -> gear_net::Result<T>) -> gear_net::Result<T> {
    let deadline = Instant::now() + wait;
    let mut said = false;
    loop {
        match ask() {
            Err(e) if not_up(&e) && Instant::now() < deadline => {
                if !said {
                    eprintln!(
                        "shard {s} is not answering yet ({e}); it may still be starting (`gear serve` listens once \
                         its tables are created): waiting up to {:.0} s",
                        deadline.saturating_duration_since(Instant::now()).as_secs_f64()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// Prints what `show` makes of each shard's answer to `ask`, or the error
/// of each shard that did not answer (it names the shard); fails, after
/// every shard was asked, when any did not answer.
pub fn each_shard<T>(
    client: &ClusterClient,
    mut ask: impl FnMut(usize) -> gear_net::Result<T>,
    mut show: impl FnMut(usize, T),
) -> Result<()> {
    let mut failed = 0;
    for s in 0..client.shards() {
        match ask(s) {
            Ok(answer) => show(s, answer),
            Err(e) => {
                failed += 1;
                println!("{e}");
            }
        }
    }
    if failed > 0 {
        return Err(Error::Backend(format!("{failed} of {} shards did not answer", client.shards()).into()));
    }
    Ok(())
}

/// `gear cluster-info`'s options.
#[derive(Clone, Copy, Debug, Default)]
pub struct InfoOptions {
    /// How long to wait, at the first asking, for shards that are not
    /// listening yet (still creating their tables).
    pub wait: Duration,
    /// Print the figures again every `interval`, with rates since the
    /// previous refresh, until interrupted or `count` refreshes.
    pub watch: bool,
    /// Time between two refreshes.
    pub interval: Duration,
    /// Stop after this many refreshes (`None`: until interrupted).
    pub count: Option<u64>,
}

/// One shard's answer: its tables, or why it did not answer.
type ShardAnswer = std::result::Result<gear_net::ShardTables, gear_net::Error>;

/// `gear cluster-info`: every shard's tables and their counters, or why it
/// did not answer; with `--watch`, live.
pub fn cluster_info(path: &Path, options: InfoOptions) -> Result<()> {
    let file = load(path)?;
    let client = ClusterClient::new(file.client_config().map_err(net)?).map_err(net)?;
    let only = file.table.as_deref();
    let ask = || (0..client.shards()).map(|s| client.tables(s)).collect::<Vec<ShardAnswer>>();
    // The first time, shards still starting are waited for.
    let first = (0..client.shards()).map(|s| ask_waiting(s, options.wait, || client.tables(s))).collect();
    if !options.watch {
        let answers: Vec<ShardAnswer> = first;
        print_once(&answers, only);
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if failed > 0 {
            return Err(Error::Backend(format!("{failed} of {} shards did not answer", client.shards()).into()));
        }
        return Ok(());
    }
    // SAFETY: isatty only reads the descriptor's state.
    let terminal = unsafe { libc::isatty(1) } == 1;
    let mut previous: Option<(Instant, Vec<ShardAnswer>)> = None;
    let mut refreshes = 0u64;
    let mut first = Some(first);
    loop {
        let at = Instant::now();
        let answers = first.take().unwrap_or_else(ask);
        if terminal {
            // Clear the screen and go home: one frame per refresh.
            print!("\x1b[H\x1b[2J");
        }
        let since = previous.as_ref().map(|(t, a)| (at.duration_since(*t).as_secs_f64(), a.as_slice()));
        print_frame(&answers, since, only, options.interval);
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        previous = Some((at, answers));
        refreshes += 1;
        if options.count.is_some_and(|n| refreshes >= n) {
            return Ok(());
        }
        std::thread::sleep(options.interval.saturating_sub(at.elapsed()));
    }
}

/// The tables of `answer` that `only` selects (all when `None`).
fn selected<'a>(
    answer: &'a gear_net::ShardTables,
    only: Option<&'a str>,
) -> impl Iterator<Item = &'a gear_net::TableStatus> {
    answer.tables.iter().filter(move |t| only.is_none_or(|o| o == t.name))
}

fn print_once(answers: &[ShardAnswer], only: Option<&str>) {
    for (s, answer) in answers.iter().enumerate() {
        match answer {
            Ok(a) => {
                println!("shard {s}: {} table(s) (incarnation {:#x})", a.tables.len(), a.incarnation);
                for t in selected(a, only) {
                    println!(
                        "  table `{}` ({}): size {}/{} inserts {} samples {} evictions {} retired {} \
                         (incarnation {:#x})",
                        t.name,
                        t.sampler,
                        t.size,
                        t.capacity,
                        t.inserts,
                        t.samples,
                        t.evictions,
                        t.retired,
                        t.incarnation
                    );
                }
            }
            // The error names the shard already.
            Err(e) => println!("{e}"),
        }
    }
}

/// Per second between two readings of a counter (`-` without a previous one).
fn rate(now: u64, before: Option<u64>, seconds: f64, scale: f64) -> String {
    match before {
        Some(b) if seconds > 0.0 && now >= b => format!("{:.1}", (now - b) as f64 / seconds / scale),
        _ => "-".into(),
    }
}

/// One `--watch` frame: per shard and table, the fill, the rates since the
/// previous frame and the waits.
fn print_frame(answers: &[ShardAnswer], since: Option<(f64, &[ShardAnswer])>, only: Option<&str>, interval: Duration) {
    println!("gear cluster-info --watch: every {:.1} s; Ctrl-C stops", interval.as_secs_f64());
    println!(
        "{:<5} {:<16} {:>15} {:>10} {:>10} {:>9} {:>9} {:>22} {:>16}",
        "shard",
        "table",
        "size/capacity",
        "inserts/s",
        "rows/s",
        "MB/s in",
        "MB/s out",
        "limiter waits ins/smp",
        "lock waits"
    );
    for (s, answer) in answers.iter().enumerate() {
        let a = match answer {
            Ok(a) => a,
            Err(e) => {
                println!("{s:<5} not answering: {e}");
                continue;
            }
        };
        for t in selected(a, only) {
            // The same table of the same run, a refresh ago.
            let before = since.and_then(|(secs, prev)| {
                let prev = prev.get(s)?.as_ref().ok()?;
                let p = prev.tables.iter().find(|p| p.name == t.name && p.incarnation == t.incarnation)?;
                Some((secs, p))
            });
            let secs = before.map_or(0.0, |(secs, _)| secs);
            let p = before.map(|(_, p)| p);
            println!(
                "{:<5} {:<16} {:>15} {:>10} {:>10} {:>9} {:>9} {:>22} {:>16}",
                s,
                t.name,
                format!("{}/{}", t.size, t.capacity),
                rate(t.inserts, p.map(|p| p.inserts), secs, 1.0),
                rate(t.samples, p.map(|p| p.samples), secs, 1.0),
                rate(t.bytes_in, p.map(|p| p.bytes_in), secs, 1e6),
                rate(t.bytes_out, p.map(|p| p.bytes_out), secs, 1e6),
                format!(
                    "{}/{} ({:.1}/{:.1} s)",
                    t.waits.insert_waits,
                    t.waits.sample_waits,
                    t.waits.insert_wait.as_secs_f64(),
                    t.waits.sample_wait.as_secs_f64()
                ),
                format!("{} ({:.3} s)", t.waits.lock_waits, t.waits.lock_wait.as_secs_f64()),
            );
        }
    }
}
