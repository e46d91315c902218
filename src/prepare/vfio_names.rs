//! The `<index>` of `gpu-vfio-<index>`, kept per PCI address. NVIDIA names a GPU for virtual
//! machines by its position in the node's PCI scan; a GPU that drops off the bus would shift
//! every later name, and a claim allocated `gpu-vfio-3` from the slice published before would
//! bind another GPU. Here a GPU keeps the index it was first published with, in a file in the
//! state folder: on a new node the indexes are the scan's positions (NVIDIA's names); later, a
//! GPU that is gone leaves its index unused, and a GPU never seen gets its scan position if that
//! is free, else the lowest free index.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::gpu::pci::PciView;

const FILE: &str = "vfio-names.json";

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct VfioNamesError {
    pub path: PathBuf,
    pub reason: String,
}

/// The index each PCI address was first published with.
#[derive(Debug, Clone)]
pub struct VfioNames {
    path: PathBuf,
}

impl VfioNames {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(FILE),
        }
    }

    fn err(&self, reason: impl std::fmt::Display) -> VfioNamesError {
        VfioNamesError {
            path: self.path.clone(),
            reason: reason.to_string(),
        }
    }

    /// Gives each GPU of `pci` its kept index (new GPUs get one, recorded).
    pub fn settle(&self, pci: &mut PciView) -> Result<(), VfioNamesError> {
        let mut kept: BTreeMap<String, u32> = match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                self.err(format!(
                    "cannot parse ({e}); GPUs for virtual machines keep their names through it: restore it, or remove it once no claim holds a gpu-vfio device"
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(self.err(e)),
        };
        let before = kept.clone();
        let mut taken: BTreeSet<u32> = kept.values().copied().collect();
        for function in &mut pci.gpus {
            let index = match kept.get(&function.bus_id) {
                Some(&index) => index,
                None => {
                    let index = if taken.contains(&function.index) {
                        (0..).find(|i| !taken.contains(i)).unwrap_or(function.index)
                    } else {
                        function.index
                    };
                    kept.insert(function.bus_id.clone(), index);
                    taken.insert(index);
                    index
                }
            };
            function.index = index;
        }
        if kept != before {
            let bytes = serde_json::to_vec_pretty(&kept).map_err(|e| self.err(e))?;
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| self.err(e))?;
            }
            crate::fsutil::write_atomically(&self.path, &bytes).map_err(|e| self.err(e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::SimNode;

    fn scan(node: &SimNode) -> PciView {
        node.inventory().expect("inventory").pci
    }

    fn names(pci: &PciView) -> Vec<(String, u32)> {
        pci.gpus
            .iter()
            .map(|g| (g.bus_id.clone(), g.index))
            .collect()
    }

    #[test]
    fn a_gpu_keeps_its_name_when_an_earlier_one_drops_off_the_bus() {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = SimNode::new("sim:4xH100-SXM5-80GB".parse().expect("spec"), "n1", None);
        let names_file = VfioNames::new(dir.path());
        let mut first = scan(&node);
        let scanned = names(&first);
        names_file.settle(&mut first).expect("settle");
        assert_eq!(names(&first), scanned, "a new node gets NVIDIA's names");

        // GPU 1 is gone from the bus: the scan shifts GPUs 2 and 3 down, their names stay.
        let mut later = first.clone();
        let gone = later.gpus.remove(1);
        for (position, function) in later.gpus.iter_mut().enumerate() {
            function.index = position as u32;
        }
        names_file.settle(&mut later).expect("settle");
        let expected: Vec<(String, u32)> = scanned
            .iter()
            .filter(|(bus, _)| *bus != gone.bus_id)
            .cloned()
            .collect();
        assert_eq!(names(&later), expected);

        // A GPU never seen, scanned at a position whose index is taken, gets the lowest free one
        // (the gone GPU's index stays reserved for it).
        let mut new = later.clone();
        let mut stranger = gone.clone();
        stranger.bus_id = "0000:ff:00.0".into();
        stranger.index = 3;
        new.gpus.push(stranger);
        names_file.settle(&mut new).expect("settle");
        assert_eq!(new.gpus.last().map(|g| g.index), Some(4));

        // The gone GPU comes back with its own name.
        let mut back = first.clone();
        names_file.settle(&mut back).expect("settle");
        assert_eq!(names(&back), scanned);
    }

    #[test]
    fn a_file_that_cannot_be_read_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), b"{not json").expect("write");
        let node = SimNode::new("sim:1xH100-SXM5-80GB".parse().expect("spec"), "n1", None);
        let mut pci = scan(&node);
        let error = VfioNames::new(dir.path())
            .settle(&mut pci)
            .expect_err("corrupt");
        assert!(error.to_string().contains(FILE), "{error}");
    }
}
