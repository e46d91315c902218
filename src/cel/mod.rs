//! The Kubernetes DRA CEL environment (selectors over `device`).
