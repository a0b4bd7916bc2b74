//! The CPU shim's harness, shared by the tests that run kernels through
//! it (`cpu_shim.rs`, `cpu_shim_drawn.rs`): builds tests/shim/driver.cpp
//! (the kernel sources as C++) once per test process and talks to it in
//! little-endian words.

use gear_device::kernels::{KernelSource, COMMON_SOURCE};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const SHIM_H: &str = include_str!("../../cpu/shim.h");
const DRIVER_CPP: &str = include_str!("../shim/driver.cpp");

/// Builds the driver once per test process.
pub fn driver() -> Option<&'static PathBuf> {
    static DRIVER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = DRIVER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gear-device-shim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut files = vec![("shim.h", SHIM_H), ("driver.cpp", DRIVER_CPP), ("common.cuh", COMMON_SOURCE)];
        for s in KernelSource::ALL {
            files.push((s.file_name(), s.body()));
        }
        for (name, text) in files {
            std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))?;
        }
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        let exe = dir.join("driver");
        let out = Command::new(&cxx)
            .args(["-std=c++17", "-O2", "-Wall", "-Wextra", "-o"])
            .arg(&exe)
            .arg(dir.join("driver.cpp"))
            .output()
            .map_err(|e| format!("cannot run {cxx}: {e}"))?;
        if !out.status.success() {
            // A compiler that runs but rejects the kernels is a real failure.
            panic!("{cxx} failed to compile the kernels:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(warnings.trim().is_empty(), "{cxx} warnings in the kernels:\n{warnings}");
        Ok(exe)
    });
    match built {
        Ok(p) => Some(p),
        Err(e) => {
            super::skip("GEAR_REQUIRE_CXX", "no C++ compiler", e);
            None
        }
    }
}

pub fn run(exe: &PathBuf, input: &[u8]) -> Vec<u8> {
    let mut child =
        Command::new(exe).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "driver failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f(&mut self, v: f64) -> &mut Self {
        self.u(v.to_bits())
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
}

pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    pub fn u(&mut self) -> u64 {
        let (h, t) = self.0.split_at(8);
        self.0 = t;
        u64::from_le_bytes(h.try_into().unwrap())
    }
    pub fn f(&mut self) -> f64 {
        f64::from_bits(self.u())
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        h.to_vec()
    }
}
