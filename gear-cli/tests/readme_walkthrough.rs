//! Follows the README's cluster sections as written. "On one machine":
//! the commands of its `sh` block, read from README.md, run one after the
//! other by `sh -c` in a scratch copy of the files they name, with this
//! build's `gear` first on PATH (what the block's `cargo install` line
//! does). The `gear cluster up` line keeps running, as in the user's first
//! terminal, and is stopped with Ctrl-C (SIGINT) at the end; nothing it
//! started may be left in /dev/shm. "Several tables per server": its
//! `[[tables]]` config, served by `gear serve`, does what the section says.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The commands of the first `sh` block after `heading`, comments cut.
fn commands_after(readme: &str, heading: &str) -> Vec<String> {
    let rest = &readme[readme.find(heading).unwrap_or_else(|| panic!("README has no `{heading}`"))..];
    let block = &rest[rest.find("```sh\n").expect("an sh block") + 6..];
    let block = &block[..block.find("```").expect("the block ends")];
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim().to_owned())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `sh -c LINE` in `dir` with `gear` on PATH.
fn shell(line: &str, dir: &Path) -> Command {
    let bin = Path::new(env!("CARGO_BIN_EXE_gear")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = Command::new("sh");
    c.args(["-c", line]).current_dir(dir).env("PATH", path).env_remove("GEAR_TOKEN").stdin(Stdio::null());
    c
}

/// Stops the background command (SIGINT to its group, as Ctrl-C) when
/// dropped, killing it if it does not end in 30 s.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the group of a child we started.
        unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGINT) };
        let start = Instant::now();
        while self.0.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn shm_tables(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
fn the_one_machine_cluster_walkthrough_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let commands = commands_after(&readme, "### On one machine");
    assert!(commands.iter().any(|c| c.starts_with("gear cluster up")), "{commands:?}");
    // A scratch directory holding the files the commands name, so that the
    // cluster file is written there and not into the checkout.
    let dir = std::env::temp_dir().join(format!("gear-walkthrough-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("deploy/local")).unwrap();
    std::fs::copy(repo().join("deploy/local/shard.toml"), dir.join("deploy/local/shard.toml")).unwrap();
    let table = {
        let text = std::fs::read_to_string(dir.join("deploy/local/shard.toml")).unwrap();
        let name = text.lines().find_map(|l| l.strip_prefix("name = \"")).unwrap();
        name[..name.find('"').unwrap()].to_owned()
    };
    assert!(shm_tables(&format!("{table}-shard")).is_empty(), "a cluster of `{table}` already runs here");

    let mut background = None;
    let mut outputs = Vec::new();
    for line in &commands {
        if line.starts_with("cargo install") {
            continue; // this build's `gear` is on PATH instead
        }
        if line.starts_with("gear cluster up") {
            let mut child =
                shell(line, &dir).process_group(0).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
            let out = child.stdout.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
            background = Some(Background(child));
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut said = String::new();
            loop {
                let l = rx
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .unwrap_or_else(|e| panic!("`{line}` did not get ready ({e}); it said:\n{said}"));
                said.push_str(&l);
                said.push('\n');
                if l == "stop with Ctrl-C" {
                    break;
                }
            }
            assert!(said.contains("cluster file cluster.toml:") && said.contains("token"), "{said}");
            assert!(dir.join("cluster.toml").exists());
            continue;
        }
        let mut child = shell(line, &dir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(120), "`{line}` ran past 120 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let (mut out, mut err) = (String::new(), String::new());
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(child.wait().unwrap().success(), "`{line}` failed:\n{out}\n{err}");
        outputs.push((line.clone(), out));
    }
    let said = |cmd: &str| {
        outputs.iter().find(|(l, _)| l.starts_with(cmd)).map(|(_, o)| o.clone()).unwrap_or_else(|| panic!("no `{cmd}`"))
    };
    assert_eq!(said("gear cluster-info").lines().filter(|l| l.contains(": size ")).count(), 3);
    // Every shard serves the config's table by its name.
    let info = said("gear cluster-info");
    assert_eq!(info.matches(&format!("table `{table}` (")).count(), 3, "{info}");
    assert!(said("gear demo").contains("gear demo summary"), "{}", said("gear demo"));
    assert!(said("gear sample").contains("row 3:"), "{}", said("gear sample"));
    assert_eq!(shm_tables(&format!("{table}-shard")).len(), 3);
    // Ctrl-C in the first terminal: every shard and its table go, and so
    // does the cluster file.
    drop(background);
    assert_eq!(shm_tables(&format!("{table}-shard")), Vec::<String>::new());
    assert!(!dir.join("cluster.toml").exists(), "cluster up removes the cluster file it wrote");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README's `[[tables]]` config (its "Several tables per server"
/// section), as written but for the ports (free ones, so that tests and a
/// real server can run beside each other) and a shared-memory name per
/// table unique to this test.
fn readme_tables_config(readme: &str, tag: &str) -> String {
    let section = &readme[readme.find("### Several tables per server").expect("the multi-table section")..];
    let block = &section[section.find("```toml\n").expect("a toml block") + 8..];
    let block = &block[..block.find("```").unwrap()];
    assert!(block.contains("[[tables]]") && block.contains("[metrics]"), "{block}");
    let out = block.replace("0.0.0.0:50051", "127.0.0.1:0").replace("127.0.0.1:9090", "127.0.0.1:0");
    // After each table's `name` line (the one right after `[[tables]]`).
    out.replace("[[tables]]\nname = \"replay\"", &format!("[[tables]]\nname = \"replay\"\nshm_name = \"{tag}-replay\""))
        .replace("[[tables]]\nname = \"queue\"", &format!("[[tables]]\nname = \"queue\"\nshm_name = \"{tag}-queue\""))
}

#[test]
fn the_readme_multi_table_server_serves_what_its_section_says() {
    use gear_core::WindowSpec;
    use gear_net::{ClusterClient, ClusterConfig, ClusterSample, RemoteTrajectory, WriteTarget};
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let tag = format!("gear-readme-tables-{}", std::process::id());
    let dir = std::env::temp_dir().join(&tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("shard.toml");
    std::fs::write(&config, readme_tables_config(&readme, &tag)).unwrap();
    let token = "readme-multi-table-token-0123";
    let mut child = Command::new(env!("CARGO_BIN_EXE_gear"))
        .args(["serve", "--config", config.to_str().unwrap(), "--seconds", "120", "--quiet"])
        .env("GEAR_TOKEN", token)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let server = Background(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let (mut grpc, mut metrics, mut serving) = (None, None, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while serving < 2 {
        let l = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("the server started");
        if let Some(a) = l.strip_prefix("grpc listening on ") {
            grpc = Some(a.split(' ').next().unwrap().to_owned());
        }
        if let Some(a) = l.strip_prefix("metrics on http://") {
            metrics = Some(a.trim_end_matches("/metrics").to_owned());
        }
        serving += usize::from(l.starts_with("serving table `"));
    }
    let (grpc, metrics) = (grpc.expect("a grpc line"), metrics.expect("a metrics line"));
    assert_eq!(shm_tables(&tag).len(), 2, "one shared-memory table per [[tables]] entry");
    // "Clients name their table: `config.table = "replay".into()`".
    let client = |table: &str| {
        let mut c = ClusterConfig::new(vec![grpc.clone()], token);
        c.table = table.into();
        ClusterClient::new(c).unwrap()
    };
    let (replay, queue) = (client("replay"), client("queue"));
    let trajectory = |v: f32| RemoteTrajectory {
        steps: 2,
        columns: vec![(0..16).flat_map(|_| v.to_le_bytes()).collect::<Vec<u8>>().into()],
        priority: Some(1.0),
    };
    replay.insert(WriteTarget::Shard(0), vec![trajectory(1.0), trajectory(2.0)], 0).unwrap();
    queue.insert(WriteTarget::Shard(0), vec![trajectory(3.0), trajectory(4.0)], 0).unwrap();
    // The queue hands each trajectory to one reader, in order.
    let one = ClusterSample { rows: 1, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let first = queue.sample(&one).unwrap();
    let second = queue.sample(&one).unwrap();
    let value = |b: &gear_net::ClusterBatch| f32::from_le_bytes(b.columns[0][..4].try_into().unwrap());
    assert_eq!((value(&first), value(&second)), (3.0, 4.0));
    assert_eq!(queue.info(0).unwrap().size, 0, "max_times_sampled = 1: read once, then removed");
    // "a key of one table is stale on another".
    assert_eq!(
        replay.update_priorities(&[(first.keys[0], 5.0)]).unwrap(),
        gear_net::PriorityUpdates { applied: 0, stale: 1 }
    );
    let batch = replay
        .sample(&ClusterSample { rows: 4, window: WindowSpec::last(2), columns: vec![], random_start: false })
        .unwrap();
    assert_eq!(
        replay.update_priorities(&[(batch.keys[0], 5.0)]).unwrap(),
        gear_net::PriorityUpdates { applied: 1, stale: 0 }
    );
    // "a server with several refuses a call that names none, and an unknown
    // name, listing its tables".
    for name in ["", "nope"] {
        let e = client(name).info(0).unwrap_err().to_string();
        assert!(e.contains("replay") && e.contains("queue"), "{e}");
    }
    // The metrics, per table.
    let mut stream = std::net::TcpStream::connect(&metrics).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    use std::io::Write as _;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    for want in ["gear_table_inserts_total{table=\"replay\"} 2", "gear_table_retired_total{table=\"queue\"} 2"] {
        assert!(body.contains(want), "`{want}` missing from:\n{body}");
    }
    drop(server);
    assert_eq!(shm_tables(&tag), Vec::<String>::new(), "the server removes its tables");
    std::fs::remove_dir_all(&dir).unwrap();
}
