//! Every kernel source compiles under NVRTC, for sm_80 and sm_90, both to
//! PTX (`compute_XY`, what the driver JIT-compiles) and to CUBIN (`sm_XY`,
//! what gear-cuda loads when NVRTC supports the device exactly), without
//! warnings. Needs only the NVRTC library, no GPU:
//!
//! ```text
//! export GEAR_NVRTC_DIR="$(gear-cuda/ci/install-nvrtc.sh)"
//! GEAR_REQUIRE_NVRTC=1 cargo test -p gear-cuda --test nvrtc_compile
//! ```
//!
//! Without NVRTC the tests print "skipped: NVRTC not found" and pass, unless
//! GEAR_REQUIRE_NVRTC=1.

mod common;

use gear_cuda::kernels::{compile, compile_log, Compiled, KernelSource};

const ARCHS: [&str; 4] = ["compute_80", "compute_90", "sm_80", "sm_90"];

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    let Some(info) = common::nvrtc_or_skip() else { return };
    println!("NVRTC {}.{} from {:?}, archs {:?}", info.version.0, info.version.1, info.preloaded_from, info.archs);
    for source in KernelSource::ALL {
        for arch in ARCHS {
            let out = compile(source, arch).unwrap_or_else(|e| panic!("{e}"));
            match (&out, arch.starts_with("sm_")) {
                (Compiled::Ptx(ptx), false) => {
                    for entry in source.entry_points() {
                        assert!(ptx.contains(&format!(".entry {entry}(")), "{arch}: {entry} missing from the PTX");
                    }
                    let target = arch.trim_start_matches("compute_");
                    assert!(ptx.contains(&format!(".target sm_{target}")), "{arch}: wrong target");
                }
                (Compiled::Cubin(bin), true) => {
                    assert!(bin.starts_with(b"\x7fELF"), "{arch}: CUBIN is not an ELF image");
                    for entry in source.entry_points() {
                        let needle = entry.as_bytes();
                        assert!(
                            bin.windows(needle.len()).any(|w| w == needle),
                            "{arch}: {entry} missing from the CUBIN"
                        );
                    }
                }
                _ => panic!("{arch}: wrong output kind"),
            }
        }
    }
}

#[test]
fn kernels_compile_without_warnings() {
    if common::nvrtc_or_skip().is_none() {
        return;
    }
    for source in KernelSource::ALL {
        let log = compile_log(source, "compute_90").unwrap_or_else(|e| panic!("{e}"));
        assert!(log.is_empty(), "{}: NVRTC warnings:\n{log}", source.file_name());
    }
}

/// The gather's aligned path really is 128-bit: the PTX has 16-byte vector
/// loads and stores (`.v2.u64` or `.v4.u32`).
#[test]
fn gather_moves_16_bytes_per_access() {
    if common::nvrtc_or_skip().is_none() {
        return;
    }
    let Compiled::Ptx(ptx) = compile(KernelSource::Gather, "compute_80").unwrap() else { panic!("expected PTX") };
    let vec_ld = ptx.lines().any(|l| {
        l.contains("ld.")
            && (l.contains(".v2.u64") || l.contains(".v2.b64") || l.contains(".v4.u32") || l.contains(".v4.b32"))
    });
    let vec_st = ptx.lines().any(|l| {
        l.contains("st.")
            && (l.contains(".v2.u64") || l.contains(".v2.b64") || l.contains(".v4.u32") || l.contains(".v4.b32"))
    });
    assert!(vec_ld && vec_st, "no 16-byte vector load/store in the gather PTX");
}

/// A source error comes back as a KernelCompile error carrying NVRTC's log,
/// not a panic.
#[test]
fn compile_errors_carry_the_log() {
    if common::nvrtc_or_skip().is_none() {
        return;
    }
    let err = compile(KernelSource::Gather, "compute_1").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("gather.cu") && msg.contains("compute_1"), "{msg}");
}
