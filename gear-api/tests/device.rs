//! The device sampler on gear-device's CPU device, in every CI run: the
//! sampler suite (`tests/sampler_suite/mod.rs`, the same tests
//! `tests/cuda.rs` runs on a GPU) through the real protocol (ring,
//! prefetch, trainer-stream events, selection on the device, the change
//! log), on a device that runs the GPU kernels and panics on any use after
//! free, read before its event or unordered write.
//!
//! Without a C++ compiler at build time the CPU device has no kernels and
//! the tests print "skipped" (a failure under GEAR_REQUIRE_CXX=1).

mod sampler_suite;

fn cpu_device() -> Option<gear_device::CpuDevice> {
    match gear_device::CpuDevice::new() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("GEAR_REQUIRE_CXX").is_ok_and(|v| v == "1") => {
            panic!("GEAR_REQUIRE_CXX=1 but the CPU device is unavailable: {e}")
        }
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
}

sampler_suite!(gear_device::CpuDeviceApi, cpu_device());

#[test]
fn device_sampler_is_send() {
    fn send<T: Send>() {}
    send::<gear_api::DeviceSampler<gear_device::CpuDeviceApi>>();
    send::<gear_api::DeviceSamplerOptions<gear_device::CpuDeviceApi>>();
}
