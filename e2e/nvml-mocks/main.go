// nvml-mocks: what NVIDIA's own NVML mock servers (github.com/NVIDIA/go-nvml/pkg/nvml/mock)
// report for each GPU model they mock, through the nvml.Interface a client uses, as one JSON
// array on stdout. tests/nvml_mocks.rs compares it with the simulator's catalog
// (src/gpu/catalog.rs): a second, independent description of the same hardware.
//
//	nvml-mocks
//
// Each element: {"mock": "<go-nvml variable>", "name", "brand", "architecture", "memoryMiB",
// "computeCapability": "M.m", "pciDeviceId", "migProfiles": [{"profile" (the
// NVML_GPU_INSTANCE_PROFILE_* enum), "id", "sliceCount", "instanceCount", "memoryMiB",
// "multiprocessors", "copyEngines", "decoders", "encoders", "jpegs", "ofas", "placements":
// [{"start", "size"}]}]} (profiles the device refuses with NOT_SUPPORTED are left out).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

type placement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

type profile struct {
	Profile         int         `json:"profile"`
	ID              uint32      `json:"id"`
	SliceCount      uint32      `json:"sliceCount"`
	InstanceCount   uint32      `json:"instanceCount"`
	MemoryMiB       uint64      `json:"memoryMiB"`
	Multiprocessors uint32      `json:"multiprocessors"`
	CopyEngines     uint32      `json:"copyEngines"`
	Decoders        uint32      `json:"decoders"`
	Encoders        uint32      `json:"encoders"`
	Jpegs           uint32      `json:"jpegs"`
	Ofas            uint32      `json:"ofas"`
	Placements      []placement `json:"placements"`
}

type model struct {
	Mock              string    `json:"mock"`
	Name              string    `json:"name"`
	Brand             int       `json:"brand"`
	Architecture      int       `json:"architecture"`
	MemoryMiB         uint64    `json:"memoryMiB"`
	ComputeCapability string    `json:"computeCapability"`
	PciDeviceID       uint32    `json:"pciDeviceId"`
	MigProfiles       []profile `json:"migProfiles"`
}

// Every GPU configuration go-nvml v0.13.4-1 mocks (pkg/nvml/mock/gpus).
var mocks = []struct {
	name   string
	config gpus.Config
}{
	{"A100_PCIE_40GB", gpus.A100_PCIE_40GB},
	{"A100_PCIE_80GB", gpus.A100_PCIE_80GB},
	{"A100_SXM4_40GB", gpus.A100_SXM4_40GB},
	{"A100_SXM4_80GB", gpus.A100_SXM4_80GB},
	{"A30_PCIE_24GB", gpus.A30_PCIE_24GB},
	{"H100_SXM5_80GB", gpus.H100_SXM5_80GB},
	{"H200_SXM5_141GB", gpus.H200_SXM5_141GB},
	{"B200_SXM5_180GB", gpus.B200_SXM5_180GB},
}

func check(what string, ret nvml.Return) {
	if ret != nvml.SUCCESS {
		fmt.Fprintf(os.Stderr, "nvml-mocks: %s: %v\n", what, ret)
		os.Exit(1)
	}
}

func describe(name string, config gpus.Config) model {
	srv, err := server.New(server.WithGPUs(config))
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvml-mocks: %s: %v\n", name, err)
		os.Exit(1)
	}
	var lib nvml.Interface = srv
	check(name+": Init", lib.Init())
	defer lib.Shutdown()
	device, ret := lib.DeviceGetHandleByIndex(0)
	check(name+": DeviceGetHandleByIndex", ret)
	m := model{Mock: name, MigProfiles: []profile{}}
	m.Name, ret = device.GetName()
	check(name+": GetName", ret)
	brand, ret := device.GetBrand()
	check(name+": GetBrand", ret)
	m.Brand = int(brand)
	arch, ret := device.GetArchitecture()
	check(name+": GetArchitecture", ret)
	m.Architecture = int(arch)
	memory, ret := device.GetMemoryInfo()
	check(name+": GetMemoryInfo", ret)
	m.MemoryMiB = memory.Total >> 20
	major, minor, ret := device.GetCudaComputeCapability()
	check(name+": GetCudaComputeCapability", ret)
	m.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	pci, ret := device.GetPciInfo()
	check(name+": GetPciInfo", ret)
	m.PciDeviceID = pci.PciDeviceId
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := device.GetGpuInstanceProfileInfo(p)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		check(fmt.Sprintf("%s: GetGpuInstanceProfileInfo(%d)", name, p), ret)
		placements, ret := device.GetGpuInstancePossiblePlacements(&info)
		check(fmt.Sprintf("%s: GetGpuInstancePossiblePlacements(%d)", name, p), ret)
		row := profile{
			Profile: p, ID: info.Id, SliceCount: info.SliceCount, InstanceCount: info.InstanceCount,
			MemoryMiB: info.MemorySizeMB, Multiprocessors: info.MultiprocessorCount,
			CopyEngines: info.CopyEngineCount, Decoders: info.DecoderCount, Encoders: info.EncoderCount,
			Jpegs: info.JpegCount, Ofas: info.OfaCount, Placements: []placement{},
		}
		for _, pl := range placements {
			row.Placements = append(row.Placements, placement{Start: pl.Start, Size: pl.Size})
		}
		m.MigProfiles = append(m.MigProfiles, row)
	}
	return m
}

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: nvml-mocks (no arguments; JSON on stdout)")
		os.Exit(2)
	}
	out := []model{}
	for _, m := range mocks {
		out = append(out, describe(m.name, m.config))
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "nvml-mocks: %v\n", err)
		os.Exit(1)
	}
}
