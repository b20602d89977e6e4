//! GPU faults that wgpu reports on the side: device loss (the device-lost
//! callback) and errors raised outside any error scope (the uncaptured-error
//! handler, whose default panics). Both are recorded here and turned into
//! typed errors the next time aether records or reads back work, so a fault
//! in the middle of training comes out of `train` / `predict` as an
//! [`AetherError`] instead of a panic or a wait that never ends.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{AetherError, Result};

/// What went wrong on one device, first fault kept.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Why the device was lost; once set, every later check fails.
    lost: Mutex<Option<String>>,
    /// An error no scope caught; reported once, to the next check.
    uncaptured: Mutex<Option<String>>,
}

fn lock(slot: &Mutex<Option<String>>) -> MutexGuard<'_, Option<String>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

impl Faults {
    /// Installs the callbacks on `device` and returns the record they fill.
    pub(crate) fn watch(device: &wgpu::Device) -> Arc<Self> {
        let faults = Arc::new(Self::default());
        let on_lost = Arc::clone(&faults);
        device.set_device_lost_callback(move |reason, message| {
            lock(&on_lost.lost).get_or_insert_with(|| match message.as_str() {
                "" => format!("{reason:?}"),
                _ => format!("{reason:?}: {message}"),
            });
        });
        let on_error = Arc::clone(&faults);
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            lock(&on_error.uncaptured).get_or_insert_with(|| error.to_string());
        }));
        faults
    }

    pub(crate) fn is_lost(&self) -> bool {
        lock(&self.lost).is_some()
    }

    /// `Err` when the device is lost or an uncaptured error is pending; the
    /// error names what was being done (`during`).
    pub(crate) fn check(&self, during: &'static str) -> Result<()> {
        if let Some(reason) = lock(&self.lost).clone() {
            return Err(AetherError::DeviceLost { during, reason });
        }
        match lock(&self.uncaptured).take() {
            Some(message) => Err(AetherError::Gpu { during, message }),
            None => Ok(()),
        }
    }
}
