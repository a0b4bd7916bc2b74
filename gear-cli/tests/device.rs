//! `gear device-soak` and `gear train-bench` on gear-device's CPU device,
//! as the GPU package runs them on CUDA (`./run.sh soak`, `./run.sh
//! train`): short runs that must pass their own checks and print the
//! documented JSON. (The CPU device's figures are not GPU figures; nothing
//! here looks at them.)

use std::process::Command;

fn gear(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gear")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn cpu_device_built() -> bool {
    let ok = gear_device::CpuDevice::new().is_ok();
    if !ok {
        assert!(std::env::var("GEAR_REQUIRE_CXX").map_or(true, |v| v != "1"), "GEAR_REQUIRE_CXX=1: no CPU device");
        println!("skipped: the CPU device has no kernels (no C++ compiler at build time)");
    }
    ok
}

#[test]
fn the_device_soak_checks_every_row_with_writer_processes_evicting() {
    if !cpu_device_built() {
        return;
    }
    let (ok, out, err) = gear(&[
        "device-soak",
        "--backend",
        "cpu-device",
        "--seconds",
        "3",
        // One writer over 4096 slots still evicts every slot many times
        // in the run, but leaves the sampler whole batches: with 2 writers
        // over 128 slots every row of ring 2 was torn on a loaded 2-core
        // machine and the ring produced no batch in its 1.5 s.
        "--writers",
        "1",
        "--capacity",
        "4096",
        "--max-len",
        "16",
        "--obs-bytes",
        "32",
        "--batch",
        "16",
        "--window",
        "8",
        "--json",
    ]);
    assert!(ok, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["bad_rows"], 0, "{out}");
    let rings = v["rings"].as_array().unwrap();
    assert_eq!(rings.iter().map(|r| r["ring"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 3]);
    for r in rings {
        assert!(r["batches"].as_u64().unwrap() > 0, "{out}");
        assert_eq!(r["timeouts"], 0, "{out}");
        assert!(r["device_batches"].as_u64().unwrap() > 0, "selection on the device: {out}");
        assert_eq!(r["rows_checked"].as_u64().unwrap(), 16 * r["batches"].as_u64().unwrap());
    }
    assert!(v["trajectories_written"].as_u64().unwrap() > 0 && v["evictions"].as_u64().unwrap() > 0, "{out}");
}

#[test]
fn the_trainer_stand_in_reports_both_feeds_for_every_configuration() {
    if !cpu_device_built() {
        return;
    }
    let (ok, out, err) = gear(&[
        "train-bench",
        "--backend",
        "cpu-device",
        "--batches",
        "8,32",
        "--windows",
        "8,16",
        "--obs-bytes",
        "64",
        "--step-ms",
        "1",
        "--steps",
        "3",
        "--capacity",
        "64",
        "--max-batch-mib",
        "1",
        "--json",
    ]);
    assert!(ok, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["device"].as_str().unwrap().starts_with("cpu-device"));
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 8, "two feeds x two batch sizes x two windows: {out}");
    for r in results {
        let feed = r["feed"].as_str().unwrap();
        assert!(["gear-device-sampler", "host-gather-pinned-copy"].contains(&feed));
        assert!(r["steps_per_s"].as_f64().unwrap() > 0.0);
        let w = r["data_wait_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&w), "{r}");
        assert_eq!(
            r["batch_bytes"].as_u64().unwrap(),
            r["batch"].as_u64().unwrap() * r["window"].as_u64().unwrap() * 72
        );
    }
    // A configuration over the size cap is skipped, not run.
    let (ok, out, _) = gear(&[
        "train-bench",
        "--backend",
        "cpu-device",
        "--batches",
        "64",
        "--windows",
        "16",
        "--obs-bytes",
        "2048",
        "--steps",
        "1",
        "--capacity",
        "64",
        "--max-batch-mib",
        "1",
        "--json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["skipped"], serde_json::json!([[64, 16]]));
    // An unknown device is a clear error.
    let (ok, _, err) = gear(&["train-bench", "--backend", "tpu"]);
    assert!(!ok && err.contains("unknown device `tpu`"), "{err}");
}
