//! Shared helpers for the integration tests in `tests/tests/`.

pub mod datapath;

use std::sync::Arc;
use std::time::Duration;

use uhca::pci::model::ModelFunction;
use uhca::{Device, DeviceConfig};
use uhca_hw::model::ModelConfig;

/// A model with a short boot delay and a fast health counter, for tests.
pub fn model() -> Arc<ModelFunction> {
    model_with_mac(ModelConfig::default().mac)
}

/// [`model`] with port MAC `mac` (models joined by a link need distinct MACs).
pub fn model_with_mac(mac: [u8; 6]) -> Arc<ModelFunction> {
    model_with(|c| c.mac = mac)
}

/// [`model`] with its configuration changed by `tune` first.
pub fn model_with(tune: impl FnOnce(&mut ModelConfig)) -> Arc<ModelFunction> {
    let mut cfg = ModelConfig {
        boot_delay: Duration::from_millis(2),
        health_period: Duration::from_millis(1),
        ..ModelConfig::default()
    };
    tune(&mut cfg);
    ModelFunction::new(cfg).expect("model starts")
}

/// Device options for tests: health polled every second, as rdma-core does (three misses span
/// at least 2 s: model threads descheduled for up to 958 ms were seen on a loaded 2-core
/// machine, and a 50 ms poll declared such a device dead in `datapath_fuzz`), short command
/// timeout. Tests of the health monitor itself that want it faster set their own interval.
pub fn config() -> DeviceConfig {
    DeviceConfig {
        health_interval: Duration::from_secs(1),
        cmd_timeout: Some(Duration::from_secs(20)),
        ..DeviceConfig::default()
    }
}

/// A booted device on a fresh model.
pub fn device() -> (Device, Arc<ModelFunction>) {
    device_on(model())
}

/// A booted device on model `m`.
pub fn device_on(m: Arc<ModelFunction>) -> (Device, Arc<ModelFunction>) {
    let d = Device::open(m.clone(), config()).expect("boot");
    (d, m)
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}
