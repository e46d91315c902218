#!/bin/sh
# nvidia-smi in the cuda-standin image (e2e/images/build.sh), which e2e/nvidia-suite.sh tags under
# the CUDA and Ubuntu images NVIDIA's suite pulls: the simulated driver root's own nvidia-smi runs
# only chrooted there (its loader is the fake root's), not in a container. It lists the GPU
# device nodes the container was given (what the claim's CDI spec injected) and fails as
# nvidia-smi does when there is none.
n=0
for dev in /dev/nvidia[0-9]*; do
    [ -c "$dev" ] || continue
    echo "GPU $n: simulated GPU ($dev, NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-unset})"
    n=$((n + 1))
done
if [ "$n" -eq 0 ]; then
    echo "No devices were found" >&2
    exit 6
fi
[ "${1:-}" = "-L" ] || echo "| NVIDIA-SMI stand-in    Driver Version: simulated |"
