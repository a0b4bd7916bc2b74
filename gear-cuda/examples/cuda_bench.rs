//! Runs `gear_cuda::bench::run_bench` and prints the report: zero-copy
//! gather, device-cache gather and a device-to-device copy of the same
//! bytes, in GB/s.
//!
//! ```text
//! cargo run -p gear-cuda --release --example cuda_bench -- [batch] [window] [step_bytes]
//! ```
//!
//! Exits 1 with the reason when there is no usable device.

fn main() {
    let mut params = gear_cuda::bench::CudaBenchParams::default();
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap_or_else(|_| panic!("expected a number, got `{a}`")))
        .collect();
    if let Some(&b) = args.first() {
        params.batch = b as usize;
    }
    if let Some(&w) = args.get(1) {
        params.window = w;
    }
    if let Some(&s) = args.get(2) {
        params.step_bytes = vec![s];
    }
    match gear_cuda::bench::run_bench(&params) {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("cuda bench: {e}");
            std::process::exit(1);
        }
    }
    if let Err(e) = top_k_times() {
        eprintln!("cuda bench: top-k: {e}");
        std::process::exit(1);
    }
}

/// Wall-clock time of `DevicePriorities::top_k` over one million
/// priorities for k from 1 to n (results read back included), checked
/// against a host sort.
fn top_k_times() -> gear_cuda::Result<()> {
    let dev = gear_cuda::CudaDevice::new(0)?;
    let n = 1u64 << 20;
    let mut prios = gear_cuda::DevicePriorities::new(&dev, n)?;
    let values: Vec<(u32, f64)> =
        (0..n as u32).map(|i| (i, f64::from((i.wrapping_mul(2_654_435_761)) % 100_003))).collect();
    prios.set(&values)?;
    let mut want: Vec<(u32, f64)> = values.clone();
    want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    prios.top_k(1)?; // warm-up
    for k in [1usize, 1000, 100_000, n as usize] {
        let t = std::time::Instant::now();
        let got = prios.top_k(k)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let ok = got[..] == want[..k];
        println!("cuda_top_k n {n} k {k:>7}: {ms:>8.2} ms (matches a host sort: {ok})");
        if !ok {
            return Err(gear_cuda::Error::InvalidArgument(format!("top-k of {k} differs from the host sort")));
        }
    }
    Ok(())
}
