//! The raw CUDA types, error codes and the one struct layout the hook reads. Error codes stay plain
//! integers: a Rust enum receiving a value it does not list would be undefined behaviour.
//!
//! Written by hand on purpose: cudarc's raw driver bindings (the maintained binding the design
//! named) cost 11.8 s of compile time on the 2-core build machine with only `driver`, one CUDA
//! version and dynamic loading (cudarc 0.19.10, measured 2026-11-22), for the handful of integers
//! and one struct prefix used here. NVML's structs do come from a binding (`nvml-wrapper-sys`, see
//! `crate::nvml`): cudarc has no NVML module.

use std::ffi::{c_int, c_void};

pub type CuResult = c_int;
pub type CudaError = c_int;
pub type CuDevicePtr = u64;
pub type CuDevice = c_int;
pub type CuStream = *mut c_void;
pub type CuMemPool = *mut c_void;
pub type CuMemHandle = u64;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
/// Runtime: `cudaErrorMemoryAllocation`.
pub const CUDART_ERROR_MEMORY_ALLOCATION: CudaError = 2;
/// Runtime: `cudaErrorInsufficientDriver`, what the runtime says when there is no usable driver.
pub const CUDART_ERROR_INSUFFICIENT_DRIVER: CudaError = 35;

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// Prefix of `CUmemAllocationProp` and of `CUmemPoolProps` up to their location, which is all the
/// hook reads (both structs open with two enums, then a `CUmemLocation`).
#[repr(C)]
pub struct CuLocationHead {
    pub alloc_type: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}
