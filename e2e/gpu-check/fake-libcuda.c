/* A stand-in libcuda.so.1 for testing e2e/gpu-check.sh without a GPU (e2e/gpu-check-test.sh puts
 * it in the fake driver root, where the real one would be). It implements only what cuda-probe
 * calls, with host memory, and like the real driver it needs the device nodes a CDI spec gives:
 * /dev/nvidiactl and /dev/nvidia-uvm must exist, and each /dev/nvidia<N> is one device. Its device
 * name says it is fake, so no output of it passes for a real GPU's. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
       INVALID_DEVICE = 101 };

static int initialized, devices;

static int is_char_device(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

CUresult cuInit(unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    if (!is_char_device("/dev/nvidiactl") || !is_char_device("/dev/nvidia-uvm")) return NO_DEVICE;
    DIR *dir = opendir("/dev");
    if (!dir) return NO_DEVICE;
    struct dirent *e;
    devices = 0;
    while ((e = readdir(dir))) {
        const char *n = e->d_name;
        if (strncmp(n, "nvidia", 6) == 0 && n[6] >= '0' && n[6] <= '9' &&
            strspn(n + 6, "0123456789") == strlen(n + 6)) {
            char path[300] = "/dev/";
            strncat(path, n, sizeof path - 6);
            if (is_char_device(path)) devices++;
        }
    }
    closedir(dir);
    if (devices == 0) return NO_DEVICE;
    initialized = 1;
    return OK;
}

CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }

CUresult cuDeviceGetCount(int *n) {
    if (!initialized) return NOT_INITIALIZED;
    *n = devices;
    return OK;
}

CUresult cuDeviceGet(int *d, int ordinal) {
    if (!initialized) return NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= devices) return INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

CUresult cuDeviceGetName(char *name, int len, int d) {
    (void)d;
    strncpy(name, "fake libcuda (e2e/gpu-check/fake-libcuda.c)", (size_t)len);
    return OK;
}

CUresult cuCtxCreate_v2(void **ctx, unsigned flags, int d) {
    (void)flags;
    if (!initialized) return NOT_INITIALIZED;
    if (d < 0 || d >= devices) return INVALID_DEVICE;
    *ctx = (void *)1;
    return OK;
}

CUresult cuCtxDestroy_v2(void *ctx) { (void)ctx; return OK; }

CUresult cuMemAlloc_v2(unsigned long long *ptr, size_t bytes) {
    void *p = malloc(bytes);
    if (!p) return OUT_OF_MEMORY;
    *ptr = (unsigned long long)(size_t)p;
    return OK;
}

CUresult cuMemFree_v2(unsigned long long ptr) { free((void *)(size_t)ptr); return OK; }

CUresult cuMemsetD8_v2(unsigned long long ptr, unsigned char value, size_t n) {
    memset((void *)(size_t)ptr, value, n);
    return OK;
}

CUresult cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n) {
    memcpy(dst, (void *)(size_t)src, n);
    return OK;
}
