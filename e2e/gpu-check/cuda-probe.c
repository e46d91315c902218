/* cuda-probe: the smallest CUDA program that proves a container got a working GPU from its CDI
 * spec alone. It loads libcuda.so.1 the way CUDA applications do (by soname, through the ld
 * cache NVIDIA's update-ldcache hook builds), initializes the driver, expects exactly one device,
 * allocates device memory, fills it and copies windows of it back to check every byte.
 *
 *   cuda-probe [MiB]     (default 1024)
 *
 * Prints "probe ok: ..." and exits 0, or names the step that failed and exits 1. Built by
 * e2e/gpu-check.sh (no CUDA headers: the few driver API signatures are declared here). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *lib;

static void *sym(const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "probe failed: libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return f;
}

#define CHECK(call, what)                                                   \
    do {                                                                    \
        CUresult r_ = (call);                                               \
        if (r_ != 0) {                                                      \
            fprintf(stderr, "probe failed: %s returned CUDA error %d\n", what, r_); \
            return 1;                                                       \
        }                                                                   \
    } while (0)

int main(int argc, char **argv) {
    unsigned long long mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
    if (mib < 2) {
        fprintf(stderr, "probe failed: size %s MiB: give at least 2\n", argv[1]);
        return 1;
    }
    size_t bytes = (size_t)mib << 20;
    const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");

    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "probe failed: dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDriverGetVersion)(int *) = sym("cuDriverGetVersion");
    CUresult (*cuDeviceGetCount)(int *) = sym("cuDeviceGetCount");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
    CUresult (*cuCtxDestroy)(CUcontext) = sym("cuCtxDestroy_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = sym("cuMemsetD8_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");

    Dl_info info;
    const char *from = dladdr((void *)cuInit, &info) && info.dli_fname ? info.dli_fname : "?";

    CHECK(cuInit(0), "cuInit");
    int version = 0, count = 0;
    CHECK(cuDriverGetVersion(&version), "cuDriverGetVersion");
    CHECK(cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count != 1) {
        fprintf(stderr, "probe failed: %d CUDA devices visible, want exactly 1 (the claim's)\n", count);
        return 1;
    }
    CUdevice dev;
    char name[256] = {0};
    CHECK(cuDeviceGet(&dev, 0), "cuDeviceGet");
    CHECK(cuDeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName");
    CUcontext ctx;
    CHECK(cuCtxCreate(&ctx, 0, dev), "cuCtxCreate");
    CUdeviceptr mem;
    CHECK(cuMemAlloc(&mem, bytes), "cuMemAlloc");
    CHECK(cuMemsetD8(mem, 0xA5, bytes), "cuMemsetD8");
    /* Windows at the start, middle and end: every byte of each must read back. */
    size_t window = 1 << 20;
    unsigned char *host = malloc(window);
    if (!host) {
        fprintf(stderr, "probe failed: host buffer\n");
        return 1;
    }
    size_t offsets[3] = {0, bytes / 2, bytes - window};
    for (int w = 0; w < 3; w++) {
        memset(host, 0, window);
        CHECK(cuMemcpyDtoH(host, mem + offsets[w], window), "cuMemcpyDtoH");
        for (size_t i = 0; i < window; i++) {
            if (host[i] != 0xA5) {
                fprintf(stderr, "probe failed: byte %zu reads 0x%02x, wrote 0xa5\n",
                        offsets[w] + i, host[i]);
                return 1;
            }
        }
    }
    free(host);
    CHECK(cuMemFree(mem), "cuMemFree");
    CHECK(cuCtxDestroy(ctx), "cuCtxDestroy");
    printf("probe ok: %s, CUDA driver %d.%d, libcuda from %s, %llu MiB allocated, set and read back, "
           "NVIDIA_VISIBLE_DEVICES=%s\n",
           name, version / 1000, (version % 1000) / 10, from, mib, visible ? visible : "(unset)");
    return 0;
}
