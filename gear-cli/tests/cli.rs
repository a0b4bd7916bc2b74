//! The `gear` binary as a user runs it.

use std::process::Command;

fn gear(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gear")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn bench_json_prints_the_documented_fields() {
    let (ok, out, err) = gear(&[
        "bench",
        "--json",
        "--steps",
        "8",
        "--step-bytes",
        "64",
        "--capacity",
        "16",
        "--inserts",
        "40",
        "--batches",
        "5",
        "--batch",
        "4",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for k in [
        "insert_traj_per_s",
        "insert_gb_per_s",
        "sample_traj_per_s",
        "sample_gb_per_s",
        "memcpy_gb_per_s",
        "sample_memcpy_gb_per_s",
        "sample_vs_memcpy",
        "random_line_reads_per_s",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} missing or not positive in {out}");
    }
    assert_eq!(v["evictions"], 24);
}

#[test]
fn bench_accepts_every_strategy_and_writer_processes() {
    for s in ["uniform", "prioritized", "fifo", "lifo", "max-heap", "min-heap"] {
        let (ok, out, err) = gear(&[
            "bench",
            "--json",
            "--steps",
            "4",
            "--step-bytes",
            "16",
            "--capacity",
            "8",
            "--inserts",
            "12",
            "--batches",
            "3",
            "--batch",
            "2",
            "--sampler",
            s,
            "--window-len",
            "2",
            "--window-offset",
            "-2",
        ]);
        assert!(ok, "{s}: {err}");
        assert!(out.contains(&format!("\"sampler\":\"{s}\"")), "{out}");
    }
    let (ok, out, err) = gear(&[
        "bench",
        "--json",
        "--writers",
        "2",
        "--steps",
        "4",
        "--step-bytes",
        "16",
        "--capacity",
        "8",
        "--inserts",
        "20",
        "--batches",
        "3",
        "--batch",
        "2",
        "--insert-batch",
        "3",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["writers"], 2);
    assert!(v["memcpy_2t_gb_per_s"].as_f64().is_some());
    assert_eq!(v["evictions"], 12, "all 20 trajectories went in, in batches of 3: {out}");
    let (ok, _, err) = gear(&["bench", "--insert-batch", "0"]);
    assert!(!ok && err.contains("--insert-batch"), "{err}");
    let (ok, _, err) = gear(&["bench", "--sampler", "best"]);
    assert!(!ok && err.contains("unknown selection strategy `best`"), "{err}");
}

#[test]
fn demo_runs_with_processes_and_with_threads() {
    for extra in [&[][..], &["--threads"][..]] {
        let mut args =
            vec!["demo", "--seconds", "1", "--actors", "2", "--capacity", "64", "--batch", "8", "--window", "8"];
        args.extend_from_slice(extra);
        let (ok, out, err) = gear(&args);
        assert!(ok, "demo {extra:?} failed:\n{out}\n{err}");
        assert!(out.contains("gear demo summary") && out.contains("rows checked"), "{out}");
        assert_eq!(out.matches("actor ").count(), 2, "{out}");
    }
    let (ok, _, err) = gear(&["demo", "--seconds", "0"]);
    assert!(!ok && err.contains("--seconds"), "{err}");
}

#[test]
fn serve_runs_a_configured_table_and_refuses_a_bad_config() {
    let dir = std::env::temp_dir().join(format!("gear-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        format!(
            "name = \"gear-cli-serve-{}\"\nmax_len = 4\ncapacity = 4\n[[columns]]\nname = \"x\"\ndtype = \"f32\"\nshape = [2]\n",
            std::process::id()
        ),
    )
    .unwrap();
    let (ok, out, err) = gear(&["serve", "--config", good.to_str().unwrap(), "--seconds", "0.3"]);
    assert!(ok && out.contains("serving table") && out.contains("closed"), "{out}{err}");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\nmax_len = 4\ncapacity = 4\n[[columns]]\nname = \"x\"\ndtype = \"f31\"\n")
        .unwrap();
    let (ok, _, err) = gear(&["serve", "--config", bad.to_str().unwrap(), "--seconds", "0.3"]);
    assert!(!ok && err.contains("unknown dtype `f31`"), "{err}");
    let (ok, _, err) = gear(&["serve", "--config", dir.join("missing.toml").to_str().unwrap()]);
    assert!(!ok && err.contains("cannot read config"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn absurd_durations_are_refused_not_panicked_on() {
    for cmd in ["serve", "demo"] {
        for value in ["nan", "inf", "1e300", "-1", "0", "soon"] {
            let flag = format!("--seconds={value}");
            let args: Vec<&str> =
                if cmd == "serve" { vec![cmd, "--config", "unused.toml", &flag] } else { vec![cmd, &flag] };
            let out = Command::new(env!("CARGO_BIN_EXE_gear")).args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            // 2: refused as a usage error; 101 would be a panic, None a signal.
            assert_eq!(out.status.code(), Some(2), "{cmd} {flag}: {err}");
            assert!(err.contains("seconds") && !err.contains("panicked"), "{cmd} {flag}: {err}");
        }
    }
    let (ok, _, err) = gear(&["bench", "--shards", "100000", "--inserts", "4"]);
    assert!(!ok && err.contains("--shards 100000 is above") && !err.contains("panicked"), "{err}");
    let (ok, _, err) =
        gear(&["bench", "--batch", "1099511627776", "--inserts", "4", "--capacity", "4", "--steps", "2"]);
    assert!(!ok && err.contains("batch size 1099511627776 is above the limit") && !err.contains("panicked"), "{err}");
    // An insert batch whose staging would not fit in memory: an error, not
    // an allocation abort.
    let (ok, _, err) = gear(&[
        "bench",
        "--insert-batch",
        "99999999999",
        "--inserts",
        "99999999999",
        "--steps",
        "1",
        "--step-bytes",
        "56",
        "--capacity",
        "10",
    ]);
    assert!(!ok && err.contains("use a smaller --insert-batch") && !err.contains("memory allocation"), "{err}");
}
