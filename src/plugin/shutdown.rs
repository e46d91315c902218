//! One shutdown signal shared by the gRPC servers and the long-lived health streams.
//!
//! Graceful server shutdown waits for open streams, so the health streams must end on the same
//! signal or a connected kubelet would hold the shutdown forever.

use tokio::sync::watch;

/// Fires the signal; dropping it fires it too, so a dropped server never leaves streams running.
pub struct ShutdownTrigger(watch::Sender<bool>);

/// Resolves once shutdown has been triggered. Cheap to clone.
#[derive(Clone)]
pub struct ShutdownSignal(watch::Receiver<bool>);

pub fn shutdown_channel() -> (ShutdownTrigger, ShutdownSignal) {
    let (sender, receiver) = watch::channel(false);
    (ShutdownTrigger(sender), ShutdownSignal(receiver))
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }
}

impl Drop for ShutdownTrigger {
    fn drop(&mut self) {
        self.trigger();
    }
}

impl ShutdownSignal {
    pub async fn triggered(mut self) {
        // An error means the trigger is gone, which counts as shutdown too.
        let _ = self.0.wait_for(|&triggered| triggered).await;
    }
}
