//! [`CudaDevice`]: one GPU's context, a work stream and the per-context
//! kernel cache.

use crate::error::{Error, Result};
use crate::kernels::{self, Compiled, KernelFn, KernelSource};
use crate::memory::{DeviceMemory, PinnedMemory, RegisteredRegion};
use crate::probe;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use gear_core::MemoryRegion;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// A handle to one CUDA device: its primary context, a stream that
/// collection and selection use unless given another, and the kernels
/// compiled for it. Cheap to clone (shared).
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    cc: (i32, i32),
    name: String,
    /// Modules compiled for this context, by source; functions by id.
    kernels: Mutex<KernelCache>,
    /// Every kernel by name, for the device trait's launches.
    loaded: Mutex<Option<Arc<crate::api::CudaKernels>>>,
}

#[derive(Default)]
struct KernelCache {
    functions: HashMap<KernelFn, CudaFunction>,
}

/// Where a module's code came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelOrigin {
    /// An image compiled at build time (`sm_XY` CUBIN or `compute_XY` PTX).
    Built(&'static str),
    /// Compiled by NVRTC at run time for this target, after `reason`
    /// (why no build-time image was used).
    Nvrtc {
        /// The `--gpu-architecture` used.
        target: String,
        /// Why no build-time image served.
        reason: String,
    },
}

/// Modules loaded in a device's primary context, once per process: every
/// [`CudaDevice`] of an ordinal shares them (each `CudaDevice::new` retains
/// the same primary context). A module holds its context, so it stays valid
/// for the life of the process.
type ModuleMap = HashMap<(usize, KernelSource), (Arc<CudaModule>, KernelOrigin)>;
static MODULES: Mutex<Option<ModuleMap>> = Mutex::new(None);

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.ctx.ordinal())
            .field("name", &self.inner.name)
            .field("compute_capability", &self.inner.cc)
            .finish()
    }
}

impl CudaDevice {
    /// Number of CUDA devices, or [`Error::BackendUnavailable`] when there
    /// is no usable driver or device.
    pub fn count() -> Result<usize> {
        Ok(probe::driver()?.devices)
    }

    /// Opens device `ordinal` (retains its primary context) and creates a
    /// work stream. Probes the driver first; never panics.
    pub fn new(ordinal: usize) -> Result<Self> {
        let info = probe::driver()?;
        if ordinal >= info.devices {
            return Err(Error::BackendUnavailable(format!(
                "device {ordinal} requested, the driver sees {} device(s)",
                info.devices
            )));
        }
        let open = || -> Result<DeviceInner> {
            let ctx = CudaContext::new(ordinal)?;
            let stream = ctx.new_stream()?;
            let cc = ctx.compute_capability()?;
            let name = ctx.name()?;
            Ok(DeviceInner { ctx, stream, cc, name, kernels: Mutex::default(), loaded: Mutex::default() })
        };
        let inner = catch_unwind(AssertUnwindSafe(open)).map_err(|_| {
            Error::BackendUnavailable(format!(
                "opening device {ordinal} panicked inside cudarc (driver version {} may lack a CUDA 13 entry point)",
                info.version
            ))
        })??;
        Ok(CudaDevice { inner: Arc::new(inner) })
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The stream this handle's collectors and selectors use by default.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.inner.ctx.new_stream()?)
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ctx.ordinal()
    }

    /// Device name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.cc
    }

    /// Waits for all work on the device's context.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.inner.ctx.synchronize()?)
    }

    /// Allocates `bytes` of device memory (contents undefined).
    pub fn alloc(&self, bytes: u64) -> Result<DeviceMemory> {
        DeviceMemory::alloc(&self.inner.ctx, bytes)
    }

    /// Allocates `bytes` of device memory filled with zeros.
    pub fn alloc_zeroed(&self, bytes: u64) -> Result<DeviceMemory> {
        let m = DeviceMemory::alloc(&self.inner.ctx, bytes)?;
        m.fill_async(0, &self.inner.stream)?;
        self.inner.stream.synchronize()?;
        Ok(m)
    }

    /// Allocates `bytes` of zeroed, page-locked host memory mapped for the
    /// device (`cuMemHostAlloc` with DEVICEMAP | PORTABLE).
    pub fn alloc_pinned(&self, bytes: u64) -> Result<PinnedMemory> {
        PinnedMemory::alloc(&self.inner.ctx, bytes)
    }

    /// Page-locks and maps an existing host region for the device
    /// (`cuMemHostRegister` with DEVICEMAP | PORTABLE), without copying.
    pub fn register<R: MemoryRegion>(&self, region: R) -> Result<RegisteredRegion<R>> {
        RegisteredRegion::register(&self.inner.ctx, region)
    }

    /// The kernel `f`, compiling and loading its source on first use.
    pub fn function(&self, f: KernelFn) -> Result<CudaFunction> {
        let mut cache = self.inner.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(func) = cache.functions.get(&f) {
            return Ok(func.clone());
        }
        let module = self.module(f.source())?.0;
        let func = module.load_function(f.name())?;
        cache.functions.insert(f, func.clone());
        Ok(func)
    }

    /// Every kernel, by name (loaded on first use, then shared).
    pub fn kernels(&self) -> Result<Arc<crate::api::CudaKernels>> {
        let mut loaded = self.inner.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = &*loaded {
            return Ok(k.clone());
        }
        let k = Arc::new(crate::api::CudaKernels::load(self)?);
        *loaded = Some(k.clone());
        Ok(k)
    }

    /// Loads every kernel now (once per process and device; later calls and
    /// other handles to the same device reuse the modules), so that a
    /// missing or unusable kernel image is reported here rather than by the
    /// first collection. Samplers call this at creation.
    pub fn warm_up(&self) -> Result<()> {
        for f in KernelFn::ALL {
            self.function(f)?;
        }
        Ok(())
    }

    /// Where `source`'s loaded module came from (loading it if needed).
    pub fn kernel_origin(&self, source: KernelSource) -> Result<KernelOrigin> {
        Ok(self.module(source)?.1)
    }

    fn module(&self, source: KernelSource) -> Result<(Arc<CudaModule>, KernelOrigin)> {
        let key = (self.ordinal(), source);
        let mut all = MODULES.lock().unwrap_or_else(|p| p.into_inner());
        let map = all.get_or_insert_with(HashMap::new);
        if let Some(m) = map.get(&key) {
            return Ok(m.clone());
        }
        let loaded = self.load(source)?;
        map.insert(key, loaded.clone());
        Ok(loaded)
    }

    /// Build-time images first (exact CUBIN, then PTX), NVRTC at run time
    /// only when none loads.
    fn load(&self, source: KernelSource) -> Result<(Arc<CudaModule>, KernelOrigin)> {
        let mut tried = Vec::new();
        for image in kernels::images_for(source, self.inner.cc) {
            match self.inner.ctx.load_module(image.to_ptx()) {
                Ok(m) => return Ok((m, KernelOrigin::Built(image.target))),
                Err(e) => tried.push(format!("build-time {} image: {e}", image.target)),
            }
        }
        if tried.is_empty() {
            tried.push(match kernels::build_nvrtc() {
                None => "the crate was built without NVRTC, so no kernel images are embedded".to_owned(),
                Some(_) => {
                    format!("no build-time image fits compute capability {}.{}", self.inner.cc.0, self.inner.cc.1)
                }
            });
        }
        let reason = tried.join("; ");
        let nv = probe::nvrtc()
            .map_err(|e| Error::BackendUnavailable(format!("{}: {reason}; and {e}", source.file_name())))?;
        let (major, minor) = self.inner.cc;
        let arch = kernels::target_for(self.inner.cc, &nv.archs).ok_or_else(|| {
            Error::BackendUnavailable(format!(
                "device has compute capability {major}.{minor}; NVRTC {}.{} supports only {:?}",
                nv.version.0, nv.version.1, nv.archs
            ))
        })?;
        let image = match kernels::compile(source, &arch)? {
            Compiled::Ptx(text) => cudarc::nvrtc::Ptx::from_src(text),
            Compiled::Cubin(bytes) => cudarc::nvrtc::Ptx::from_binary(bytes),
        };
        let module = self.inner.ctx.load_module(image).map_err(|e| {
            let driver = probe::driver().map(|d| d.version).unwrap_or(0);
            Error::BackendUnavailable(format!(
                "loading {} ({arch}, from NVRTC {}.{}) failed: {e}; the driver reports CUDA {}.{}, and code from \
                 NVRTC 13 needs a CUDA 13 driver (r580 or newer); before that: {reason}",
                source.file_name(),
                nv.version.0,
                nv.version.1,
                driver / 1000,
                driver % 1000 / 10
            ))
        })?;
        Ok((module, KernelOrigin::Nvrtc { target: arch, reason }))
    }
}
