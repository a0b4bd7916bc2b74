//! The device test suite (`tests/suite/mod.rs`) on the CPU device: the
//! same tests `gear-cuda/tests/device.rs` runs on a GPU, run in every CI
//! run. Each device is made with the default options, so any misuse of
//! the ordering rules by the code under test panics the test.

mod common;
mod suite;

device_suite!(gear_device::CpuDeviceApi, common::cpu_device());
