// fake-nvidia-smi: the few nvidia-smi reports e2e/gpu-check.sh reads, answered from an NVML
// library through NVIDIA's Go bindings, for testing the kit without a GPU
// (e2e/gpu-check-test.sh, against the fake libnvidia-ml of the simulator). On a real machine the
// kit runs NVIDIA's nvidia-smi; this one only lets the comparison and its parsing run on the
// fakes, and reads every value through a different NVML client (go-nvml) than gpu-dra's.
//
//	fake-nvidia-smi -L | -q -x | mig -lgipp
//
// NVML is loaded from $FAKE_NVIDIA_SMI_NVML (default libnvidia-ml.so.1). Anything else is refused.
package main

import (
	"encoding/xml"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

type migDevice struct {
	Index             int `xml:"index"`
	GpuInstanceID     int `xml:"gpu_instance_id"`
	ComputeInstanceID int `xml:"compute_instance_id"`
}

type gpu struct {
	ID           string `xml:"id,attr"`
	ProductName  string `xml:"product_name"`
	Architecture string `xml:"product_architecture"`
	MigMode      struct {
		Current string `xml:"current_mig"`
		Pending string `xml:"pending_mig"`
	} `xml:"mig_mode"`
	MigDevices struct {
		Devices []migDevice `xml:"mig_device"`
		None    string      `xml:",chardata"`
	} `xml:"mig_devices"`
	UUID  string `xml:"uuid"`
	Minor int    `xml:"minor_number"`
	PCI   struct {
		BusID string `xml:"pci_bus_id"`
	} `xml:"pci"`
	FBMemory struct {
		Total string `xml:"total"`
	} `xml:"fb_memory_usage"`
}

type smiLog struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	DriverVersion string   `xml:"driver_version"`
	CudaVersion   string   `xml:"cuda_version"`
	AttachedGPUs  int      `xml:"attached_gpus"`
	GPUs          []gpu    `xml:"gpu"`
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "fake-nvidia-smi: "+format+"\n", a...)
	os.Exit(1)
}

func ok(ret nvml.Return, what string) {
	if ret != nvml.SUCCESS {
		die("%s: %v", what, nvml.ErrorString(ret))
	}
}

func architecture(a nvml.DeviceArchitecture) string {
	names := map[nvml.DeviceArchitecture]string{
		nvml.DEVICE_ARCH_KEPLER: "Kepler", nvml.DEVICE_ARCH_MAXWELL: "Maxwell", nvml.DEVICE_ARCH_PASCAL: "Pascal",
		nvml.DEVICE_ARCH_VOLTA: "Volta", nvml.DEVICE_ARCH_TURING: "Turing", nvml.DEVICE_ARCH_AMPERE: "Ampere",
		nvml.DEVICE_ARCH_ADA: "Ada Lovelace", nvml.DEVICE_ARCH_HOPPER: "Hopper", nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
	}
	if n, found := names[a]; found {
		return n
	}
	return "Unknown"
}

func busID(raw [32]int8) string {
	b := make([]byte, 0, 32)
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func main() {
	lib := nvml.New(nvml.WithLibraryPath(os.Getenv("FAKE_NVIDIA_SMI_NVML")))
	args := strings.Join(os.Args[1:], " ")
	if args != "-L" && args != "-q -x" && args != "mig -lgipp" {
		die("%q: only -L, -q -x and mig -lgipp are answered", args)
	}
	ok(lib.Init(), "nvmlInit")
	defer lib.Shutdown()
	count, ret := lib.DeviceGetCount()
	ok(ret, "device count")
	switch args {
	case "-L":
		for i := 0; i < count; i++ {
			dev, ret := lib.DeviceGetHandleByIndex(i)
			ok(ret, "handle")
			name, _ := dev.GetName()
			uuid, _ := dev.GetUUID()
			fmt.Printf("GPU %d: %s (UUID: %s)\n", i, name, uuid)
		}
	case "mig -lgipp":
		for i := 0; i < count; i++ {
			dev, ret := lib.DeviceGetHandleByIndex(i)
			ok(ret, "handle")
			if current, _, ret := dev.GetMigMode(); ret != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE {
				continue
			}
			for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
				info, ret := dev.GetGpuInstanceProfileInfo(p)
				if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
					continue
				}
				ok(ret, "profile info")
				placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
				ok(ret, "placements")
				if len(placements) == 0 {
					continue
				}
				starts := make([]string, len(placements))
				for j, pl := range placements {
					starts[j] = fmt.Sprint(pl.Start)
				}
				label := "Placements"
				if len(placements) == 1 {
					label = "Placement "
				}
				fmt.Printf("GPU %2d Profile ID %2d %s: {%s}:%d\n", i, info.Id, label, strings.Join(starts, ","), placements[0].Size)
			}
		}
	case "-q -x":
		var out smiLog
		var ret nvml.Return
		out.DriverVersion, ret = lib.SystemGetDriverVersion()
		ok(ret, "driver version")
		cuda, ret := lib.SystemGetCudaDriverVersion()
		ok(ret, "CUDA version")
		out.CudaVersion = fmt.Sprintf("%d.%d", cuda/1000, cuda%1000/10)
		out.AttachedGPUs = count
		for i := 0; i < count; i++ {
			dev, ret := lib.DeviceGetHandleByIndex(i)
			ok(ret, "handle")
			var g gpu
			g.ProductName, ret = dev.GetName()
			ok(ret, "name")
			g.UUID, ret = dev.GetUUID()
			ok(ret, "uuid")
			g.Minor, ret = dev.GetMinorNumber()
			ok(ret, "minor")
			arch, ret := dev.GetArchitecture()
			ok(ret, "architecture")
			g.Architecture = architecture(arch)
			pci, ret := dev.GetPciInfo()
			ok(ret, "PCI info")
			g.PCI.BusID = busID(pci.BusId)
			g.ID = g.PCI.BusID
			mem, ret := dev.GetMemoryInfo()
			ok(ret, "memory")
			g.FBMemory.Total = fmt.Sprintf("%d MiB", mem.Total>>20)
			current, pending, ret := dev.GetMigMode()
			switch ret {
			case nvml.SUCCESS:
				mode := map[int]string{nvml.DEVICE_MIG_ENABLE: "Enabled", nvml.DEVICE_MIG_DISABLE: "Disabled"}
				g.MigMode.Current, g.MigMode.Pending = mode[current], mode[pending]
			case nvml.ERROR_NOT_SUPPORTED:
				g.MigMode.Current, g.MigMode.Pending = "N/A", "N/A"
			default:
				ok(ret, "MIG mode")
			}
			if g.MigMode.Current == "Enabled" {
				max, ret := dev.GetMaxMigDeviceCount()
				ok(ret, "MIG device count")
				for j := 0; j < max; j++ {
					mig, ret := dev.GetMigDeviceHandleByIndex(j)
					if ret == nvml.ERROR_NOT_FOUND {
						continue
					}
					ok(ret, "MIG device")
					gi, ret := mig.GetGpuInstanceId()
					ok(ret, "GPU instance id")
					ci, ret := mig.GetComputeInstanceId()
					ok(ret, "compute instance id")
					g.MigDevices.Devices = append(g.MigDevices.Devices, migDevice{Index: len(g.MigDevices.Devices), GpuInstanceID: gi, ComputeInstanceID: ci})
				}
			}
			if len(g.MigDevices.Devices) == 0 {
				g.MigDevices.None = "None"
			}
			out.GPUs = append(out.GPUs, g)
		}
		raw, err := xml.MarshalIndent(out, "", "\t")
		if err != nil {
			die("XML: %v", err)
		}
		fmt.Printf("<?xml version=\"1.0\" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">\n%s\n", raw)
	}
}
