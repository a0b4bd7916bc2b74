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
}
