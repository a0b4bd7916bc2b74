//! Builds the CPU device's kernels: every source in `kernels/` compiled as
//! C++ through the host shim (`cpu/shim.h`, `cpu/kernels.cpp`) with the
//! `cc` crate, so the CPU device runs the very code NVRTC compiles for a
//! GPU. Without a working C++ compiler the build still succeeds: it prints
//! a warning and sets `gear_no_cpu_kernels`, and `CpuDevice::new` then
//! reports the device unavailable (tests skip, or fail under
//! `GEAR_REQUIRE_CXX=1` as `.ci/run` sets it).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=cpu");
    println!("cargo:rustc-check-cfg=cfg(gear_no_cpu_kernels)");
    let built = cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .include("cpu")
        .include("kernels")
        .file("cpu/kernels.cpp")
        .try_compile("gear_cpu_kernels");
    if let Err(e) = built {
        println!("cargo:warning=gear-device: the CPU device's kernels did not build ({e}); CpuDevice is unavailable");
        println!("cargo:rustc-cfg=gear_no_cpu_kernels");
    }
}
