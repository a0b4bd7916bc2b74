//! `gear cluster up --local N --config shard.toml`: a cluster of N shard
//! servers on this machine, to try the cluster client, `gear cluster-info`
//! and remote actors and trainers before deploying one server per machine.
//!
//! Each shard is a `gear serve` child process running a copy of the given
//! config with its own shared-memory name (`shm_name`, `NAME-shardI`), shard
//! index, seed and a loopback address; the table keeps its `name`, so every
//! shard serves the same table as clients name it. Once every shard answers, the cluster file is written
//! and printed with the token to use; Ctrl-C (or SIGTERM) stops every
//! shard, which closes and removes its table, and removes the files this
//! command wrote.

use crate::cluster_config::ClusterFile;
use crate::serve::EXIT_WITH_PARENT;
use crate::signals;
use gear_api::{Error, Result};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Most shards one `gear cluster up --local` starts.
pub const MAX_LOCAL_SHARDS: usize = 64;

/// How long a shard may take to create its table and listen.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// `gear cluster up`'s flags.
#[derive(clap::Args, Debug)]
pub struct ClusterUpArgs {
    /// Shard servers to start on this machine.
    #[arg(long)]
    pub local: usize,
    /// A table config (`gear config example serve`); `name`, `seed` and
    /// `[grpc]`'s `listen` and `shard` are set per shard.
    #[arg(long)]
    pub config: PathBuf,
    /// The cluster file to write for clients.
    #[arg(long, default_value = "cluster.toml")]
    pub cluster_file: PathBuf,
    /// First port (shard i listens on PORT + i); default: free ports the
    /// system picks.
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Stop after this many seconds (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_parser = crate::seconds_arg)]
    pub seconds: Option<f64>,
}

fn io(what: String) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Config(format!("{what}: {e}"))
}

/// A random token: 32 hex digits from the kernel's random source.
fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(io("cannot read /dev/urandom for a cluster token".into()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Shard `shard`'s config: the user's, with its own name, seed and
/// loopback address.
fn shard_config(base: &toml::Table, shard: usize, port: u16) -> Result<String> {
    let mut t = base.clone();
    t.insert("shm_name".into(), format!("{}-shard{shard}", shm_base(base)).into());
    let seed = t.get("seed").and_then(|v| v.as_integer()).unwrap_or(0);
    t.insert("seed".into(), (seed + shard as i64).into());
    let grpc = t.entry("grpc").or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let grpc = grpc.as_table_mut().ok_or_else(|| Error::Config("`grpc` must be a table ([grpc])".into()))?;
    grpc.insert("listen".into(), format!("127.0.0.1:{port}").into());
    grpc.insert("shard".into(), (shard as i64).into());
    // The token comes from the environment this command sets.
    grpc.remove("token");
    toml::to_string(&t).map_err(|e| Error::Config(format!("cannot write shard {shard}'s config: {e}")))
}

/// The shared-memory name the shards' names derive from: the config's
/// `shm_name`, else its `name`.
fn shm_base(base: &toml::Table) -> &str {
    let name = |key| base.get(key).and_then(|v: &toml::Value| v.as_str());
    name("shm_name").or(name("name")).unwrap_or("gear")
}

/// A started shard server.
struct Shard {
    child: Child,
    addr: String,
    _on_signal: signals::Registered,
}

/// Runs `gear cluster up`.
pub fn cluster_up(args: &ClusterUpArgs) -> Result<()> {
    let n = args.local;
    if n == 0 || n > MAX_LOCAL_SHARDS {
        return Err(Error::Config(format!("--local {n}: expected 1 to {MAX_LOCAL_SHARDS} shards")));
    }
    // The whole config is checked first: a typo fails here, once, rather
    // than in every shard.
    let table = crate::config::TableConfig::load(&args.config)?;
    let bytes = table.builder().map_err(|e| crate::config::in_file(&args.config, e))?.check()?;
    let text = std::fs::read_to_string(&args.config).map_err(io(format!("cannot read {}", args.config.display())))?;
    let base: toml::Table = toml::from_str(&text).map_err(|e| Error::Config(e.to_string()))?;
    let (token, generated) = match std::env::var("GEAR_TOKEN") {
        Ok(t) => (t, false),
        Err(_) => (random_token()?, true),
    };
    gear_net::auth::resolve_token(Some(&token)).map_err(|e| Error::Config(format!("GEAR_TOKEN: {e}")))?;
    let dir = std::env::temp_dir().join(format!("gear-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
    let _remove_dir = signals::remove_on_exit(dir.clone());
    let result = run(args, &base, &token, generated, &dir, bytes);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(args: &ClusterUpArgs, base: &toml::Table, token: &str, generated: bool, dir: &Path, bytes: u64) -> Result<()> {
    let exe = std::env::current_exe().map_err(io("cannot find the gear executable".into()))?;
    let mut shards: Vec<Shard> = Vec::new();
    let stop_all = |shards: &mut Vec<Shard>| {
        for s in shards.iter() {
            // SAFETY: kill on our own child's pid.
            unsafe { libc::kill(s.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        for s in shards.iter_mut() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while s.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    };
    for i in 0..args.local {
        let port = match args.base_port {
            Some(p) => p
                .checked_add(i as u16)
                .ok_or_else(|| Error::Config(format!("--base-port {p}: shard {i}'s port is above 65535")))?,
            None => 0,
        };
        let config = dir.join(format!("shard{i}.toml"));
        std::fs::write(&config, shard_config(base, i, port)?)
            .map_err(io(format!("cannot write {}", config.display())))?;
        // Each shard in a process group of its own: a terminal's Ctrl-C
        // reaches this command alone, which stops the shards in order.
        let spawned = Command::new(&exe)
            .process_group(0)
            .args(["serve", "--quiet", "--config"])
            .arg(&config)
            .env("GEAR_TOKEN", token)
            .env(EXIT_WITH_PARENT, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut shards);
                return Err(Error::Config(format!("cannot start shard {i}: {e}")));
            }
        };
        let on_signal = signals::kill_on_exit(child.id());
        let (tx, rx) = std::sync::mpsc::channel();
        forward(child.stdout.take(), i, Some(tx.clone()));
        forward(child.stderr.take(), i, None);
        drop(tx);
        let started = Instant::now();
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(addr) => break Ok(addr),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if started.elapsed() < START_TIMEOUT => {
                    if signals::stop_requested() {
                        break Err(Error::Closed);
                    }
                }
                Err(_) => {
                    let status = child.try_wait().ok().flatten();
                    break Err(Error::Config(match status {
                        Some(s) => format!("shard {i} exited before it listened ({s}); its error is above"),
                        None => format!("shard {i} did not listen within {} s", START_TIMEOUT.as_secs()),
                    }));
                }
            }
        };
        shards.push(Shard { child, addr: String::new(), _on_signal: on_signal });
        match addr {
            Ok(a) => shards[i].addr = a,
            Err(e) => {
                stop_all(&mut shards);
                return Err(e);
            }
        }
    }
    let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
    let file = cluster_file_text(&addrs, generated.then_some(token));
    // What clients will read, read back as they will.
    let parsed = ClusterFile::parse(&file).map_err(|e| Error::Backend(Box::new(e)));
    if let Err(e) = parsed.and_then(|_| write_cluster_file(&args.cluster_file, &file)) {
        stop_all(&mut shards);
        return Err(e);
    }
    let name = base.get("name").and_then(|v| v.as_str()).unwrap_or("gear");
    println!(
        "{} shards of table `{name}` running on this machine ({} of shared memory each, in {}-shard0..{}):",
        shards.len(),
        crate::serve::format_bytes(bytes),
        shm_base(base),
        shards.len() - 1
    );
    for (i, s) in shards.iter().enumerate() {
        println!("  shard {i}: {} (pid {})", s.addr, s.child.id());
    }
    println!("cluster file {}:", args.cluster_file.display());
    for line in file.lines().filter(|l| !l.starts_with('#')) {
        println!("  {line}");
    }
    if generated {
        println!("token (in the cluster file; servers and clients need the same one): {token}");
    } else {
        println!("token: the GEAR_TOKEN of this shell");
    }
    println!("try: gear cluster-info --cluster {}", args.cluster_file.display());
    println!("stop with Ctrl-C");
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    let until = args.seconds.and_then(|s| Duration::try_from_secs_f64(s).ok());
    let mut failed = None;
    while !signals::stop_requested() && until.is_none_or(|u| start.elapsed() < u) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some((i, status)) = shards.iter_mut().enumerate().find_map(|(i, s)| Some((i, s.child.try_wait().ok()??)))
        {
            failed = Some(format!("shard {i} exited ({status}); stopping the others"));
            break;
        }
    }
    stop_all(&mut shards);
    let _ = std::fs::remove_file(&args.cluster_file);
    match failed {
        Some(why) => Err(Error::Config(why)),
        None => {
            println!("stopped {} shards; removed {}", shards.len(), args.cluster_file.display());
            Ok(())
        }
    }
}

/// The cluster file of shards at `addrs`, with the token when given.
fn cluster_file_text(addrs: &[String], token: Option<&str>) -> String {
    let quoted: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let mut text = format!(
        "# Written by `gear cluster up` for its local shards; removed when it stops.\nshards = [{}]\n",
        quoted.join(", ")
    );
    if let Some(t) = token {
        text.push_str(&format!("token = \"{t}\"\n"));
    }
    text
}

/// Writes the cluster file (readable by its owner only: it may hold the
/// token).
fn write_cluster_file(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let what = format!("cannot write the cluster file {}", path.display());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(what.clone()))?;
    f.write_all(text.as_bytes()).map_err(io(what))
}

/// Copies a shard's output to this process's stderr, each line prefixed
/// with the shard; sends the address of the `grpc listening on` line.
fn forward(
    out: Option<impl std::io::Read + Send + 'static>,
    shard: usize,
    addr: Option<std::sync::mpsc::Sender<String>>,
) {
    let Some(out) = out else { return };
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if let Some(rest) = line.strip_prefix("grpc listening on ") {
                if let Some(tx) = &addr {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
                }
                continue;
            }
            // Said once for all shards by `gear cluster up` itself.
            if line.starts_with("serving table ") || (line.starts_with("table `") && line.ends_with("` closed")) {
                continue;
            }
            eprintln!("shard {shard}: {line}");
        }
    });
}
