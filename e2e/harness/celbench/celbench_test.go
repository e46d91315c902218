package celbench

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/dynamic-resource-allocation/cel"

	"gpu-dra/e2e/harness/internal/draconfig"
)

func compileAll(tb testing.TB, sels []Selector) []cel.CompilationResult {
	tb.Helper()
	c := cel.GetCompiler(draconfig.CELFeatures())
	out := make([]cel.CompilationResult, len(sels))
	for i, s := range sels {
		// Same options as the scheduler's cache (cel.Cache.GetOrCompile).
		out[i] = c.CompileCELExpression(s.Expression, cel.Options{DisableCostEstimation: true})
		if out[i].Error != nil {
			tb.Fatalf("selector %s: %v", s.Name, out[i].Error)
		}
	}
	return out
}

func celDevices() ([]Selector, []cel.Device, error) {
	sels, devs, err := Load(BenchDir)
	if err != nil {
		return nil, nil, err
	}
	out := make([]cel.Device, len(devs))
	for i, d := range devs {
		out[i] = cel.Device{Driver: Driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity}
	}
	return sels, out, nil
}

// TestSelectorSet keeps the standard set meaningful: every selector compiles, evaluates on
// every device without error, and selects some but not all devices (except where noted).
func TestSelectorSet(t *testing.T) {
	sels, devs, err := celDevices()
	if err != nil {
		t.Fatal(err)
	}
	if len(sels) < 10 {
		t.Errorf("want at least 10 selectors, have %d", len(sels))
	}
	progs := compileAll(t, sels)
	for i, p := range progs {
		matched := 0
		for _, d := range devs {
			ok, _, err := p.DeviceMatches(context.Background(), d)
			if err != nil {
				t.Errorf("selector %s: %v", sels[i].Name, err)
			}
			if ok {
				matched++
			}
		}
		t.Logf("%-30s matches %2d/%d devices", sels[i].Name, matched, len(devs))
		// The selectors below hold for every device of a homogeneous H100 node.
		everything := map[string]bool{"product-name-equals": true, "product-name-regex": true, "architecture-hopper": true,
			"compute-capability-above-8.9": true, "driver-version-at-least-570": true, "bind-hopper-cuda12": true}
		if matched == 0 || (matched == len(devs) && !everything[sels[i].Name]) {
			t.Errorf("selector %s matches %d of %d devices: not a useful benchmark selector", sels[i].Name, matched, len(devs))
		}
	}
}

// BenchmarkEvaluate: each selector compiled once, then evaluated on every device per iteration
// (DeviceMatches builds the attribute maps per call, as in the scheduler).
func BenchmarkEvaluate(b *testing.B) {
	sels, devs, err := celDevices()
	if err != nil {
		b.Fatal(err)
	}
	progs := compileAll(b, sels)
	ctx := context.Background()
	iters := 0
	for b.Loop() {
		for _, p := range progs {
			for _, d := range devs {
				if _, _, err := p.DeviceMatches(ctx, d); err != nil {
					b.Fatal(err)
				}
			}
		}
		iters++
	}
	evals := iters * len(progs) * len(devs)
	nsPerEval := float64(b.Elapsed().Nanoseconds()) / float64(evals)
	b.ReportMetric(nsPerEval, "ns/eval")
	// With b.Loop the code after the loop runs once per benchmark run, so this prints once.
	fmt.Printf("selectors=%d devices=%d evaluations=%d\nns_per_eval=%.0f\n", len(progs), len(devs), evals, nsPerEval)
}

// BenchmarkCompile: the one-time cost that the cache amortizes.
func BenchmarkCompile(b *testing.B) {
	sels, _, err := celDevices()
	if err != nil {
		b.Fatal(err)
	}
	c := cel.GetCompiler(draconfig.CELFeatures())
	n := 0
	for b.Loop() {
		for _, s := range sels {
			if r := c.CompileCELExpression(s.Expression, cel.Options{DisableCostEstimation: true}); r.Error != nil {
				b.Fatal(r.Error)
			}
		}
		n++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*len(sels)), "ns/compile")
}
