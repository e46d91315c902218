package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseLgipp(t *testing.T) {
	// nvidia-smi's layout: padded numbers, "Placement :" when there is one.
	got, err := parseLgipp("GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1\nGPU  0 Profile ID  0 Placement : {0}:8\n\nGPU  1 Profile ID  9 Placements: {0,4}:4\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(got[0]) != 8 || !got[0][placement{0, 0}] || !got[0][placement{19, 6}] || !got[1][placement{9, 4}] {
		t.Errorf("parsed %v", got)
	}
	if _, err := parseLgipp("No MIG-enabled devices found.\n"); err == nil {
		t.Error("a line that is not a placement must fail the parse")
	}
}

func TestStaticMigDevicesAndUnknownInput(t *testing.T) {
	dir := t.TempDir()
	slices := filepath.Join(dir, "slices.json")
	smi := filepath.Join(dir, "smi.xml")
	attrs := `"uuid": {"string": "MIG-1"}, "parentUUID": {"string": "GPU-1"}, "productName": {"string": "NVIDIA A100-SXM4-40GB"},
	  "architecture": {"string": "Ampere"}, "resource.kubernetes.io/pciBusID": {"string": "0000:2a:00.0"},
	  "driverVersion": {"version": "580.95.5"}, "cudaDriverVersion": {"version": "13.0.0"}`
	os.WriteFile(slices, []byte(`{"items": [{"spec": {"devices": [{"name": "gpu-1-mig-1g5gb-19-0", "attributes": {`+attrs+`}}]}}]}`), 0o644)
	os.WriteFile(smi, []byte(`<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log><driver_version>580.95.05</driver_version><cuda_version>13.0</cuda_version>
<gpu id="00000000:2A:00.0"><product_name>NVIDIA A100-SXM4-40GB</product_name><product_architecture>Ampere</product_architecture>
<mig_mode><current_mig>Enabled</current_mig></mig_mode>
<mig_devices><mig_device><index>0</index><gpu_instance_id>7</gpu_instance_id><compute_instance_id>0</compute_instance_id></mig_device></mig_devices>
<uuid>GPU-1</uuid><minor_number>1</minor_number><pci><pci_bus_id>00000000:2A:00.0</pci_bus_id></pci>
<fb_memory_usage><total>40960 MiB</total></fb_memory_usage></gpu></nvidia_smi_log>`), 0o644)
	var out, errs bytes.Buffer
	if code := run([]string{"--slices", slices, "--smi", smi}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s%s", code, out.String(), errs.String())
	}
	if !strings.Contains(out.String(), "ok        gpu-1 MIG devices (existing): 1") {
		t.Errorf("output:\n%s", out.String())
	}
	// Not nvidia-smi's XML: a usage error, never "0 mismatches".
	os.WriteFile(smi, []byte(`<other/>`), 0o644)
	if code := run([]string{"--slices", slices, "--smi", smi}, &out, &errs); code != 2 {
		t.Errorf("unknown XML: exit %d", code)
	}
}
