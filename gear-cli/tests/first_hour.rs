//! What a new user meets in the first hour, run as they would run it: the
//! example configs (one table; two tables with metrics) start a server as
//! printed, config errors carry one
//! prefix and the file's name, `gear cluster-info` waits for a shard that
//! is still starting, `gear inspect` and `gear sample` show a table and who
//! waits on it, the checkpoint bench creates nothing it leaves behind, and
//! `--restore` says what it restored. Every child runs under a deadline.

use gear_api::{RateLimiterConfig, ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const GEAR: &str = env!("CARGO_BIN_EXE_gear");

fn gear(args: &[&str]) -> (bool, String, String) {
    let out = run_with_deadline(Command::new(GEAR).args(args), Duration::from_secs(120));
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Runs a command to its end, killing it past `deadline`.
fn run_with_deadline(cmd: &mut Command, deadline: Duration) -> Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} ran past {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gear-first-hour-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A child stopped when dropped as a user would stop it (SIGTERM: a server
/// closes and removes its table), killed if it does not exit in 20 s.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let start = Instant::now();
        while self.0.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `gear ARGS` and returns it with a channel of its stdout lines.
fn start(args: &[&str], env: &[(&str, &str)]) -> (Running, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(GEAR)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (Running(child), rx)
}

/// Waits (60 s at most) for a line containing `word`.
fn line_with(lines: &std::sync::mpsc::Receiver<String>, word: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(word) => return l,
            Ok(_) => {}
            Err(e) => panic!("no line with `{word}` ({e})"),
        }
    }
}

#[test]
fn the_printed_serve_example_starts_a_server_as_it_is() {
    let dir = temp_dir("example");
    let (ok, example, err) = gear(&["config", "example", "serve"]);
    assert!(ok, "{err}");
    let file = dir.join("table.toml");
    std::fs::write(&file, &example).unwrap();
    let (ok, out, err) = gear(&["serve", "--config", file.to_str().unwrap(), "--dry-run"]);
    assert!(
        ok && out.contains("memory: ") && out.contains(" MB in /dev/shm") && out.contains("is valid"),
        "{out}{err}"
    );
    // Started as printed (its name is the example's own, `my-table`).
    let (_server, lines) = start(&["serve", "--config", file.to_str().unwrap(), "--seconds", "60"], &[]);
    let started = line_with(&lines, "serving table `my-table`");
    assert!(started.contains(" MB in /dev/shm"), "the start line says the memory it takes: {started}");
    // ... and a program attaches to it by the name the example gives.
    let table = ReplayTable::attach("my-table", gear_api::AttachOptions::default()).unwrap();
    assert_eq!(table.spec().columns().len(), 3);
    let mut t = table.writer().begin(None).unwrap();
    t.append_step(&[StepValue::typed(&[0.5f32; 4]), StepValue::typed(&[1i64]), StepValue::typed(&[1.0f32])]).unwrap();
    t.end().unwrap();
    assert_eq!(table.info().unwrap().inserts, 1);
    let (ok, cluster, _) = gear(&["config", "example", "cluster"]);
    assert!(ok && cluster.contains("shards = ["), "{cluster}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `GET /metrics` of a `gear serve`: the value of the series of `name`
/// whose labels include every one of `labels` (0 when none matches).
fn scrape(addr: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn the_printed_tables_example_serves_both_tables_and_shows_waiting_writers_in_its_metrics() {
    let dir = temp_dir("tables");
    let (ok, example, err) = gear(&["config", "example", "tables"]);
    assert!(ok, "{err}");
    let file = dir.join("tables.toml");
    std::fs::write(&file, &example).unwrap();
    let (ok, out, err) = gear(&["serve", "--config", file.to_str().unwrap(), "--dry-run"]);
    assert!(
        ok && out.contains("table `replay`") && out.contains("table `queue`") && out.contains("metrics: "),
        "{out}{err}"
    );
    // Started as printed: both tables, and the metrics on a free port.
    let (_server, lines) = start(&["serve", "--config", file.to_str().unwrap(), "--seconds", "120"], &[]);
    let metrics = line_with(&lines, "metrics on http://");
    let addr = metrics.split("http://").nth(1).unwrap().trim_end_matches("/metrics").to_owned();
    line_with(&lines, "serving table `replay`");
    line_with(&lines, "serving table `queue`");
    // Local programs attach by the shared-memory names the example gives.
    let replay = ReplayTable::attach("my-replay", gear_api::AttachOptions::default()).unwrap();
    let queue = ReplayTable::attach("my-queue", gear_api::AttachOptions::default()).unwrap();
    assert_eq!((replay.spec().capacity(), queue.spec().capacity()), (1024, 256));
    let step = [StepValue::typed(&[0.5f32; 8]), StepValue::typed(&[1.0f32])];
    for _ in 0..256 {
        let mut t = queue.writer().begin(None).unwrap();
        t.append_step(&step).unwrap();
        t.end().unwrap();
    }
    let waiting = |table| scrape(&addr, "gear_table_waiting", &[("table", table), ("role", "writer")]);
    assert_eq!(waiting("queue"), 0.0);
    // The queue is full: the next writer waits, and the metrics say so.
    let q = queue.clone();
    let blocked = std::thread::spawn(move || {
        let mut t = q.writer().with_timeout(Duration::from_secs(60)).begin(None)?;
        t.append_step(&[StepValue::typed(&[1.5f32; 8]), StepValue::typed(&[2.0f32])])?;
        t.end()
    });
    let start = Instant::now();
    while waiting("queue") < 1.0 {
        assert!(start.elapsed() < Duration::from_secs(30), "the waiting writer never showed in the metrics");
        std::thread::sleep(Duration::from_millis(50));
    }
    let full = [("table", "queue"), ("role", "writer"), ("reason", "full_table")];
    assert_eq!(scrape(&addr, "gear_table_waiting", &full), 1.0);
    assert_eq!(waiting("replay"), 0.0);
    assert!(scrape(&addr, "gear_table_longest_wait_seconds", &[("table", "queue"), ("role", "writer")]) >= 0.0);
    // One read from the queue lets it in; the gauge drops back.
    let mut sampler = queue.sampler(gear_api::SampleConfig::new(1, gear_core::WindowSpec::last(1))).unwrap();
    sampler.sample().unwrap();
    blocked.join().unwrap().unwrap();
    assert_eq!(waiting("queue"), 0.0);
    assert_eq!(scrape(&addr, "gear_table_inserts_total", &[("table", "queue")]), 257.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_errors_name_the_file_once_with_one_prefix() {
    let dir = temp_dir("typo");
    let file = dir.join("typo1.toml");
    std::fs::write(
        &file,
        "name = \"t\"\nmax_len = 4\ncapacity = 4\ncapacty = 5\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\n",
    )
    .unwrap();
    let (ok, _, err) = gear(&["serve", "--config", file.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert_eq!(err.matches("invalid configuration").count(), 1, "{err}");
    assert_eq!(err.matches("typo1.toml").count(), 1, "{err}");
    assert!(err.contains("line 4") && err.contains("capacty"), "{err}");
    // float32 is accepted beside f32 (NumPy's names, as in Python).
    std::fs::write(&file, "name = \"t\"\nmax_len = 4\ncapacity = 4\n[[columns]]\nname = \"x\"\ndtype = \"float32\"\n")
        .unwrap();
    let (ok, out, err) = gear(&["serve", "--config", file.to_str().unwrap(), "--dry-run"]);
    assert!(ok && out.contains("is valid"), "{out}{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cluster_info_waits_for_a_shard_that_is_still_starting() {
    let dir = temp_dir("starting");
    let token = "first-hour-token-0123456789";
    // A free port, released for the server to take later.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cluster = dir.join("cluster.toml");
    std::fs::write(&cluster, format!("shards = [\"127.0.0.1:{port}\"]\ntoken = \"{token}\"\n")).unwrap();
    let config = dir.join("shard.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"gear-first-hour-{}\"\nmax_len = 4\ncapacity = 8\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\n\
             [grpc]\nlisten = \"127.0.0.1:{port}\"\nshard = 0\n",
            std::process::id()
        ),
    )
    .unwrap();
    // Asked before the server exists: it says so and waits.
    let asking = std::thread::spawn({
        let cluster = cluster.clone();
        move || {
            run_with_deadline(
                Command::new(GEAR).args(["cluster-info", "--cluster", cluster.to_str().unwrap(), "--wait", "90"]),
                Duration::from_secs(120),
            )
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    let (_server, lines) =
        start(&["serve", "--config", config.to_str().unwrap(), "--seconds", "60"], &[("GEAR_TOKEN", token)]);
    line_with(&lines, "grpc listening");
    let out = asking.join().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("shard 0 is not answering yet") && stderr.contains("may still be starting"), "{stderr}");
    assert!(stdout.contains("shard 0: 1 table(s)") && stdout.contains("size 0/8"), "{stdout}");
    // Without waiting, a shard that is not there fails at once, naming it.
    std::fs::write(&cluster, format!("shards = [\"127.0.0.1:1\"]\ntoken = \"{token}\"\n")).unwrap();
    let (ok, out, err) = gear(&["cluster-info", "--cluster", cluster.to_str().unwrap(), "--wait", "0"]);
    assert!(!ok && out.contains("shard 0") && err.contains("1 of 1 shards did not answer"), "{out}{err}");
    assert!(!err.contains("backend:"), "no library prefix on the command line: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn small_spec() -> TableSpec {
    TableSpec::new(
        vec![ColumnSpec::new("obs", DType::F32, vec![2]), ColumnSpec::new("done", DType::Bool, vec![])],
        8,
        16,
    )
    .unwrap()
}

fn write(table: &ReplayTable, value: f32, steps: u64) {
    let mut t = table.writer().begin(None).unwrap();
    for s in 0..steps {
        t.append_step(&[StepValue::typed(&[value, s as f32]), StepValue::typed(&[s + 1 == steps])]).unwrap();
    }
    t.end().unwrap();
}

#[test]
fn inspect_and_sample_show_a_table_and_who_waits_on_it() {
    let name = format!("gear-first-hour-inspect-{}", std::process::id());
    // inserts - samples is kept within [-1, 3].
    let limiter = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap();
    let table = ReplayTable::builder(small_spec()).rate_limiter(limiter).shared_memory(&name).build().unwrap();
    write(&table, 7.5, 3);
    let (ok, list, err) = gear(&["inspect"]);
    assert!(ok && list.lines().any(|l| l.starts_with(&name)), "{list}{err}");
    let (ok, out, err) = gear(&["inspect", &name]);
    assert!(ok, "{err}");
    for want in ["spec: T=8, capacity 16", "obs", "f32", "[2]", "fill: 1/16", "samples_per_insert 1", "waiting: nobody"]
    {
        assert!(out.contains(want), "`{want}` missing from:\n{out}");
    }
    let (ok, out, err) = gear(&["sample", &name, "--rows", "2", "--window", "3"]);
    assert!(ok, "{err}");
    assert!(out.contains("row 0: slot 0") && out.contains("row 1:") && out.contains("3 of 3 steps"), "{out}");
    assert!(out.contains("[7.5000, 0.0000] [7.5000, 1.0000] [7.5000, 2.0000]") && out.contains("true"), "{out}");
    // 1 insert, 2 samples: four more inserts reach the limit of 3; the
    // next writer waits, and inspect says who, on what.
    for v in 1..=4 {
        write(&table, v as f32, 1);
    }
    let t2 = table.clone();
    let blocked = std::thread::spawn(move || {
        let mut t = t2.writer().with_timeout(Duration::from_secs(60)).begin(None)?;
        t.append_step(&[StepValue::typed(&[0f32, 0.0]), StepValue::typed(&[true])])?;
        t.end()
    });
    let start = Instant::now();
    let out = loop {
        let (ok, out, err) = gear(&["inspect", &name]);
        assert!(ok, "{err}");
        if out.contains("waiting: 1 writer") {
            break out;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the waiting writer never showed:\n{out}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(out.contains("samples per insert") && out.contains(&format!("process {}", std::process::id())), "{out}");
    // `gear sample` draws like any sampler: it releases the writer.
    let (ok, _, err) = gear(&["sample", &name, "--rows", "2"]);
    assert!(ok, "{err}");
    blocked.join().unwrap().unwrap();
    let (ok, _, err) = gear(&["sample", "gear-first-hour-no-such-table"]);
    assert!(!ok && err.contains("not found") && err.contains(&name), "lists the tables there: {err}");
}

#[test]
fn the_checkpoint_bench_creates_nothing_it_leaves_behind() {
    let dir = temp_dir("ckbench");
    let missing = dir.join("data");
    let (ok, _, err) =
        gear(&["bench", "--checkpoint", "--capacity", "8", "--checkpoint-dir", missing.to_str().unwrap()]);
    assert!(!ok && err.contains("no such directory"), "{err}");
    assert!(!missing.exists(), "a missing --checkpoint-dir is refused, not created");
    let (ok, out, err) = gear(&[
        "bench",
        "--checkpoint",
        "--capacity",
        "8",
        "--steps",
        "4",
        "--step-bytes",
        "64",
        "--rounds",
        "1",
        "--checkpoint-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the bench removed what it wrote");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serve_restore_says_what_it_restored() {
    let dir = temp_dir("restore");
    let name = format!("gear-first-hour-restore-{}", std::process::id());
    let config = dir.join("t.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"{name}\"\nmax_len = 8\ncapacity = 16\n[[columns]]\nname = \"obs\"\ndtype = \"f32\"\nshape = [2]\n\
             [[columns]]\nname = \"done\"\ndtype = \"bool\"\n"
        ),
    )
    .unwrap();
    let table = ReplayTable::builder(small_spec()).build().unwrap();
    for i in 0..3 {
        write(&table, i as f32, 2);
    }
    let ckpt = dir.join("t.gear");
    table.checkpoint(&ckpt).unwrap();
    let (ok, out, err) =
        gear(&["serve", "--config", config.to_str().unwrap(), "--restore", ckpt.to_str().unwrap(), "--seconds", "0.3"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains(&format!("restored 3 trajectories from {}", ckpt.display())), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn import_and_export_each_describe_their_own_checkpoint_flag() {
    let help = |cmd: &str| gear(&[cmd, "--help"]).1;
    let (import, export) = (help("import"), help("export"));
    assert!(import.contains("Write the table to this checkpoint") && !import.contains("Read the table"), "{import}");
    assert!(export.contains("Read the table from this checkpoint") && !export.contains("Write the table"), "{export}");
}

#[test]
fn the_readme_lists_every_bench_flag() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let (ok, help, err) = gear(&["bench", "--help"]);
    assert!(ok, "{err}");
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| l.split([' ', '<']).next().unwrap())
        .filter(|f| *f != "help")
        .collect();
    assert!(flags.len() > 15 && flags.contains(&"data-plane"), "{flags:?}");
    let missing: Vec<_> = flags.iter().filter(|f| !readme.contains(&format!("--{f}"))).collect();
    assert!(missing.is_empty(), "README.md does not mention `gear bench` flags {missing:?}");
}
