// Package celbench measures compile-once/evaluate-many of DRA CEL selectors with the library
// kube-scheduler uses: the standard selector set e2e/bench/selectors.json against the devices
// of an 8-GPU node with MIG placements, e2e/bench/devices.json (a plain JSON array of
// resource.k8s.io/v1 Device objects of driver gpu.nvidia.com).
//
//	cd e2e/harness && go test ./celbench -run '^$' -bench . -benchtime 2s
//
// prints the usual benchmark lines (with an ns/eval metric) and a plain `ns_per_eval=<n>` line.
package celbench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
)

// Driver is the driver of every device in devices.json.
const Driver = "gpu.nvidia.com"

// Selector is one entry of selectors.json.
type Selector struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
}

// BenchDir is e2e/bench relative to this package's directory (go test runs in it).
var BenchDir = filepath.Join("..", "..", "bench")

// Load reads selectors.json and devices.json from dir.
func Load(dir string) ([]Selector, []resourceapi.Device, error) {
	var sels []Selector
	var devs []resourceapi.Device
	if err := readJSON(filepath.Join(dir, "selectors.json"), &sels); err != nil {
		return nil, nil, err
	}
	if err := readJSON(filepath.Join(dir, "devices.json"), &devs); err != nil {
		return nil, nil, err
	}
	if len(sels) == 0 || len(devs) == 0 {
		return nil, nil, fmt.Errorf("%s: empty selector or device set", dir)
	}
	return sels, devs, nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
