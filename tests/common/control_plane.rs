//! A control plane for the tests that need one: GPU_DRA_TEST_KUBECONFIG names a running one
//! (e.g. from `e2e/cluster up`), else GPU_DRA_K8S_BIN lets the test start its own. Tests that use
//! it are ignored by plain `cargo test`; e2e/run-tests sets GPU_DRA_K8S_BIN and runs them.
/// A control plane of our own (`e2e/cluster up`), stopped when dropped.
pub struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    fn script() -> std::process::Command {
        std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/e2e/cluster"))
    }

    fn up() -> (Self, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let cluster = Self { dir };
        let status = Self::script()
            .args(["up", "--nodes", "control-plane-test-sim"])
            .env("GPU_DRA_CLUSTER_DIR", cluster.dir.path())
            .status()
            .expect("e2e/cluster up");
        assert!(status.success(), "e2e/cluster up failed");
        let kubeconfig = cluster.dir.path().join("admin.kubeconfig");
        (cluster, kubeconfig)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Self::script()
            .arg("down")
            .env("GPU_DRA_CLUSTER_DIR", self.dir.path())
            .status();
    }
}

/// The API server to test against: GPU_DRA_TEST_KUBECONFIG (a running control plane), else one
/// started from GPU_DRA_K8S_BIN; a test that needs one is ignored by plain `cargo test` and fails
/// when run without either.
pub async fn cluster() -> (Option<Cluster>, kube::Config) {
    let (cluster, path) = match (
        std::env::var_os("GPU_DRA_TEST_KUBECONFIG"),
        std::env::var_os("GPU_DRA_K8S_BIN"),
    ) {
        (Some(path), _) => (None, path.into()),
        (None, Some(_)) => {
            let (cluster, path) = tokio::task::spawn_blocking(Cluster::up)
                .await
                .expect("cluster up");
            (Some(cluster), path)
        }
        (None, None) => panic!(
            "needs a control plane: GPU_DRA_TEST_KUBECONFIG (a running one) or GPU_DRA_K8S_BIN \
             (e2e/build-k8s.sh's bin folder; e2e/run-tests sets it)"
        ),
    };
    let file = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    (cluster, config)
}
