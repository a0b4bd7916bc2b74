//! DLPack export (the unversioned `dltensor` capsule of DLPack 0.8, which
//! `torch.from_dlpack`, `np.from_dlpack` and `jax.dlpack` all take).
//!
//! The capsule owns a `DLManagedTensor` whose `manager_ctx` holds an
//! [`Arc`] of the memory; the consumer calls `deleter` when its tensor
//! dies, which drops the `Arc`. No Python object is touched there, so the
//! deleter is safe to run on any thread, with or without the GIL. A
//! capsule never consumed is cleaned up by its own destructor.

use crate::error::{Error, Result};
use gear_core::DType;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// DLPack's `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DlDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

impl DlDevice {
    /// Host memory.
    pub(crate) const CPU: DlDevice = DlDevice { device_type: 1, device_id: 0 };

    /// CUDA device memory of device `id`.
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(id: i32) -> DlDevice {
        DlDevice { device_type: 2, device_id: id }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What keeps exported memory alive: dropped when the consumer lets go.
pub(crate) type Keepalive = Arc<dyn Send + Sync>;

/// The tensor's shape and owner, boxed behind `manager_ctx`.
struct ManagerContext {
    shape: Vec<i64>,
    _keepalive: Keepalive,
}

fn dl_dtype(dtype: DType) -> DlDataType {
    // DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
    let code = match dtype {
        DType::Bool => 6,
        DType::U8 => 1,
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 0,
        DType::F16 | DType::F32 | DType::F64 => 2,
        DType::BF16 => 4,
    };
    DlDataType { code, bits: (dtype.size() * 8) as u8, lanes: 1 }
}

const CAPSULE_NAME: &CStr = c"dltensor";

unsafe extern "C" fn delete_managed(managed: *mut DlManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` came from `Box::into_raw` in `export` and its
    // context from `Box::into_raw` too; DLPack calls the deleter once.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx.cast::<ManagerContext>()));
    }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule. A consumer that took
    // the tensor renamed it `used_dltensor` and owns it; only a capsule
    // still named `dltensor` is ours to free.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr()).cast::<DlManagedTensor>();
            if let Some(deleter) = managed.as_ref().and_then(|m| m.deleter) {
                deleter(managed);
            }
        } else {
            // PyCapsule_IsValid may set no error, but clear any to be safe.
            ffi::PyErr_Clear();
        }
    }
}

/// A capsule exporting `data` as a C-contiguous tensor of `shape` and
/// `dtype` on `device`.
///
/// # Safety
/// `data` must point to `product(shape) * dtype.size()` bytes that stay
/// valid (and in place) for as long as `keepalive` is alive.
pub(crate) unsafe fn export<'py>(
    py: Python<'py>,
    data: *mut u8,
    shape: &[usize],
    dtype: DType,
    device: DlDevice,
    keepalive: Keepalive,
) -> Result<Bound<'py, PyAny>> {
    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut ctx = Box::new(ManagerContext { shape, _keepalive: keepalive });
    let managed = Box::new(DlManagedTensor {
        dl_tensor: DlTensor {
            data: data.cast(),
            device,
            ndim: ctx.shape.len() as i32,
            dtype: dl_dtype(dtype),
            shape: ctx.shape.as_mut_ptr(),
            // NULL strides: compact row-major.
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_managed),
    });
    let managed = Box::into_raw(managed);
    // SAFETY: `managed` is a valid, uniquely owned pointer from
    // `Box::into_raw`; the shape vector lives in the context, which the
    // deleter frees together with the tensor.
    unsafe {
        (*managed).manager_ctx = Box::into_raw(ctx).cast();
        let capsule = ffi::PyCapsule_New(managed.cast(), CAPSULE_NAME.as_ptr(), Some(capsule_destructor));
        if capsule.is_null() {
            delete_managed(managed);
            return Err(Error::Python(PyErr::fetch(py)));
        }
        Ok(Bound::from_owned_ptr(py, capsule))
    }
}
