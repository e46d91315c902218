//! Unit tests of finding the driver's files in a fake driver root: firmware, the ld cache, the
//! usual library folders, the GBM backend link, and a root without the driver.
use super::*;

const VERSION: &str = "580.95.05";

fn root(dir: &Path) -> DriverRoot {
    DriverRoot {
        here: dir.to_path_buf(),
        host: PathBuf::from("/run/nvidia/driver"),
        hook: None,
        firmware: FirmwareSearch::default(),
    }
}

#[test]
fn firmware_is_found_where_the_kernel_loads_it_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_fake_driver_root(dir.path(), VERSION).expect("fake root");
    // Moved to an admin's firmware_class.path, beside a kernel-specific update.
    std::fs::create_dir_all(dir.path().join("usr/local/nvidia")).expect("mkdir");
    std::fs::rename(
        dir.path().join("lib/firmware"),
        dir.path().join("usr/local/nvidia/firmware"),
    )
    .expect("move firmware");
    let update = dir
        .path()
        .join("lib/firmware/updates/6.8.0-1/nvidia")
        .join(VERSION);
    std::fs::create_dir_all(&update).expect("updates");
    for name in ["ucodes_gh100.bin", "README.txt", "other.bin"] {
        std::fs::write(update.join(name), b"").expect("write");
    }
    let mut root = root(dir.path());
    let found = |root: &DriverRoot| -> Vec<String> {
        let files = root.discover(VERSION).expect("discover");
        files
            .firmware
            .iter()
            .map(|f| f.container_path.display().to_string())
            .collect()
    };
    // The kernel's default folders alone: the updates folder of another kernel is not one.
    assert_eq!(found(&root), Vec::<String>::new());
    root.firmware = FirmwareSearch {
        custom: Some("/usr/local/nvidia/firmware".into()),
        kernel_release: Some("6.8.0-1".into()),
    };
    assert_eq!(
        found(&root),
        [
            format!("/usr/local/nvidia/firmware/nvidia/{VERSION}/gsp_ga10x.bin"),
            format!("/usr/local/nvidia/firmware/nvidia/{VERSION}/gsp_tu10x.bin"),
            format!("/lib/firmware/updates/6.8.0-1/nvidia/{VERSION}/ucodes_gh100.bin"),
        ]
    );
    let files = root.discover(VERSION).expect("discover");
    assert_eq!(
        files.firmware[0].host_path,
        Path::new("/run/nvidia/driver/usr/local/nvidia/firmware/nvidia")
            .join(VERSION)
            .join("gsp_ga10x.bin")
    );
}

#[test]
fn firmware_search_reads_the_hosts_settings() {
    let sys = tempfile::tempdir().expect("tempdir");
    assert_eq!(FirmwareSearch::from_host(sys.path()).custom, None);
    let params = sys.path().join("module/firmware_class/parameters");
    std::fs::create_dir_all(&params).expect("mkdir");
    std::fs::write(params.join("path"), "\n").expect("write");
    assert_eq!(FirmwareSearch::from_host(sys.path()).custom, None);
    std::fs::write(params.join("path"), "/usr/local/nvidia/firmware\n").expect("write");
    let search = FirmwareSearch::from_host(sys.path());
    assert_eq!(
        search.custom,
        Some(PathBuf::from("/usr/local/nvidia/firmware"))
    );
    // The kernel's order: custom, updates/<release>, updates, <release>, plain.
    let search = FirmwareSearch {
        kernel_release: Some("6.18.4".into()),
        ..search
    };
    assert_eq!(
        search.dirs(),
        [
            "usr/local/nvidia/firmware",
            "lib/firmware/updates/6.18.4",
            "lib/firmware/updates",
            "lib/firmware/6.18.4",
            "lib/firmware",
        ]
        .map(PathBuf::from)
    );
}

#[test]
fn libraries_are_found_through_the_roots_ld_cache_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    assert_eq!(find_library(root, "libnvidia-ml.so.1"), None);
    // In a usual folder only.
    let usual = root.join("usr/lib64/libnvidia-ml.so.1");
    std::fs::create_dir_all(usual.parent().expect("parent")).expect("mkdir");
    std::fs::write(&usual, b"").expect("write");
    assert_eq!(find_library(root, "libnvidia-ml.so.1"), Some(usual.clone()));
    // Where the ld cache says (a GKE-style /usr/local/nvidia/lib64), ahead of that.
    let cached = root.join("usr/local/nvidia/lib64/libnvidia-ml.so.1");
    std::fs::create_dir_all(cached.parent().expect("parent")).expect("mkdir");
    std::fs::write(&cached, b"").expect("write");
    std::fs::create_dir_all(root.join("etc")).expect("mkdir");
    let entry = |name: &str, path: &str| ldcache::CachedLibrary {
        name: name.into(),
        path: path.into(),
    };
    std::fs::write(
        root.join("etc/ld.so.cache"),
        ldcache::write(&[
            entry("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"),
            entry(
                "libnvidia-ml.so.1",
                "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
            ),
        ]),
    )
    .expect("cache");
    assert_eq!(
        find_library(root, "libnvidia-ml.so.1"),
        Some(cached.clone())
    );
    // A stale cache entry (the file is gone) falls through to the folders.
    std::fs::remove_file(&cached).expect("rm");
    assert_eq!(find_library(root, "libnvidia-ml.so.1"), Some(usual.clone()));
    // Nor does a folder of that name shadow the file (NVIDIA's driver crash-looped on one).
    std::fs::create_dir_all(&cached).expect("mkdir");
    assert_eq!(find_library(root, "libnvidia-ml.so.1"), Some(usual.clone()));
    std::fs::remove_dir(&cached).expect("rmdir");
    // A link is followed inside the root, even with an absolute target, to the file itself.
    let real = root.join("usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04");
    std::fs::write(&real, b"").expect("write");
    std::os::unix::fs::symlink(
        "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04",
        &cached,
    )
    .expect("link");
    assert_eq!(find_library(root, "libnvidia-ml.so.1"), Some(real.clone()));
    // A dangling one is passed over.
    std::fs::remove_file(&real).expect("rm");
    assert_eq!(find_library(root, "libnvidia-ml.so.1"), Some(usual));
}

#[test]
fn the_gbm_backend_link_is_made_where_the_host_has_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_fake_driver_root(dir.path(), VERSION).expect("fake root");
    let lib_dir = Path::new("/usr/lib/x86_64-linux-gnu");
    let gbm = lib_dir.join("gbm/nvidia-drm_gbm.so");
    let allocator = lib_dir.join(format!("libnvidia-allocator.so.{VERSION}"));
    let with_host_link = root(dir.path()).discover(VERSION).expect("discover");
    std::fs::remove_dir_all(dir.path().join("usr/lib/x86_64-linux-gnu/gbm")).expect("rm gbm");
    let without = root(dir.path()).discover(VERSION).expect("discover");
    for files in [&with_host_link, &without] {
        let links: Vec<_> = files.links.iter().filter(|l| l.link == gbm).collect();
        assert_eq!(links.len(), 1, "{:?}", files.links);
        assert_eq!(links[0].target, allocator);
    }
}

#[test]
fn finds_the_running_versions_files_through_the_ld_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_fake_driver_root(dir.path(), VERSION).expect("fake root");
    // Another version left behind by an upgrade: never mounted.
    let lib_dir = dir.path().join("usr/lib/x86_64-linux-gnu");
    std::fs::write(lib_dir.join("libcuda.so.470.00.01"), b"").expect("old library");
    let files = root(dir.path()).discover(VERSION).expect("discover");
    let names: Vec<String> = files
        .libraries
        .iter()
        .map(|l| l.container_path.to_string_lossy().into_owned())
        .collect();
    // And the legacy NVVM.
    assert_eq!(names.len(), FAKE_LIBRARIES.len() + 1, "{names:?}");
    assert!(names.contains(&format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}")));
    assert!(!names.iter().any(|n| n.contains("470")), "{names:?}");
    assert_eq!(
        files.libraries[0].host_path,
        Path::new("/run/nvidia/driver").join(
            files.libraries[0]
                .container_path
                .strip_prefix("/")
                .expect("absolute")
        )
    );
    assert!(files.links.contains(&LibraryLink {
        link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        target: format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}").into(),
    }));
    // libcuda.so -> libcuda.so.1 -> libcuda.so.<version>: followed to the end.
    assert!(
        files
            .links
            .iter()
            .any(|l| l.link == Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so"))
    );
    // The simulated root's nvidia-smi and nvidia-cuda-mps-control are not executable.
    assert_eq!(files.binaries.len(), 3);
    assert_eq!(files.firmware.len(), 2);
    assert_eq!(files.sockets.len(), 1);
    assert_eq!(files.hook, None);
    assert_eq!(
        files.library_dirs(),
        [PathBuf::from("/usr/lib/x86_64-linux-gnu")]
    );
}

#[test]
fn without_an_ld_cache_the_usual_folders_are_searched() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_fake_driver_root(dir.path(), VERSION).expect("fake root");
    std::fs::remove_file(dir.path().join("etc/ld.so.cache")).expect("rm cache");
    std::fs::create_dir_all(dir.path().join("usr/bin")).expect("bin");
    std::fs::write(dir.path().join("usr/bin/nvidia-cdi-hook"), b"").expect("hook");
    let files = root(dir.path()).discover(VERSION).expect("discover");
    assert_eq!(files.libraries.len(), FAKE_LIBRARIES.len() + 1);
    assert_eq!(
        files.hook,
        Some(PathBuf::from("/run/nvidia/driver/usr/bin/nvidia-cdi-hook"))
    );
}

#[test]
fn a_root_without_the_driver_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = root(dir.path()).discover(VERSION).expect_err("empty root");
    let message = err.to_string();
    assert!(
        message.contains(&dir.path().display().to_string())
            && message.contains(VERSION)
            && message.contains("--nvidia-driver-root"),
        "{message}"
    );
    // Another version's files are not this driver's.
    write_fake_driver_root(dir.path(), "470.00.01").expect("old root");
    assert!(root(dir.path()).discover(VERSION).is_err());
}
