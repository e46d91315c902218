package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
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

// Two specs for one GPU, as gpu-dra cdi and nvidia-ctk cdi generate write them (trimmed): they
// differ only where cdiExplained says why. Ours has everything in the device's edits, nvidia-ctk
// most in the common ones, with host paths for its device nodes and options in another order.
const (
	oursSpec = `{"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": [{
	  "name": "example-claim-uid-gpu-0",
	  "containerEdits": {
	    "env": ["NVIDIA_VISIBLE_DEVICES=GPU-1"%s],
	    "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidiactl"}],
	    "mounts": [{"hostPath": "/usr/lib64/libcuda.so.580.1", "containerPath": "/usr/lib64/libcuda.so.580.1", "options": ["ro", "nosuid", "nodev", "bind"]}%s],
	    "hooks": [
	      {"hookName": "createContainer", "path": "/kit/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.580.1::/usr/lib64/libcuda.so.1"]},
	      {"hookName": "createContainer", "path": "/kit/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"]},
	      {"hookName": "createContainer", "path": "/kit/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "disable-device-node-modification"]}]}}]}`
	nvidiaSpec = `{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
	  "devices": [
	    {"name": "0", "containerEdits": {
	      "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}],
	      "hooks": [{"hookName": "createContainer", "path": "/kit/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--device-uuid", "GPU-1"]}]}},
	    {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}, {"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}]}}],
	  "containerEdits": {
	    "env": ["NVIDIA_VISIBLE_DEVICES=void"],
	    "deviceNodes": [{"path": "/dev/nvidia-modeset", "hostPath": "/dev/nvidia-modeset"}, {"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl"}],
	    "mounts": [
	      {"hostPath": "/usr/lib64/libcuda.so.580.1", "containerPath": "/usr/lib64/libcuda.so.580.1", "options": ["bind", "nodev", "nosuid", "ro"]},
	      {"hostPath": "/dev/null", "containerPath": "/var/run/nvidia-container-devices/void", "options": ["bind", "ro"]}],
	    "hooks": [
	      {"hookName": "createContainer", "path": "/kit/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.580.1::/usr/lib64/libcuda.so.1", "--link", "libGLX_nvidia.so.580.1::/usr/lib64/libGLX_indirect.so.0"]},
	      {"hookName": "createContainer", "path": "/kit/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"]},
	      {"hookName": "createContainer", "path": "/kit/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "disable-device-node-modification"]}]}}`
)

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func runParity(t *testing.T, ours, oursDevice, nvidia, nvidiaDevice string) (int, string, string) {
	t.Helper()
	var out, errs bytes.Buffer
	code := run([]string{"--cdi-ours", writeFile(t, "ours.json", ours), "--cdi-ours-device", oursDevice,
		"--cdi-nvidia", writeFile(t, "nvidia.json", nvidia), "--cdi-nvidia-device", nvidiaDevice}, &out, &errs)
	return code, out.String(), errs.String()
}

func TestParityOnlyExplainedDifferences(t *testing.T) {
	code, out, errs := runParity(t, fmt.Sprintf(oursSpec, "", ""), "example-claim-uid-gpu-0", nvidiaSpec, "0")
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out, errs)
	}
	for _, want := range []string{
		"explained only nvidia: env NVIDIA_VISIBLE_DEVICES=void (ours names the claim's devices",
		"explained only nvidia: mount /var/run/nvidia-container-devices/void /dev/null bind,ro (as NVIDIA_VISIBLE_DEVICES=void)\n",
		"explained only nvidia: device-node /dev/nvidia-modeset /dev/nvidia-modeset (the display driver's",
		"explained only nvidia: hook apply-cuda-memory-limits --device-uuid GPU-1 (createContainer) (NVIDIA puts it",
		"explained only nvidia: link /usr/lib64/libGLX_indirect.so.0 -> /usr/lib64/libGLX_nvidia.so.580.1 (glvnd's",
		"explained only ours: env NVIDIA_VISIBLE_DEVICES=GPU-1 (as NVIDIA_VISIBLE_DEVICES=void)\n",
		// env, 3 device nodes, 2 mounts, 2 links, the ld cache folder, 2 hooks; 6 explained
		"CDI vs nvidia-ctk: 12 entries compared, 6 differences explained, 0 mismatches\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	// The fully qualified names work too.
	if code, out, errs := runParity(t, fmt.Sprintf(oursSpec, "", ""), "k8s.gpu.nvidia.com/claim=example-claim-uid-gpu-0",
		nvidiaSpec, "nvidia.com/gpu=0"); code != 0 {
		t.Errorf("qualified names: exit %d:\n%s%s", code, out, errs)
	}
}

func TestParityMismatch(t *testing.T) {
	extra := `, {"hostPath": "/host/extra", "containerPath": "/extra", "options": ["ro", "bind"]}`
	code, out, errs := runParity(t, fmt.Sprintf(oursSpec, `, "DEBUG=1"`, extra), "example-claim-uid-gpu-0", nvidiaSpec, "0")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s%s", code, out, errs)
	}
	for _, want := range []string{
		"MISMATCH  only ours: env DEBUG=1\n",
		"MISMATCH  only ours: mount /extra /host/extra bind,ro\n",
		", 6 differences explained, 2 mismatches\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	// The other GPU's device of NVIDIA's spec: its node is a mismatch, the apply-cuda-memory-limits
	// hook (only in "0") is one fewer explained difference.
	code, out, _ = runParity(t, fmt.Sprintf(oursSpec, "", ""), "example-claim-uid-gpu-0", nvidiaSpec, "all")
	if code != 1 || !strings.Contains(out, "MISMATCH  only nvidia: device-node /dev/nvidia1 /dev/nvidia1\n") ||
		!strings.Contains(out, ", 5 differences explained, 1 mismatches\n") {
		t.Errorf("device all: exit %d:\n%s", code, out)
	}
}

func TestParityLinksFollowedToTheirEnd(t *testing.T) {
	const lib = "/usr/lib/x86_64-linux-gnu"
	hook := func(args string) string {
		return `{"hookName": "createContainer", "path": "/h", "args": ["nvidia-cdi-hook", "create-symlinks", ` + args + `]}`
	}
	// libcuda.so -> libcuda.so.1 -> libcuda.so.580.1, relative, the second link in the device's
	// edits; against absolute targets straight to the library (one as --link=), one through ../.
	ours := `{"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
	  "containerEdits": {"hooks": [` + hook(`"--link", "libcuda.so.1::`+lib+`/libcuda.so"`) + `]},
	  "devices": [{"name": "d", "containerEdits": {"hooks": [` + hook(`"--link", "libcuda.so.580.1::`+lib+`/libcuda.so.1"`) + `]}}]}`
	nvidia := `{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0", "containerEdits": {"hooks": [` +
		hook(`"--link=`+lib+`/libcuda.so.580.1::`+lib+`/libcuda.so", "--link", "../x86_64-linux-gnu/./libcuda.so.580.1::`+lib+`/libcuda.so.1"`) + `]}}]}`
	code, out, errs := runParity(t, ours, "d", nvidia, "0")
	if code != 0 || !strings.HasSuffix(out, "CDI vs nvidia-ctk: 2 entries compared, 0 differences explained, 0 mismatches\n") {
		t.Fatalf("exit %d:\n%s%s", code, out, errs)
	}
	var spec cdiSpec
	if err := json.Unmarshal([]byte(ours), &spec); err != nil {
		t.Fatal(err)
	}
	got, err := cdiEntries(&spec, 0)
	want := map[string]bool{
		"link " + lib + "/libcuda.so -> " + lib + "/libcuda.so.580.1":   true,
		"link " + lib + "/libcuda.so.1 -> " + lib + "/libcuda.so.580.1": true,
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("entries %v (%v), want %v", got, err, want)
	}
	// A chain that ends elsewhere is a difference.
	nvidia = strings.Replace(nvidia, "libcuda.so.580.1::"+lib+"/libcuda.so\"", "libcuda.so.580.2::"+lib+"/libcuda.so\"", 1)
	if code, out, _ := runParity(t, ours, "d", nvidia, "0"); code != 1 ||
		!strings.Contains(out, "MISMATCH  only nvidia: link "+lib+"/libcuda.so -> "+lib+"/libcuda.so.580.2\n") {
		t.Errorf("changed target: exit %d:\n%s", code, out)
	}
}

func TestParityUsageAndBadInput(t *testing.T) {
	good := fmt.Sprintf(oursSpec, "", "")
	for _, c := range []struct {
		name, ours, device, want string
	}{
		{"no such device", good, "gpu-9", `devices: no device named "gpu-9" (it has ["example-claim-uid-gpu-0"])`},
		{"another kind", good, "nvidia.com/gpu=example-claim-uid-gpu-0", `the spec's kind is "k8s.gpu.nvidia.com/claim"`},
		{"not a CDI spec", `{"items": []}`, "d", "no cdiVersion or kind: not a CDI spec"},
		{"not JSON", `cdiVersion: 0.6.0`, "d", "invalid character"},
		{"a number for env", `{"cdiVersion": "0.6.0", "kind": "k/c", "devices": [{"name": "d", "containerEdits": {"env": [1]}}]}`, "d",
			"containerEdits.env"},
		{"a link without ::", `{"cdiVersion": "0.6.0", "kind": "k/c", "devices": [{"name": "d", "containerEdits": {"hooks": [
			{"hookName": "createContainer", "path": "/h", "args": ["h", "create-symlinks", "--link", "/usr/lib/libcuda.so"]}]}}]}`, "d",
			`devices[0].containerEdits.hooks[0].args: --link "/usr/lib/libcuda.so": not TARGET::/LINK`},
		{"a mount without hostPath", `{"cdiVersion": "0.6.0", "kind": "k/c", "containerEdits": {"mounts": [{"containerPath": "/x"}]},
			"devices": [{"name": "d"}]}`, "d", "containerEdits.mounts[0]: containerPath \"/x\", hostPath \"\": both are needed"},
		{"nothing for the device", `{"cdiVersion": "0.6.0", "kind": "k/c", "devices": [{"name": "d"}]}`, "d", "its edits give a container nothing"},
	} {
		code, out, errs := runParity(t, c.ours, c.device, nvidiaSpec, "0")
		if code != 2 || !strings.Contains(errs, "gpu-check-compare: --cdi-ours ") || !strings.Contains(errs, c.want) || out != "" {
			t.Errorf("%s: exit %d, stderr %q (want %q), stdout %q", c.name, code, errs, c.want, out)
		}
	}
	var out, errs bytes.Buffer
	for _, args := range [][]string{
		{"--cdi-ours", "a.json", "--cdi-ours-device", "d", "--cdi-nvidia", "b.json"},
		{"--cdi-ours", "a.json", "--cdi-ours-device", "d", "--cdi-nvidia", "b.json", "--cdi-nvidia-device", "0", "--smi", "smi.xml"},
		{"--slices", "s.json", "--smi", "smi.xml", "--cdi-nvidia-device", "0"},
	} {
		if code := run(args, &out, &errs); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if !strings.Contains(errs.String(), "two modes: give one") {
		t.Errorf("stderr: %s", errs.String())
	}
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, text string
		want          bool
	}{
		{"link */libGLX_indirect.so.0 *", "link /usr/lib64/libGLX_indirect.so.0 -> /usr/lib64/libGLX_mesa.so.0", true},
		{"link */libGLX_indirect.so.0 *", "link /usr/lib64/libGLX_nvidia.so.0 -> /usr/lib64/libGLX_indirect.so.0", false},
		{"env NVIDIA_VISIBLE_DEVICES=*", "env NVIDIA_VISIBLE_DEVICES=", true},
		{"env NVIDIA_VISIBLE_DEVICES=void", "env NVIDIA_VISIBLE_DEVICES=voids", false},
		{"a*b*a", "aba", true},
		{"a*b*a", "ab", false},
	} {
		if got := glob(c.pattern, c.text); got != c.want {
			t.Errorf("glob(%q, %q) = %v", c.pattern, c.text, got)
		}
	}
}
