fn main() {
    // Loaders and tools look the library up by its real soname.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    // The fake driver root's tools load with the fake driver root's own loader and C library
    // (gpu_dra::prepare::driver_files::FAKE_LOADER and FAKE_LIBC_DIR), which only a fake driver
    // root has: they run chrooted into it, as the driver runs NVIDIA's tools, or not at all.
    for bin in ["nvidia-cuda-mps-control", "nvidia-smi", "nvidia-imex"] {
        println!(
            "cargo:rustc-link-arg-bin={bin}=-Wl,--dynamic-linker=/lib/ld-gpu-dra-driver-root.so"
        );
        println!("cargo:rustc-link-arg-bin={bin}=-Wl,-rpath,/lib/gpu-dra-driver-root");
    }
}
