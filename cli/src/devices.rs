//! The devices NVML sees (`libnvidia-ml.so.1`, or `$GPUMEMHOOK_NVML_LIB`), loaded at run time,
//! never linked, so that the commands run on machines without a driver too: for `fit`, the devices
//! it may run trials on and how much memory each has free; for `top`, each device's memory, its
//! utilisation and the processes NVML lists on it (hooked or not: NVML asks the kernel driver).
//!
//! `CUDA_VISIBLE_DEVICES` is honoured as CUDA reads it where it names devices by index (NVML's
//! order, which is CUDA's under `CUDA_DEVICE_ORDER=PCI_BUS_ID`) or by UUID (`GPU-...`, or a prefix
//! of one); each trial is then started with `CUDA_VISIBLE_DEVICES` set to its device's UUID, which
//! means the same device to CUDA and NVML whatever their orders.

use gpumemhook_reader::env;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlProcessInfo_t, nvmlUtilization_t, NvmlLib,
};
use std::ffi::{c_char, CStr};

/// NVML's answer when the array given for a list is too small (it then says how many there are).
const NVML_ERROR_INSUFFICIENT_SIZE: u32 = 7;

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

/// One device as NVML sees it, every process on it included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceUsage {
    /// NVML's index.
    pub index: u32,
    pub total: u64,
    /// Bytes in use on the device, by every process (and the driver).
    pub used: u64,
    pub free: u64,
    /// Percent of the last sample period the GPU was busy; `None` where NVML does not say.
    pub utilisation: Option<u32>,
    /// The compute processes NVML lists on the device.
    pub processes: Vec<NvmlProcess>,
}

/// A compute process as NVML lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlProcess {
    /// The pid in the node's pid namespace (the kernel driver's), wherever the reader runs.
    pub pid: u32,
    /// Its bytes on the device; `None` where NVML does not say.
    pub used: Option<u64>,
}

/// NVML loaded and initialised; shut down when dropped.
pub struct Nvml {
    lib: NvmlLib,
}

impl Nvml {
    /// Loads and initialises NVML, or says why it cannot (`command` names who needs it).
    pub fn open(command: &str) -> Result<Nvml, String> {
        let name = std::env::var_os(env::NVML_LIB)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "libnvidia-ml.so.1".into());
        if name == "none" {
            return Err(format!("${} is none", env::NVML_LIB));
        }
        // SAFETY: loading NVML runs its initialisers, which have no preconditions; every function
        // is checked for presence before it is called (here, or where it is optional).
        let lib = unsafe { NvmlLib::new(&name) }
            .map_err(|e| format!("cannot load {}: {e}", name.to_string_lossy()))?;
        let present = lib.nvmlInit_v2.is_ok()
            && lib.nvmlShutdown.is_ok()
            && lib.nvmlDeviceGetCount_v2.is_ok()
            && lib.nvmlDeviceGetHandleByIndex_v2.is_ok()
            && lib.nvmlDeviceGetMemoryInfo.is_ok();
        if !present {
            let name = name.to_string_lossy();
            return Err(format!("{name} lacks a function {command} needs"));
        }
        // SAFETY: the function is present (checked above) and takes no arguments.
        let rc = unsafe { lib.nvmlInit_v2() };
        if rc != 0 {
            return Err(format!("nvmlInit_v2 failed ({rc})"));
        }
        Ok(Nvml { lib })
    }

    /// Every device's handle, in NVML's order.
    fn handles(&self) -> Result<Vec<nvmlDevice_t>, String> {
        let mut count = 0u32;
        // SAFETY: NVML is initialised and `count` is a valid out-pointer.
        let rc = unsafe { self.lib.nvmlDeviceGetCount_v2(&mut count) };
        if rc != 0 {
            return Err(format!("nvmlDeviceGetCount_v2 failed ({rc})"));
        }
        (0..count)
            .map(|index| {
                let mut handle: nvmlDevice_t = std::ptr::null_mut();
                // SAFETY: `handle` is a valid out-pointer; a bad index is an error code, not UB.
                let rc = unsafe { self.lib.nvmlDeviceGetHandleByIndex_v2(index, &mut handle) };
                if rc != 0 {
                    return Err(format!("device {index}: no handle ({rc})"));
                }
                Ok(handle)
            })
            .collect()
    }

    /// Device `index`'s total, free and used bytes.
    fn memory(&self, index: usize, handle: nvmlDevice_t) -> Result<nvmlMemory_t, String> {
        let mut memory = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: `handle` came from NVML and `memory` is a valid out-pointer of the right layout.
        let rc = unsafe { self.lib.nvmlDeviceGetMemoryInfo(handle, &mut memory) };
        if rc != 0 {
            return Err(format!("device {index}: no memory figures ({rc})"));
        }
        Ok(memory)
    }

    /// Every device with its memory, utilisation and compute processes.
    pub fn usage(&self) -> Result<Vec<DeviceUsage>, String> {
        let handles = self.handles()?;
        let mut devices = Vec::with_capacity(handles.len());
        for (index, &handle) in handles.iter().enumerate() {
            let memory = self.memory(index, handle)?;
            devices.push(DeviceUsage {
                index: index as u32,
                total: memory.total,
                used: memory.used,
                free: memory.free,
                utilisation: self.utilisation(handle),
                processes: self.processes(handle),
            });
        }
        Ok(devices)
    }

    /// The GPU's busy percent; `None` where this NVML or this device does not report it.
    fn utilisation(&self, handle: nvmlDevice_t) -> Option<u32> {
        let get = self.lib.nvmlDeviceGetUtilizationRates.as_ref().ok()?;
        let mut rates = nvmlUtilization_t { gpu: 0, memory: 0 };
        // SAFETY: the function is present, `handle` came from NVML and `rates` is a valid
        // out-pointer of the right layout.
        let rc = unsafe { get(handle, &mut rates) };
        (rc == 0).then_some(rates.gpu)
    }

    /// The compute processes NVML lists on the device (`_v3`, drivers of 2022 on); none where it
    /// cannot list them.
    fn processes(&self, handle: nvmlDevice_t) -> Vec<NvmlProcess> {
        let Ok(list) = &self.lib.nvmlDeviceGetComputeRunningProcesses_v3 else {
            return Vec::new();
        };
        let mut count = 0u32;
        // SAFETY: `count` is a valid out-pointer; a null array of zero entries is how NVML is
        // asked how many there are.
        let rc = unsafe { list(handle, &mut count, std::ptr::null_mut()) };
        if rc != NVML_ERROR_INSUFFICIENT_SIZE {
            return Vec::new();
        }
        // Room for a few more than asked: processes may start between the two calls.
        let empty = nvmlProcessInfo_t {
            pid: 0,
            usedGpuMemory: 0,
            gpuInstanceId: 0,
            computeInstanceId: 0,
        };
        let mut infos = vec![empty; count as usize + 8];
        let mut count = infos.len() as u32;
        // SAFETY: `infos` holds `count` entries of the layout the function fills.
        let rc = unsafe { list(handle, &mut count, infos.as_mut_ptr()) };
        if rc != 0 {
            return Vec::new();
        }
        infos.truncate(count as usize);
        // NVML_VALUE_NOT_AVAILABLE (all ones) where the driver cannot say (e.g. under WDDM).
        let known = |bytes: u64| (bytes != u64::MAX).then_some(bytes);
        infos
            .iter()
            .map(|p| NvmlProcess {
                pid: p.pid,
                used: known(p.usedGpuMemory),
            })
            .collect()
    }

    /// Every device with its UUID and memory (for `fit`).
    fn devices(&self) -> Result<Vec<Device>, String> {
        if self.lib.nvmlDeviceGetUUID.is_err() {
            return Err("NVML lacks nvmlDeviceGetUUID, which fit needs".into());
        }
        let mut devices = Vec::new();
        for (index, handle) in self.handles()?.into_iter().enumerate() {
            let memory = self.memory(index, handle)?;
            // NVML_DEVICE_UUID_V2_BUFFER_SIZE is 96.
            let mut uuid = [0 as c_char; 96];
            // SAFETY: the function is present (checked above); the buffer holds `uuid.len()`
            // bytes, which NVML fills with a NUL-terminated string.
            let rc = unsafe {
                self.lib
                    .nvmlDeviceGetUUID(handle, uuid.as_mut_ptr(), uuid.len() as u32)
            };
            if rc != 0 {
                return Err(format!("device {index}: no UUID ({rc})"));
            }
            // SAFETY: NVML wrote a NUL-terminated string inside the buffer (it is zeroed past it).
            let uuid = unsafe { CStr::from_ptr(uuid.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            devices.push(Device {
                index: index as u32,
                uuid,
                free: memory.free,
                total: memory.total,
            });
        }
        Ok(devices)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: NVML was initialised when `self` was made (and nvmlShutdown checked present);
        // this balances that init.
        unsafe { self.lib.nvmlShutdown() };
    }
}

/// The visible devices with their memory, or why they cannot be known.
pub fn visible() -> Result<Vec<Device>, String> {
    let devices = Nvml::open("fit")?.devices();
    let filter = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    Ok(visible_only(devices?, filter.as_deref()))
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
