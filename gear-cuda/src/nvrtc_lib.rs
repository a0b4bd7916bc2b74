//! A minimal NVRTC binding loaded from an explicit path.
//!
//! cudarc's NVRTC bindings `dlopen` a list of sonames (`libnvrtc.so` first),
//! so whichever library the loader finds first wins, and a directory named
//! by `GEAR_NVRTC_DIR` could be bypassed by another NVRTC on the search
//! path. This module opens the library it is given by path (or, without a
//! path, by the loader's search for `libnvrtc.so.13`) and resolves the dozen
//! entry points gear-cuda needs from that handle only.
//!
//! It depends on nothing but `std` and `libc`, so `build.rs` includes the
//! same file (`#[path]`) to compile the kernels to PTX and CUBIN at build
//! time.
#![allow(dead_code)] // build.rs uses a subset

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

type Status = c_int;
type Program = *mut c_void;

/// NVRTC's major version the crate is written against.
pub const NVRTC_MAJOR: u32 = 13;

type FnVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status;
type FnInt = unsafe extern "C" fn(*mut c_int) -> Status;
type FnCreate = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> Status;
type FnCompile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status;
type FnSize = unsafe extern "C" fn(Program, *mut usize) -> Status;
type FnBytes = unsafe extern "C" fn(Program, *mut c_char) -> Status;
type FnDestroy = unsafe extern "C" fn(*mut Program) -> Status;
type FnErrorString = unsafe extern "C" fn(Status) -> *const c_char;

/// The entry points, resolved from one library handle.
struct Fns {
    version: FnVersion,
    num_archs: FnInt,
    archs: FnInt,
    create: FnCreate,
    compile: FnCompile,
    log_size: FnSize,
    log: FnBytes,
    ptx_size: FnSize,
    ptx: FnBytes,
    cubin_size: FnSize,
    cubin: FnBytes,
    destroy: FnDestroy,
    error_string: FnErrorString,
}

/// A loaded NVRTC library. The handle is never closed (NVRTC keeps global
/// state; unloading it mid-process is not supported by NVIDIA either).
pub struct NvrtcLib {
    fns: Fns,
    /// The file that was opened (or the soname searched for).
    pub path: PathBuf,
}

// SAFETY: the function pointers refer to a library that is never unloaded;
// NVRTC's API is thread-safe for distinct programs.
unsafe impl Send for NvrtcLib {}
// SAFETY: as above.
unsafe impl Sync for NvrtcLib {}

/// What a compilation produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    /// PTX text (a virtual `compute_XY` target).
    Ptx(String),
    /// A CUBIN image (a real `sm_XY` target).
    Cubin(Vec<u8>),
}

/// Why a compilation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileFailure {
    /// An NVRTC call other than the compile itself failed.
    Call(String),
    /// The source did not compile; NVRTC's status and program log.
    Source(String),
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the
    // next dl* call on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".to_owned()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// `dlopen(name, RTLD_NOW | RTLD_GLOBAL)`; the handle is leaked on purpose.
fn dlopen(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("{name}: contains a NUL byte"))?;
    // SAFETY: `c` is a valid C string for the call; loading runs NVRTC's
    // initialisers, which have no preconditions.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        Err(format!("cannot load {name}: {}", dl_error()))
    } else {
        Ok(h)
    }
}

fn sym(handle: *mut c_void, name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("{name}: contains a NUL byte"))?;
    // SAFETY: `handle` is a live handle from dlopen; `c` is a C string.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        Err(format!("NVRTC lacks `{name}` (an older NVRTC than {NVRTC_MAJOR}?)"))
    } else {
        Ok(p)
    }
}

/// The NVRTC files in `dir`: builtins libraries and the main library (the
/// longest `libnvrtc.so*` name, i.e. the versioned file). `.alt` variants
/// are skipped.
pub fn files_in(dir: &Path) -> Result<(Vec<PathBuf>, PathBuf), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut builtins = Vec::new();
    let mut main = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(".alt.") || !name.contains(".so") {
            continue;
        }
        if name.starts_with("libnvrtc-builtins") {
            builtins.push(entry.path());
        } else if name.starts_with("libnvrtc.so") {
            main.push(entry.path());
        }
    }
    main.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    match main.into_iter().next() {
        Some(m) => Ok((builtins, m)),
        None => Err(format!("{}: no libnvrtc.so* in that directory", dir.display())),
    }
}

impl NvrtcLib {
    /// Opens NVRTC from `dir` by path: its builtins first (NVRTC opens them
    /// by soname, which then resolves to the loaded copy), then the library.
    pub fn open_dir(dir: &Path) -> Result<Self, String> {
        let (builtins, main) = files_in(dir)?;
        for b in &builtins {
            dlopen(&b.to_string_lossy())?;
        }
        Self::open_file(&main)
    }

    /// Opens the NVRTC library at `path`.
    pub fn open_file(path: &Path) -> Result<Self, String> {
        let handle = dlopen(&path.to_string_lossy())?;
        Self::resolve(handle, path.to_path_buf())
    }

    /// Opens `libnvrtc.so.13` (then `libnvrtc.so`) through the loader's
    /// search path.
    pub fn open_default() -> Result<Self, String> {
        let mut errors = Vec::new();
        for name in [format!("libnvrtc.so.{NVRTC_MAJOR}"), "libnvrtc.so".to_owned()] {
            match dlopen(&name) {
                Ok(h) => return Self::resolve(h, PathBuf::from(name)),
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join("; "))
    }

    fn resolve(h: *mut c_void, path: PathBuf) -> Result<Self, String> {
        macro_rules! f {
            ($name:literal, $ty:ty) => {
                // SAFETY: the symbol is the NVRTC API function `$name`, whose
                // C prototype (nvrtc.h, CUDA 11 to 13) matches the field's
                // type; the library is never unloaded.
                unsafe { std::mem::transmute::<*mut c_void, $ty>(sym(h, $name)?) }
            };
        }
        let fns = Fns {
            version: f!("nvrtcVersion", FnVersion),
            num_archs: f!("nvrtcGetNumSupportedArchs", FnInt),
            archs: f!("nvrtcGetSupportedArchs", FnInt),
            create: f!("nvrtcCreateProgram", FnCreate),
            compile: f!("nvrtcCompileProgram", FnCompile),
            log_size: f!("nvrtcGetProgramLogSize", FnSize),
            log: f!("nvrtcGetProgramLog", FnBytes),
            ptx_size: f!("nvrtcGetPTXSize", FnSize),
            ptx: f!("nvrtcGetPTX", FnBytes),
            cubin_size: f!("nvrtcGetCUBINSize", FnSize),
            cubin: f!("nvrtcGetCUBIN", FnBytes),
            destroy: f!("nvrtcDestroyProgram", FnDestroy),
            error_string: f!("nvrtcGetErrorString", FnErrorString),
        };
        Ok(NvrtcLib { fns, path })
    }

    fn check(&self, what: &str, s: Status) -> Result<(), String> {
        if s == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static C string for any code.
        let msg = unsafe {
            let p = (self.fns.error_string)(s);
            if p.is_null() {
                format!("status {s}")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(format!("{what}: {msg}"))
    }

    /// NVRTC's (major, minor) version.
    pub fn version(&self) -> Result<(i32, i32), String> {
        let (mut a, mut b) = (0, 0);
        // SAFETY: two valid out-pointers.
        self.check("nvrtcVersion", unsafe { (self.fns.version)(&mut a, &mut b) })?;
        Ok((a, b))
    }

    /// The real architectures NVRTC compiles for (75, 80, 86, 90, ...).
    pub fn archs(&self) -> Result<Vec<i32>, String> {
        let mut n = 0;
        // SAFETY: a valid out-pointer.
        self.check("nvrtcGetNumSupportedArchs", unsafe { (self.fns.num_archs)(&mut n) })?;
        let mut v = vec![0; n.max(0) as usize];
        // SAFETY: `v` holds the number of entries NVRTC reported.
        self.check("nvrtcGetSupportedArchs", unsafe { (self.fns.archs)(v.as_mut_ptr()) })?;
        Ok(v)
    }

    /// Compiles `source` (named `name` in messages) with `options`; returns
    /// PTX for a `compute_XY` architecture, a CUBIN for `sm_XY`, and
    /// NVRTC's log (warnings; empty when clean).
    pub fn compile(&self, source: &str, name: &str, arch: &str) -> Result<(Image, String), CompileFailure> {
        let call = CompileFailure::Call;
        let src = CString::new(source).map_err(|_| call(format!("{name}: source contains a NUL byte")))?;
        let cname = CString::new(name).map_err(|_| call(format!("{name}: name contains a NUL byte")))?;
        let opts: Vec<CString> = [format!("--gpu-architecture={arch}"), "--std=c++17".to_owned()]
            .into_iter()
            .map(|o| CString::new(o).expect("options have no NUL"))
            .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid out-pointer and C strings; no headers.
        let s = unsafe {
            (self.fns.create)(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null())
        };
        self.check("nvrtcCreateProgram", s).map_err(call)?;
        let result = self.compile_program(prog, arch, &opt_ptrs);
        // SAFETY: `prog` was created above and is destroyed once.
        let _ = unsafe { (self.fns.destroy)(&mut prog) };
        result
    }

    fn compile_program(
        &self,
        prog: Program,
        arch: &str,
        opts: &[*const c_char],
    ) -> Result<(Image, String), CompileFailure> {
        let call = CompileFailure::Call;
        // SAFETY: `prog` is live; `opts` points to live C strings.
        let status = unsafe { (self.fns.compile)(prog, opts.len() as c_int, opts.as_ptr()) };
        let mut n = 0usize;
        // SAFETY: live program, valid out-pointer.
        self.check("nvrtcGetProgramLogSize", unsafe { (self.fns.log_size)(prog, &mut n) }).map_err(call)?;
        let mut log = vec![0u8; n.max(1)];
        // SAFETY: `log` holds the size NVRTC reported.
        self.check("nvrtcGetProgramLog", unsafe { (self.fns.log)(prog, log.as_mut_ptr().cast()) }).map_err(call)?;
        let log = String::from_utf8_lossy(&log).trim_end_matches('\0').trim().to_owned();
        if let Err(e) = self.check("nvrtcCompileProgram", status) {
            return Err(CompileFailure::Source(format!("{e}: {log}")));
        }
        let cubin = arch.starts_with("sm_");
        let (size_fn, get_fn) =
            if cubin { (self.fns.cubin_size, self.fns.cubin) } else { (self.fns.ptx_size, self.fns.ptx) };
        let mut n = 0usize;
        // SAFETY: live, compiled program; valid out-pointer.
        self.check("nvrtcGet{PTX,CUBIN}Size", unsafe { size_fn(prog, &mut n) }).map_err(call)?;
        let mut out = vec![0u8; n];
        // SAFETY: `out` holds the size NVRTC reported.
        self.check("nvrtcGet{PTX,CUBIN}", unsafe { get_fn(prog, out.as_mut_ptr().cast()) }).map_err(call)?;
        let image = if cubin {
            Image::Cubin(out)
        } else {
            let end = out.iter().position(|&b| b == 0).unwrap_or(out.len());
            out.truncate(end);
            Image::Ptx(String::from_utf8_lossy(&out).into_owned())
        };
        Ok((image, log))
    }
}

/// FNV-1a of `bytes`: recorded beside build-time images so a test can check
/// they were compiled from the sources now embedded.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
