fn main() {
    // Loaders and tools look the library up by its real soname.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
