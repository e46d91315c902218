package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// One node with three GPUs: gpu-0 (40Gi, NUMA 0), gpu-1 and gpu-2 (80Gi, NUMA 1), plus a
// slice for another node that must be ignored. Multi-document YAML.
const slicesYAML = `
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-a-gpu}
spec:
  driver: gpu.nvidia.com
  nodeName: node-a
  pool: {name: node-a, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes:
      type: {string: gpu}
      resource.kubernetes.io/numaNode: {int: 0}
    capacity: {memory: {value: 40Gi}}
  - name: gpu-1
    attributes:
      type: {string: gpu}
      resource.kubernetes.io/numaNode: {int: 1}
    capacity: {memory: {value: 80Gi}}
  - name: gpu-2
    attributes:
      type: {string: gpu}
      resource.kubernetes.io/numaNode: {int: 1}
    capacity: {memory: {value: 80Gi}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-b-gpu}
spec:
  driver: gpu.nvidia.com
  nodeName: node-b
  pool: {name: node-b, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes: {type: {string: gpu}}
    capacity: {memory: {value: 80Gi}}
`

// A v1 List in JSON.
const classesJSON = `{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
   "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}},
  {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "broken"},
   "spec": {"selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].noSuchAttribute == 1"}}]}}
]}`

func claimYAML(name, spec string) string {
	return "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: " + name + ", namespace: default}\nspec:\n" + spec + "\n"
}

const oneGPU = `  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}`

const bigGPU = `  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"}`

// Two GPUs on the same NUMA node: gpu-0 is first but has no NUMA peer, so the allocator must
// backtrack to gpu-1 + gpu-2.
const twoOnSameNUMA = `  devices:
    requests:
    - name: a
      exactly: {deviceClassName: gpu.nvidia.com}
    - name: b
      exactly: {deviceClassName: gpu.nvidia.com}
    constraints:
    - requests: [a, b]
      matchAttribute: resource.kubernetes.io/numaNode`

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func runOracle(t *testing.T, dir string, extra ...string) report {
	t.Helper()
	args := append([]string{
		"--slices", filepath.Join(dir, "slices.yaml"),
		"--classes", filepath.Join(dir, "classes.json"),
		"--claims", filepath.Join(dir, "claims.yaml"),
		"--node", "node-a",
	}, extra...)
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bad output: %v\n%s", err, stdout.String())
	}
	return rep
}

// devices returns "request=device,..." of an allocation, or the outcome.
func devices(r claimResult) string {
	switch {
	case r.Error != "":
		return "error: " + r.Error
	case r.Unsatisfiable:
		return "unsatisfiable"
	case r.Allocation == nil:
		return "nothing"
	}
	var parts []string
	for _, d := range r.Allocation.Devices.Results {
		parts = append(parts, d.Request+"="+d.Driver+"/"+d.Pool+"/"+d.Device)
	}
	return strings.Join(parts, ",")
}

func TestAllocateInOrder(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"slices.yaml":  slicesYAML,
		"classes.json": classesJSON,
		"claims.yaml": claimYAML("any-1", oneGPU) + claimYAML("big-1", bigGPU) +
			claimYAML("big-2", bigGPU) + claimYAML("any-2", oneGPU),
	})
	rep := runOracle(t, dir)
	want := []string{
		"gpu=gpu.nvidia.com/node-a/gpu-0", // first matching device
		"gpu=gpu.nvidia.com/node-a/gpu-1", // first device with >= 80Gi
		"gpu=gpu.nvidia.com/node-a/gpu-2", // gpu-1 is now in use
		"unsatisfiable",                   // all three in use; node-b's GPU is not on this node
	}
	if rep.Node != "node-a" || len(rep.Claims) != len(want) {
		t.Fatalf("report: %+v", rep)
	}
	for i, w := range want {
		if got := devices(rep.Claims[i]); got != w {
			t.Errorf("claim %s: got %s, want %s", rep.Claims[i].Name, got, w)
		}
	}
	if a := rep.Claims[0].Allocation; a == nil || a.NodeSelector == nil || !strings.Contains(a.NodeSelector.String(), "node-a") {
		t.Errorf("allocation should be restricted to node-a: %+v", a.NodeSelector)
	}
}

func TestAllocateMatchAttribute(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"slices.yaml":  slicesYAML,
		"classes.json": classesJSON,
		"claims.yaml":  claimYAML("pair", twoOnSameNUMA) + claimYAML("pair-2", twoOnSameNUMA),
	})
	rep := runOracle(t, dir)
	if got, want := devices(rep.Claims[0]), "a=gpu.nvidia.com/node-a/gpu-1,b=gpu.nvidia.com/node-a/gpu-2"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if got := devices(rep.Claims[1]); got != "unsatisfiable" {
		t.Errorf("second pair: got %s, want unsatisfiable (only gpu-0 left)", got)
	}
}

func TestAllocatePreallocated(t *testing.T) {
	allocated := claimYAML("old", oneGPU) + `status:
  allocation:
    devices:
      results:
      - {request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-1}
`
	dir := writeFiles(t, map[string]string{
		"slices.yaml":    slicesYAML,
		"classes.json":   classesJSON,
		"claims.yaml":    claimYAML("big", bigGPU) + claimYAML("big-again", bigGPU),
		"allocated.yaml": allocated,
	})
	rep := runOracle(t, dir, "--allocated", filepath.Join(dir, "allocated.yaml"))
	if got, want := devices(rep.Claims[0]), "gpu=gpu.nvidia.com/node-a/gpu-2"; got != want {
		t.Errorf("got %s, want %s (gpu-1 is in use)", got, want)
	}
	if got := devices(rep.Claims[1]); got != "unsatisfiable" {
		t.Errorf("got %s, want unsatisfiable", got)
	}
}

func TestAllocateErrors(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"slices.yaml":  slicesYAML,
		"classes.json": classesJSON,
		"claims.yaml": claimYAML("cel-runtime", `  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: broken}`) + claimYAML("no-class", `  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: nope}`) + claimYAML("fine", oneGPU),
	})
	rep := runOracle(t, dir)
	if got := devices(rep.Claims[0]); !strings.Contains(got, "error: ") || !strings.Contains(got, "CEL runtime error: no such key: noSuchAttribute") {
		t.Errorf("cel-runtime: %s", got)
	}
	if got := devices(rep.Claims[1]); !strings.Contains(got, "error: ") || !strings.Contains(got, "nope") {
		t.Errorf("no-class: %s", got)
	}
	if got := devices(rep.Claims[2]); got != "gpu=gpu.nvidia.com/node-a/gpu-0" {
		t.Errorf("fine: %s", got)
	}
}

func TestBadInput(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"slices.yaml":  strings.Replace(slicesYAML, "nodeName: node-a", "nodeNme: node-a", 1),
		"classes.json": classesJSON,
		"claims.yaml":  claimYAML("x", oneGPU),
	})
	var stdout, stderr bytes.Buffer
	code := run([]string{"--slices", filepath.Join(dir, "slices.yaml"), "--classes", filepath.Join(dir, "classes.json"),
		"--claims", filepath.Join(dir, "claims.yaml")}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "nodeNme") {
		t.Errorf("unknown field must be rejected loudly: %d %s", code, stderr.String())
	}
	if code := run([]string{"--slices", "x"}, &stdout, &stderr); code != 2 {
		t.Errorf("missing flags: want 2, got %d", code)
	}
}

// With DRAOptionalNodeOperations the experimental allocator only hands out devices of slices
// with skipNodeOperations on nodes that declare the feature, and copies the list into results.
func TestNodeDeclaredFeatures(t *testing.T) {
	slices := strings.Replace(slicesYAML, "  pool: {name: node-a,",
		"  skipNodeOperations: [NodePrepareResources]\n  pool: {name: node-a,", 1)
	dir := writeFiles(t, map[string]string{
		"slices.yaml":  slices,
		"classes.json": classesJSON,
		"claims.yaml":  claimYAML("any-1", oneGPU),
	})
	gates := "--feature-gates=DRAOptionalNodeOperations=true"
	if got := devices(runOracle(t, dir, gates).Claims[0]); got != "unsatisfiable" {
		t.Errorf("undeclared node: got %s", got)
	}
	rep := runOracle(t, dir, gates, "--node-declared-features=DRAOptionalNodeOperations")
	if got := devices(rep.Claims[0]); got != "gpu=gpu.nvidia.com/node-a/gpu-0" {
		t.Fatalf("declaring node: got %s", got)
	}
	if ops := rep.Claims[0].Allocation.Devices.Results[0].SkipNodeOperations; len(ops) != 1 || ops[0] != "NodePrepareResources" {
		t.Errorf("skipNodeOperations in result: %v", ops)
	}
}
