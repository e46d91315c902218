//! Keeping the book current: the checkpoint another instance wrote adopted, and the inventory
//! of GPUs rescanned or re-read for the GPUs an operation holds.
use std::collections::BTreeSet;

use super::DeviceState;
use crate::prepare::error::PrepareError;

impl DeviceState {
    /// Adopts the checkpoint on disk, and the hardware it describes, when another driver instance
    /// on this node (a rolling update) changed it since this one last wrote it. Call it with the
    /// node lock held and no operation of this instance running.
    pub fn sync_with_disk(&self) -> Result<bool, PrepareError> {
        let boot_id = self.book().checkpoint.node_boot_id.clone();
        let current = self.store.read(&boot_id)?;
        {
            let mut book = self.book();
            if current == book.checkpoint {
                return Ok(false);
            }
            book.checkpoint = current;
        }
        // The other instance changed the hardware behind this one's back.
        self.gpus.invalidate();
        self.refresh_all()?;
        self.decide_new_modes();
        Ok(true)
    }

    /// Discovers the GPUs in `only` (every GPU when `None`) again; returns whether the inventory
    /// changed. Never waits: a GPU an operation holds is skipped (that operation re-reads it
    /// when it is done), so a rescan after a fault on one GPU is not held up by a carve on it or
    /// on any other.
    pub fn rescan(&self, only: Option<&BTreeSet<u32>>) -> Result<bool, PrepareError> {
        let known = self.gpu_minors();
        let wanted = only.cloned().unwrap_or_else(|| known.clone());
        let held = self.busy_gpus.acquire_free(wanted);
        if held.keys().is_empty() && only.is_some() {
            return Ok(false);
        }
        for &minor in held.keys() {
            self.gpus.invalidate_gpu(minor);
        }
        // Only the GPUs held here are read, so a GPU busy with an operation is never waited for.
        // A full rescan also asks every minor the book lacks (device minors are below 256), so
        // GPUs that appeared are still found.
        let mut asked = held.keys().clone();
        if only.is_none() {
            asked.extend((0..256).filter(|m| !known.contains(m)));
        }
        let fresh = self.gpus.inventory_of(&asked)?;
        let mut book = self.book();
        let before = book.inventory.clone();
        let inventory = &mut book.inventory;
        // The GPUs held here are replaced by what they are now (or dropped, if they vanished);
        // a full rescan also adds GPUs that appeared.
        inventory.gpus.retain(|g| !held.keys().contains(&g.minor));
        inventory.gpus.extend(fresh.gpus.into_iter().filter(|g| {
            held.keys().contains(&g.minor) || (only.is_none() && !known.contains(&g.minor))
        }));
        inventory.gpus.sort_by_key(|g| g.minor);
        if only.is_none() {
            inventory.driver_version = fresh.driver_version;
            inventory.cuda_driver_version = fresh.cuda_driver_version;
        }
        inventory.pci = self.settled(fresh.pci)?;
        let changed = book.inventory != before;
        drop(book);
        Ok(self.decide_new_modes() || changed)
    }

    pub(super) fn refresh_all(&self) -> Result<(), PrepareError> {
        let mut inventory = self.gpus.inventory()?;
        inventory.pci = self.settled(inventory.pci)?;
        self.book().inventory = inventory;
        Ok(())
    }

    /// A fresh PCI view with each GPU's kept `gpu-vfio-<index>`.
    pub(super) fn settled(
        &self,
        mut pci: crate::gpu::pci::PciView,
    ) -> Result<crate::gpu::pci::PciView, PrepareError> {
        if let Some(names) = &self.vfio_names {
            names.settle(&mut pci)?;
        }
        Ok(pci)
    }

    /// Re-reads the GPUs in `minors` (held by the caller), leaving every other GPU as the
    /// operation holding it last saw it.
    pub(super) fn refresh(&self, minors: &BTreeSet<u32>) -> Result<(), PrepareError> {
        if minors.is_empty() && !self.config.passthrough {
            return Ok(());
        }
        // Only these: waiting for another GPU's operation in flight would serialise them.
        let fresh = self.gpus.inventory_of(minors)?;
        let mut book = self.book();
        book.inventory.gpus.retain(|g| !minors.contains(&g.minor));
        book.inventory
            .gpus
            .extend(fresh.gpus.into_iter().filter(|g| minors.contains(&g.minor)));
        book.inventory.gpus.sort_by_key(|g| g.minor);
        // The PCI view is read whole each time (a few sysfs files): bindings change with claims.
        book.inventory.pci = self.settled(fresh.pci)?;
        Ok(())
    }
}
