//! On a machine without a usable CUDA driver every entry point returns
//! `BackendUnavailable` instead of panicking. (On a GPU machine these
//! checks do not apply and the test says so.)

use gear_cuda::{probe, CudaDevice, Error};

#[test]
fn missing_driver_is_an_error_not_a_panic() {
    if probe::has_device() {
        println!("skipped: a CUDA device is present, nothing to check here");
        return;
    }
    let err = CudaDevice::new(0).unwrap_err();
    assert!(matches!(err, Error::BackendUnavailable(_)), "{err}");
    assert!(err.to_string().starts_with("cuda backend unavailable: "), "{err}");
    assert!(matches!(CudaDevice::count(), Err(Error::BackendUnavailable(_))));
    let bench = gear_cuda::bench::run_bench(&Default::default()).unwrap_err();
    assert!(matches!(bench, Error::BackendUnavailable(_)), "{bench}");
    // The probe is cached: asking again gives the same answer.
    assert_eq!(probe::driver().unwrap_err().to_string(), err.to_string());
    // Folded into gear-core's error for the trait methods, the reason survives.
    let core: gear_core::Error = err.into();
    assert!(core.to_string().contains("cuda backend unavailable"), "{core}");
}
