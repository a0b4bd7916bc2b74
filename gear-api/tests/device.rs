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

/// A device strategy as the table's strategy draws for host samplers with
/// the table lock released: its device round trip (here held up behind a
/// long kernel on the strategy's stream) must not keep writers out. It
/// once drew under the process-shared lock, so a writer of any process
/// waited for the device.
#[test]
fn device_strategies_draw_without_holding_the_table_lock() {
    use gear_api::{ReplayTable, SampleConfig, StepValue};
    use gear_core::{Device, WindowSpec};
    use gear_device::{CpuDeviceApi, DevicePrioritized, TrainStep};
    use std::time::Duration;
    let Some(dev) = cpu_device() else { return };
    let strategy = DevicePrioritized::<CpuDeviceApi>::new(&dev, 1.0, 0.0).unwrap();
    let table = ReplayTable::builder(sampler_suite::spec(12, 16)).sampler(strategy).build().unwrap();
    for id in 0..8u8 {
        sampler_suite::write_traj(&table, id, 6);
    }
    let step = TrainStep::<CpuDeviceApi>::new(&dev).unwrap();
    let buf = dev.alloc(64).unwrap();
    // Dropped first, also when an assertion fails: the step must be done
    // before `buf` is freed.
    struct WaitOnDrop(gear_device::CpuDevice);
    impl Drop for WaitOnDrop {
        fn drop(&mut self) {
            let _ = self.0.synchronize();
        }
    }
    let _wait = WaitOnDrop(dev.clone());
    step.queue(dev.stream(), &[&buf], Duration::from_millis(2500)).unwrap();
    let t = table.clone();
    let draw = std::thread::spawn(move || {
        let mut s = t.sampler(SampleConfig::new(4, WindowSpec::last(3))).unwrap();
        s.sample().map(|b| b.rows())
    });
    // Let the draw reach the device and wait there.
    std::thread::sleep(Duration::from_millis(400));
    let mut w = table.writer().with_timeout(Duration::from_millis(800)).begin(Some(1.0)).unwrap();
    for s in 0..3u8 {
        w.append_step(&[
            StepValue::typed(&[s; 37]),
            StepValue::typed(&[i32::from(s)]),
            StepValue::typed(&[0.0f64, 0.0]),
        ])
        .unwrap();
    }
    w.end().expect("a writer committed while a device draw waited");
    assert_eq!(draw.join().unwrap().unwrap(), 4);
    dev.synchronize().unwrap();
}
