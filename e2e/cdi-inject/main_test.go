package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// invoke runs the tool's main logic and decodes its one JSON object.
func invoke(t *testing.T, args ...string) (int, output, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	var out output
	if code != exitUsage {
		if strings.Contains(stdout.String(), "null") {
			t.Errorf("null in the JSON (want empty arrays/objects):\n%s", stdout.String())
		}
		dec := json.NewDecoder(&stdout)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&out); err != nil {
			t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout.String())
		}
	}
	return code, out, stderr.String()
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestValidAndInvalidSpecs(t *testing.T) {
	tmp := t.TempDir()
	specDir := filepath.Join(tmp, "cdi")
	devDir := filepath.Join(tmp, "dev")
	for _, d := range []string{specDir, devDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	node := filepath.Join(devDir, "nvidia0")
	write(t, node, "") // a regular file, not a device node: fine when type and major are given
	missing := filepath.Join(devDir, "nvidia9")

	valid := filepath.Join(specDir, "k8s.gpu.nvidia.com-claim_uid-1.json")
	write(t, valid, `{
  "cdiVersion": "0.6.0",
  "kind": "k8s.gpu.nvidia.com/claim",
  "devices": [
    {"name": "uid-1-gpu-0", "containerEdits": {
      "env": ["NVIDIA_VISIBLE_DEVICES=GPU-0"],
      "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "`+node+`", "type": "c", "major": 195, "minor": 0}],
      "mounts": [{"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]}],
      "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"], "env": ["A=1"]}]
    }},
    {"name": "uid-1-gpu-9", "containerEdits": {
      "deviceNodes": [{"path": "/dev/nvidia9", "hostPath": "`+missing+`", "type": "c", "major": 195, "minor": 9}]
    }},
    {"name": "uid-1-gpu-9-nomajor", "containerEdits": {
      "deviceNodes": [{"path": "/dev/nvidia9", "hostPath": "`+missing+`"}]
    }},
    {"name": "uid-1-regular-file-nomajor", "containerEdits": {
      "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "`+node+`", "type": "c"}]
    }}
  ]
}`)
	// Unknown field: the library decodes strictly and rejects the whole file.
	invalid := filepath.Join(specDir, "k8s.gpu.nvidia.com-claim_uid-2.json")
	write(t, invalid, `{"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim", "bogus": 1,
  "devices": [{"name": "uid-2-gpu-0", "containerEdits": {"env": ["A=1"]}}]}`)
	write(t, filepath.Join(specDir, "ignored.txt"), "not a spec")

	code, out, stderr := invoke(t, "--spec-dir", specDir, "--device", "k8s.gpu.nvidia.com/claim=uid-1-gpu-0")
	if code != exitSpecErrors {
		t.Fatalf("exit %d, want %d (invalid spec); stderr:\n%s", code, exitSpecErrors, stderr)
	}
	if len(out.SpecErrors) != 1 || len(out.SpecErrors[invalid]) == 0 {
		t.Fatalf("specErrors = %v, want only %s", out.SpecErrors, invalid)
	}
	if !strings.Contains(out.SpecErrors[invalid][0], "bogus") || !strings.Contains(stderr, invalid) {
		t.Errorf("spec error %q / stderr %q should name the file and the field", out.SpecErrors[invalid][0], stderr)
	}
	if !slices.Equal(out.Vendors, []string{"k8s.gpu.nvidia.com"}) {
		t.Errorf("vendors = %v", out.Vendors)
	}
	wantDevices := []string{
		"k8s.gpu.nvidia.com/claim=uid-1-gpu-0", "k8s.gpu.nvidia.com/claim=uid-1-gpu-9",
		"k8s.gpu.nvidia.com/claim=uid-1-gpu-9-nomajor", "k8s.gpu.nvidia.com/claim=uid-1-regular-file-nomajor",
	}
	if !slices.Equal(out.Devices, wantDevices) {
		t.Errorf("devices = %v, want %v", out.Devices, wantDevices)
	}
	if want := []linuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}}; !slices.Equal(out.LinuxDevices, want) {
		t.Errorf("linuxDevices = %+v, want %+v", out.LinuxDevices, want)
	}
	if !slices.Equal(out.Env, []string{"NVIDIA_VISIBLE_DEVICES=GPU-0"}) {
		t.Errorf("env = %v", out.Env)
	}
	if len(out.Mounts) != 1 || out.Mounts[0].Source != "/usr/lib/libcuda.so.1" ||
		out.Mounts[0].Destination != "/usr/lib/libcuda.so.1" ||
		!slices.Equal(out.Mounts[0].Options, []string{"ro", "nosuid", "nodev", "bind"}) {
		t.Errorf("mounts = %+v", out.Mounts)
	}
	cc := out.Hooks["createContainer"]
	if len(cc) != 1 || cc[0].Path != "/usr/bin/nvidia-cdi-hook" ||
		!slices.Equal(cc[0].Args, []string{"nvidia-cdi-hook", "update-ldcache"}) || !slices.Equal(cc[0].Env, []string{"A=1"}) {
		t.Errorf("createContainer hooks = %+v", cc)
	}
	for _, name := range []string{"prestart", "createRuntime", "startContainer", "poststart", "poststop"} {
		if h, ok := out.Hooks[name]; !ok || len(h) != 0 {
			t.Errorf("hooks[%s] = %v, want present and empty", name, h)
		}
	}

	// A node whose host path does not exist: ignored when type and major are given...
	code, out, stderr = invoke(t, "--spec-dir", specDir, "--device", "k8s.gpu.nvidia.com/claim=uid-1-gpu-9")
	if code != exitSpecErrors || len(out.LinuxDevices) != 1 || out.LinuxDevices[0].Minor != 9 {
		t.Errorf("missing node with major: exit %d, linuxDevices %+v; stderr:\n%s", code, out.LinuxDevices, stderr)
	}
	// ...an injection failure otherwise; and so is a regular file without a major.
	for dev, want := range map[string]string{
		"uid-1-gpu-9-nomajor":        "no such file or directory",
		"uid-1-regular-file-nomajor": "not a device node",
	} {
		code, out, stderr = invoke(t, "--spec-dir", specDir, "--device", "k8s.gpu.nvidia.com/claim="+dev)
		if code != exitInjectError || !strings.Contains(out.InjectError, "failed to stat CDI host device") ||
			!strings.Contains(out.InjectError, want) || !strings.Contains(stderr, want) {
			t.Errorf("%s: exit %d, injectError %q, want %d and %q; stderr:\n%s", dev, code, out.InjectError, exitInjectError, want, stderr)
		}
		if len(out.LinuxDevices) != 0 || len(out.Env) != 0 {
			t.Errorf("%s: a failed injection reported edits: %+v", dev, out)
		}
	}
}

func TestUnresolvedAndCommaList(t *testing.T) {
	specDir := t.TempDir()
	write(t, filepath.Join(specDir, "a.yaml"), `cdiVersion: "0.6.0"
kind: k8s.gpu.nvidia.com/claim
devices:
- name: a
  containerEdits: {env: ["A=1"]}
- name: b
  containerEdits: {env: ["B=2"]}
`)
	code, out, stderr := invoke(t, "--spec-dir", specDir, "--device", "k8s.gpu.nvidia.com/claim=a,k8s.gpu.nvidia.com/claim=b")
	if code != exitOK || !slices.Equal(out.Env, []string{"A=1", "B=2"}) || len(out.SpecErrors) != 0 {
		t.Fatalf("exit %d env %v specErrors %v; stderr:\n%s", code, out.Env, out.SpecErrors, stderr)
	}
	code, out, stderr = invoke(t, "--spec-dir", specDir, "--device", "k8s.gpu.nvidia.com/claim=a", "--device", "k8s.gpu.nvidia.com/claim=nope")
	if code != exitInjectError || !slices.Equal(out.Unresolved, []string{"k8s.gpu.nvidia.com/claim=nope"}) ||
		!strings.Contains(stderr, "unresolvable CDI devices") {
		t.Fatalf("exit %d unresolved %v; stderr:\n%s", code, out.Unresolved, stderr)
	}
	// No devices: just the cache's view.
	code, out, _ = invoke(t, "--spec-dir", specDir)
	if code != exitOK || len(out.Devices) != 2 || out.LinuxDevices == nil || out.Hooks == nil {
		t.Fatalf("exit %d out %+v", code, out)
	}
	// A spec dir that does not exist is a usage error, not an empty cache.
	if code, _, _ = invoke(t, "--spec-dir", filepath.Join(specDir, "nope")); code != exitUsage {
		t.Fatalf("missing spec dir: exit %d", code)
	}
}

func TestInjectIntoABundleSpec(t *testing.T) {
	tmp := t.TempDir()
	specDir := filepath.Join(tmp, "cdi")
	if err := os.Mkdir(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(specDir, "k8s.gpu.nvidia.com-claim_uid-1.json"), `{
  "cdiVersion": "0.6.0",
  "kind": "k8s.gpu.nvidia.com/claim",
  "devices": [{"name": "gpu-0", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-0"]}}]
}`)
	bundle := filepath.Join(tmp, "config.json")
	write(t, bundle, `{"ociVersion": "1.2.0", "process": {"args": ["/probe"], "cwd": "/", "env": ["PATH=/bin"]}, "root": {"path": "rootfs"}, "linux": {}}`)
	injected := filepath.Join(tmp, "injected.json")

	code, out, stderr := invoke(t, "--spec-dir", specDir, "--device", "k8s.gpu.nvidia.com/claim=gpu-0",
		"--oci-spec", bundle, "--write-spec", injected)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !slices.Contains(out.Env, "NVIDIA_VISIBLE_DEVICES=GPU-0") {
		t.Errorf("env %v", out.Env)
	}
	raw, err := os.ReadFile(injected)
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Process struct {
			Args []string `json:"args"`
			Env  []string `json:"env"`
		} `json:"process"`
		Root struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	// The bundle's own settings stay; the claim's edits are added.
	if !slices.Equal(spec.Process.Args, []string{"/probe"}) || spec.Root.Path != "rootfs" ||
		!slices.Equal(spec.Process.Env, []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-0"}) {
		t.Errorf("written spec: %s", raw)
	}

	// Half of the pair is a usage error, and nothing is written.
	if code, _, _ := invoke(t, "--spec-dir", specDir, "--oci-spec", bundle); code != exitUsage {
		t.Errorf("--oci-spec alone: exit %d", code)
	}
	// An unresolvable device writes nothing.
	other := filepath.Join(tmp, "other.json")
	if code, _, _ := invoke(t, "--spec-dir", specDir, "--device", "k8s.gpu.nvidia.com/claim=gpu-9",
		"--oci-spec", bundle, "--write-spec", other); code != exitInjectError {
		t.Errorf("unresolved device: exit %d", code)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("a failed injection wrote %s", other)
	}
}
