//! Crash injection for the kill -9 tests: with `GPU_DRA_FAILPOINT=<name>` the process kills
//! itself with SIGKILL when it reaches that step boundary, exactly as an OOM kill or node
//! shutdown would stop it there. Unset (production), a failpoint is one relaxed atomic load.
use std::sync::OnceLock;

static ARMED: OnceLock<Option<String>> = OnceLock::new();

/// Names every step boundary, so tests can iterate over all of them.
pub const STEPS: &[&str] = &[
    "prepare-started",
    "mig-mode-enabled",
    "prepare-gi-created-unrecorded",
    "prepare-gi-created",
    "prepare-ci-created-unrecorded",
    "prepare-ci-created",
    "prepare-sharing-applied",
    "prepare-vfio-bound",
    "prepare-mps-shm-mounted",
    "prepare-mps-started",
    "prepare-cdi-written",
    "prepare-completed",
    "unprepare-started",
    "rollback-cdi-removed",
    "rollback-mig-destroyed",
    "mig-mode-disabled",
    "rollback-vfio-unbound",
];

/// The ComputeDomain plugin's step boundaries (e2e/computedomain.sh kills it at each).
pub const COMPUTE_DOMAIN_STEPS: &[&str] = &[
    "cd-prepare-booked",
    "cd-prepare-daemon-started",
    "cd-unprepare-unbooked",
    "cd-controller-finalizer-added",
    "cd-controller-template-created",
    "cd-controller-template-deleted",
];

pub fn failpoint(step: &'static str) {
    let armed = ARMED.get_or_init(|| {
        std::env::var("GPU_DRA_FAILPOINT")
            .ok()
            .filter(|s| !s.is_empty())
    });
    if armed.as_deref() == Some(step) {
        tracing::warn!(step, "failpoint reached: killing this process with SIGKILL");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; should the signal be refused, abort is the next best stop.
        std::process::abort();
    }
}
