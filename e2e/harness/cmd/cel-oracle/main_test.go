package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// A hand-written H100 device and a smaller one; attribute keys both bare (driver domain) and
// qualified.
const h100 = `{"name": "gpu-0",
  "attributes": {
    "type": {"string": "gpu"},
    "productName": {"string": "NVIDIA H100 80GB HBM3"},
    "architecture": {"string": "Hopper"},
    "cudaComputeCapability": {"version": "9.0.0"},
    "driverVersion": {"version": "580.126.20"},
    "gpu.nvidia.com/brand": {"string": "Nvidia"},
    "resource.kubernetes.io/numaNode": {"int": 1}
  },
  "capacity": {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}}}`

const a10 = `{"name": "gpu-1",
  "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA A10"},
                 "cudaComputeCapability": {"version": "8.6.0"}},
  "capacity": {"memory": {"value": "24Gi"}}}`

type line struct {
	driver, expr, device string
}

func (l line) json(t *testing.T) string {
	t.Helper()
	var dev any
	if err := json.Unmarshal([]byte(l.device), &dev); err != nil {
		t.Fatalf("test device: %v", err)
	}
	b, err := json.Marshal(map[string]any{"driver": l.driver, "expression": l.expr, "device": dev})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func runOracle(t *testing.T, input string) []output {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(nil, strings.NewReader(input), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var outs []output
	for _, l := range strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n") {
		var o output
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("bad output line %q: %v", l, err)
		}
		outs = append(outs, o)
	}
	return outs
}

func TestCELOracle(t *testing.T) {
	const drv = "gpu.nvidia.com"
	mem40 := `device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0`
	cases := []struct {
		name string
		in   line
		// want: "true", "false", "compile:<substring>", "runtime:<substring>", "input:<substring>"
		want string
	}{
		{"memory >= 40Gi on 80GB", line{drv, mem40, h100}, "true"},
		{"memory >= 40Gi on 24Gi", line{drv, mem40, a10}, "false"},
		{"quantity equality across units", line{drv, `device.capacity['gpu.nvidia.com'].memory == quantity('81559Mi') && quantity('1Gi') == quantity('1024Mi')`, h100}, "true"},
		{"semver isGreaterThan", line{drv, `device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.9.0'))`, h100}, "true"},
		{"semver on older GPU", line{drv, `device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.9.0'))`, a10}, "false"},
		{"qualified key in driver domain", line{drv, `device.attributes['gpu.nvidia.com'].brand == 'Nvidia'`, h100}, "true"},
		{"qualified key in other domain", line{drv, `device.attributes['resource.kubernetes.io'].numaNode == 1`, h100}, "true"},
		{"driver variable", line{drv, `device.driver == 'gpu.nvidia.com'`, h100}, "true"},
		{"bare names go to the given driver's domain", line{"other.example.com", `device.attributes['other.example.com'].architecture == 'Hopper'`, h100}, "true"},
		{"missing domain is an empty map", line{drv, `'x' in device.attributes['no.such.domain']`, h100}, "false"},
		{"has() on a missing attribute", line{drv, `has(device.attributes['gpu.nvidia.com'].profile)`, h100}, "false"},
		{"optional chaining", line{drv, `device.attributes['gpu.nvidia.com'].?profile.orValue('none') == 'none'`, h100}, "true"},
		{"missing attribute", line{drv, `device.attributes['gpu.nvidia.com'].architecture == 'Hopper'`, a10}, "runtime:no such key: architecture. consider using CEL optional chaining"},
		{"non-bool result", line{drv, `device.driver`, h100}, "compile:must evaluate to bool"},
		{"int result", line{drv, `1 + 1`, h100}, "compile:must evaluate to bool"},
		{"syntax error", line{drv, `device.driver ==`, h100}, "compile:Syntax error"},
		{"undeclared variable", line{drv, `gpu.memory > 1`, h100}, "compile:undeclared reference to 'gpu'"},
		{"bad regex literal", line{drv, `device.attributes['gpu.nvidia.com'].productName.matches('[')`, h100}, "compile:"},
		{"cel.bind", line{drv, `cel.bind(a, device.attributes['gpu.nvidia.com'], a.type == 'gpu' && a.architecture in ['Hopper', 'Blackwell'])`, h100}, "true"},
		{"allowMultipleAllocations defaults to false", line{drv, `device.allowMultipleAllocations`, h100}, "false"},
	}
	var input strings.Builder
	for _, c := range cases {
		input.WriteString(c.in.json(t) + "\n")
	}
	input.WriteString("\n") // empty lines produce no output
	input.WriteString("{not json\n")
	input.WriteString(`{"driver": "x", "expression": "true"}` + "\n")
	// Same expression again: served from the compile cache, same answer.
	input.WriteString(cases[0].in.json(t)) // last line without a newline

	outs := runOracle(t, input.String())
	if len(outs) != len(cases)+3 {
		t.Fatalf("want %d output lines, got %d: %+v", len(cases)+3, len(outs), outs)
	}
	check := func(name, want string, got output) {
		t.Helper()
		switch {
		case want == "true" || want == "false":
			if got.Error != nil || got.Result == nil || (*got.Result) != (want == "true") {
				t.Errorf("%s: want %s, got result=%v error=%+v", name, want, got.Result, got.Error)
			}
		default:
			kind, msg, _ := strings.Cut(want, ":")
			if got.Result != nil || got.Error == nil || got.Error.Kind != kind || !strings.Contains(got.Error.Message, msg) {
				t.Errorf("%s: want %s error containing %q, got result=%v error=%+v", name, kind, msg, got.Result, got.Error)
			}
		}
	}
	for i, c := range cases {
		check(c.name, c.want, outs[i])
	}
	check("invalid json", "input:invalid input line", outs[len(cases)])
	check("no device", `input:no "device"`, outs[len(cases)+1])
	check("cached repeat", "true", outs[len(cases)+2])
}

func TestCELOracleOutputShape(t *testing.T) {
	// The exact bytes matter: the Rust side shares this contract.
	in := line{"gpu.nvidia.com", `device.driver == 'gpu.nvidia.com'`, a10}.json(t) + "\n" +
		line{"gpu.nvidia.com", `device.driver != 'gpu.nvidia.com'`, a10}.json(t) + "\n"
	var stdout, stderr bytes.Buffer
	if code := run(nil, strings.NewReader(in), &stdout, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	if got, want := stdout.String(), "{\"result\":true}\n{\"result\":false}\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
