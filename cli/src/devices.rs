//! The devices `fit` may run trials on, and how much memory each has free: from NVML
//! (`libnvidia-ml.so.1`, or `$GPUMEMHOOK_NVML_LIB`), loaded at run time, never linked, so that the
//! command runs on machines without a driver too.
//!
//! `CUDA_VISIBLE_DEVICES` is honoured as CUDA reads it where it names devices by index (NVML's
//! order, which is CUDA's under `CUDA_DEVICE_ORDER=PCI_BUS_ID`) or by UUID (`GPU-...`, or a prefix
//! of one); each trial is then started with `CUDA_VISIBLE_DEVICES` set to its device's UUID, which
//! means the same device to CUDA and NVML whatever their orders.

use gpumemhook_reader::env;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlMemory_t, NvmlLib};
use std::ffi::{c_char, CStr};

/// One device a trial can run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// NVML's index.
    pub index: u32,
    /// `GPU-...`: what the trial's `CUDA_VISIBLE_DEVICES` names.
    pub uuid: String,
    /// Bytes free when `fit` started (the device's total less what others already hold).
    pub free: u64,
    /// The device's total bytes.
    pub total: u64,
}

/// The visible devices with their memory, or why they cannot be known.
pub fn visible() -> Result<Vec<Device>, String> {
    let name = std::env::var_os(env::NVML_LIB)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "libnvidia-ml.so.1".into());
    if name == "none" {
        return Err(format!("${} is none", env::NVML_LIB));
    }
    // SAFETY: loading NVML runs its initialisers, which have no preconditions; every function is
    // checked for presence below before it is called.
    let nvml = unsafe { NvmlLib::new(&name) }
        .map_err(|e| format!("cannot load {}: {e}", name.to_string_lossy()))?;
    let present = nvml.nvmlInit_v2.is_ok()
        && nvml.nvmlShutdown.is_ok()
        && nvml.nvmlDeviceGetCount_v2.is_ok()
        && nvml.nvmlDeviceGetHandleByIndex_v2.is_ok()
        && nvml.nvmlDeviceGetMemoryInfo.is_ok()
        && nvml.nvmlDeviceGetUUID.is_ok();
    if !present {
        return Err(format!(
            "{} lacks a function fit needs",
            name.to_string_lossy()
        ));
    }
    // SAFETY: the function is present (checked above) and takes no arguments.
    let rc = unsafe { nvml.nvmlInit_v2() };
    if rc != 0 {
        return Err(format!("nvmlInit_v2 failed ({rc})"));
    }
    let devices = read_devices(&nvml);
    // SAFETY: NVML was initialised above; shutdown balances that init.
    unsafe { nvml.nvmlShutdown() };
    let filter = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    Ok(visible_only(devices?, filter.as_deref()))
}

fn read_devices(nvml: &NvmlLib) -> Result<Vec<Device>, String> {
    let mut count = 0u32;
    // SAFETY: NVML is initialised and `count` is a valid out-pointer.
    let rc = unsafe { nvml.nvmlDeviceGetCount_v2(&mut count) };
    if rc != 0 {
        return Err(format!("nvmlDeviceGetCount_v2 failed ({rc})"));
    }
    let mut devices = Vec::new();
    for index in 0..count {
        let mut handle: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; a bad index is an error code, not UB.
        let rc = unsafe { nvml.nvmlDeviceGetHandleByIndex_v2(index, &mut handle) };
        if rc != 0 {
            return Err(format!("device {index}: no handle ({rc})"));
        }
        let mut memory = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: `handle` came from NVML and `memory` is a valid out-pointer of the right layout.
        let rc = unsafe { nvml.nvmlDeviceGetMemoryInfo(handle, &mut memory) };
        if rc != 0 {
            return Err(format!("device {index}: no memory figures ({rc})"));
        }
        // NVML_DEVICE_UUID_V2_BUFFER_SIZE is 96.
        let mut uuid = [0 as c_char; 96];
        // SAFETY: the buffer holds `uuid.len()` bytes, which NVML fills with a NUL-terminated string.
        let rc = unsafe { nvml.nvmlDeviceGetUUID(handle, uuid.as_mut_ptr(), uuid.len() as u32) };
        if rc != 0 {
            return Err(format!("device {index}: no UUID ({rc})"));
        }
        // SAFETY: NVML wrote a NUL-terminated string inside the buffer (it is zeroed past it).
        let uuid = unsafe { CStr::from_ptr(uuid.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        devices.push(Device {
            index,
            uuid,
            free: memory.free,
            total: memory.total,
        });
    }
    Ok(devices)
}

/// The devices `CUDA_VISIBLE_DEVICES` leaves visible: every one when it is unset; those it names
/// by index or by (a prefix of) UUID, up to the first entry that names none, as CUDA reads it.
fn visible_only(devices: Vec<Device>, filter: Option<&str>) -> Vec<Device> {
    let Some(filter) = filter else {
        return devices;
    };
    let mut chosen = Vec::new();
    for entry in filter.split(',').map(str::trim) {
        let found = match entry.parse::<u32>() {
            Ok(i) => devices.iter().find(|d| d.index == i),
            Err(_) if entry.starts_with("GPU-") => {
                devices.iter().find(|d| d.uuid.starts_with(entry))
            }
            Err(_) => None,
        };
        match found {
            Some(d) if !chosen.contains(d) => chosen.push(d.clone()),
            Some(_) => {}
            None => break,
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_visible_devices_picks_by_index_or_uuid_and_stops_at_the_first_unknown() {
        let d = |index: u32| Device {
            index,
            uuid: format!("GPU-{index}abc"),
            free: 1,
            total: 1,
        };
        let all = vec![d(0), d(1), d(2)];
        let pick = |f: Option<&str>| -> Vec<u32> {
            visible_only(all.clone(), f)
                .iter()
                .map(|d| d.index)
                .collect()
        };
        assert_eq!(pick(None), [0, 1, 2]);
        assert_eq!(pick(Some("2,0")), [2, 0]);
        assert_eq!(pick(Some("GPU-1,7,0")), [1]);
        assert_eq!(pick(Some("")), Vec::<u32>::new());
    }
}
