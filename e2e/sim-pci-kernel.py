#!/usr/bin/env python3
"""The kernel's PCI driver binding on a simulated sysfs tree (`gpu-dra sim sysfs DIR`), for host
processes that bind GPUs through its files as they would through /sys (e2e/claims-vs-nvidia.sh).

A real sysfs acts on a write before the write returns: after `echo BDF > drivers/vfio-pci/bind`
or `echo BDF > drivers_probe` the function is bound (its `driver` link changed) and the VFIO
group's node is in /dev. A plain file does nothing, so the files a binding ends with become
FIFOs whose one-page buffer this process keeps full: a writer's write waits there. Every POLL it
looks for a watched process (pids in PIDS_FILE, re-read each time) holding one open and, before
letting the write through, does what the kernel does:

  drivers/<D>/unbind (plain files; read first)  the function named there loses its `driver` link
                                                 if bound to D;
  drivers/<D>/bind                               an unbound function whose driver_override is D
                                                 (or empty, for nvidia: its id table) is bound to D;
  drivers_probe                                  each unbound function is bound to its
                                                 driver_override, or nvidia when empty.

Binding is `gpu-dra sim bind --gpu N --driver D --sysfs DIR` (the simulated state, which the fake
libnvidia-ml reads: NVML stops or starts seeing the GPU; the tree's links); driver_override is
left as written (the kernel never writes it). Bound to a VFIO driver, the group's node is made
under DEV/vfio (and removed when the function goes back to nvidia), with /dev/vfio/vfio, the
vfio module's, made at start. The GPU's index is its IOMMU group less 40 (the simulator's groups).

Usage: sim-pci-kernel.py SYSFS DEV PIDS_FILE GPU_DRA -- SIM_ARGS...   (until killed)
"""
import fcntl
import os
import stat
import subprocess
import sys
import time

F_SETPIPE_SZ = 1031
POLL = 0.02
VFIO_GROUP_MAJOR = 242  # a dynamic major, as the kernel gives vfio's group nodes


def main():
    sysfs, dev, pids_file, gpu_dra = sys.argv[1:5]
    sim_args = sys.argv[sys.argv.index("--") + 1:]
    drivers_dir = os.path.join(sysfs, "bus/pci/drivers")
    devices_dir = os.path.join(sysfs, "bus/pci/devices")
    drivers = sorted(os.listdir(drivers_dir))
    log = lambda *a: print("sim-pci-kernel:", *a, file=sys.stderr, flush=True)

    # The files a binding ends with, as FIFOs kept full.
    fifos = {}  # (st_dev, st_ino) -> (kind, driver, fd)
    for kind, driver, path in [("probe", None, os.path.join(sysfs, "bus/pci/drivers_probe"))] + [
            ("bind", d, os.path.join(drivers_dir, d, "bind")) for d in drivers]:
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            os.unlink(path)
            os.mkfifo(path, 0o200)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        fcntl.fcntl(fd, F_SETPIPE_SZ, 4096)
        fill(fd)
        st = os.fstat(fd)
        fifos[(st.st_dev, st.st_ino)] = (kind, driver, fd)
    os.makedirs(os.path.join(dev, "vfio"), exist_ok=True)
    vfio = os.path.join(dev, "vfio/vfio")
    if not os.path.exists(vfio):
        os.mknod(vfio, 0o666 | stat.S_IFCHR, os.makedev(10, 196))

    def bound(bdf):
        try:
            return os.path.basename(os.readlink(os.path.join(devices_dir, bdf, "driver")))
        except FileNotFoundError:
            return None

    def override(bdf):
        value = open(os.path.join(devices_dir, bdf, "driver_override")).read().strip()
        return "" if value == "(null)" else value

    def group(bdf):
        return int(os.path.basename(os.readlink(os.path.join(devices_dir, bdf, "iommu_group"))))

    def bind(bdf, driver):
        kept = open(os.path.join(devices_dir, bdf, "driver_override")).read()
        out = subprocess.run([gpu_dra, "sim", *sim_args, "bind", "--gpu", str(group(bdf) - 40),
                              "--driver", driver, "--sysfs", sysfs], capture_output=True, text=True)
        with open(os.path.join(devices_dir, bdf, "driver_override"), "w") as f:
            f.write(kept)
        if out.returncode != 0:
            # As a failed probe: the function stays unbound.
            log(f"{bdf}: bind to {driver} refused: {out.stderr.strip()}")
            unbind(bdf, bound(bdf))
            return
        node = os.path.join(dev, "vfio", str(group(bdf)))
        if driver == "nvidia":
            if os.path.exists(node):
                os.unlink(node)
        elif not os.path.exists(node):
            os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(VFIO_GROUP_MAJOR, group(bdf) - 40))
        log(f"{bdf}: bound to {driver}")

    def unbind(bdf, driver):
        links = (os.path.join(devices_dir, bdf, "driver"), os.path.join(drivers_dir, str(driver), bdf))
        for link in links:
            if os.path.islink(link):
                os.unlink(link)
        log(f"{bdf}: unbound from {driver}")

    def act(kinds):
        for driver in drivers:
            path = os.path.join(drivers_dir, driver, "unbind")
            for bdf in open(path).read().split():
                if bound(bdf) == driver:
                    unbind(bdf, driver)
            open(path, "w").close()
        for kind, driver in kinds:
            for bdf in sorted(os.listdir(devices_dir)):
                if bound(bdf) is not None:
                    continue
                wanted = override(bdf)
                if kind == "probe":
                    bind(bdf, wanted or "nvidia")
                elif wanted == driver or (not wanted and driver == "nvidia"):
                    bind(bdf, driver)

    def writers():
        """The FIFOs a watched process holds open (it is in its write)."""
        try:
            pids = open(pids_file).read().split()
        except FileNotFoundError:
            return {}
        held = {}
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            for fd in fds:
                try:
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key in fifos:
                    held[key] = pid
        return held

    while True:
        held = writers()
        if held:
            act([fifos[k][:2] for k in held])
            for key, pid in held.items():
                fd = fifos[key][2]
                drain(fd)
                # Let the write end (the writer closes), then keep the buffer full again.
                deadline = time.monotonic() + 5
                while key in writers() and time.monotonic() < deadline:
                    time.sleep(POLL / 4)
                drain(fd)
                fill(fd)
        time.sleep(POLL)


def fill(fd):
    while True:
        try:
            os.write(fd, b"\0" * 512)
        except BlockingIOError:
            break
    while True:
        try:
            os.write(fd, b"\0")
        except BlockingIOError:
            return


def drain(fd):
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except BlockingIOError:
            return


if __name__ == "__main__":
    main()
