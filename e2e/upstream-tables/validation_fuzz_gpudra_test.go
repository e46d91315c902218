// Beyond Kubernetes' validation tables: valid claims, templates, classes, taint rules and
// slices, each changed at random in one or two places (a value swapped for one of a pool of
// good and bad values, a list emptied, shortened, grown past a limit or given a duplicate, a
// field removed), sent to `gpu-dra match --print-v1` and to kube-apiserver's create path as
// validation_gpudra_test.go sends the table's objects; they must agree the same way. Unknown
// fields are not made (the API server's decoder here is not strict; kubectl's server-side field
// validation is, and so is gpu-dra). Opaque configs are for another driver: gpu-dra decodes its
// own drivers' configs as prepare would, which the API server does not.
//
// A null (a list item, a map's value) and a device capacity's or counter's value left out are
// read as the API server's Go decoder reads them, as zero values, and compared like the rest.
//
// GPU_DRA_VALIDATION_FUZZ: how many objects (default 1000); GPU_DRA_VALIDATION_SEED: the seed
// (default 1, so CI runs the same objects every time). The count line goes to
// GPU_DRA_TEST_REPORT when set.
package validation

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/kubernetes/pkg/registry/resource/deviceclass"
	"k8s.io/kubernetes/pkg/registry/resource/devicetaintrule"
	"k8s.io/kubernetes/pkg/registry/resource/resourceclaim"
	"k8s.io/kubernetes/pkg/registry/resource/resourceclaimtemplate"
	"k8s.io/kubernetes/pkg/registry/resource/resourceslice"
)

const fuzzClaim = `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"c","namespace":"default","labels":{"app":"x"}},
"spec":{"devices":{"requests":[
 {"name":"gpu","exactly":{"deviceClassName":"gpu.nvidia.com","allocationMode":"ExactCount","count":2,
  "selectors":[{"cel":{"expression":"device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA')"}}],
  "tolerations":[{"key":"gpu.nvidia.com/xid","operator":"Exists","effect":"NoSchedule"}]}},
 {"name":"mig","firstAvailable":[
  {"name":"big","deviceClassName":"mig.nvidia.com","allocationMode":"ExactCount","count":1},
  {"name":"small","deviceClassName":"mig.nvidia.com","allocationMode":"All"}]}],
"constraints":[{"requests":["gpu","mig/big"],"matchAttribute":"gpu.nvidia.com/uuid"}],
"config":[{"requests":["gpu"],"opaque":{"driver":"example.com","parameters":{"a":1}}}]}}}`

const fuzzTemplate = `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimTemplate","metadata":{"name":"t","namespace":"default"},
"spec":{"metadata":{"labels":{"a":"b"}},"spec":{"devices":{"requests":[
 {"name":"gpu","exactly":{"deviceClassName":"gpu.nvidia.com","count":1,
  "selectors":[{"cel":{"expression":"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}]}}]}}}}`

const fuzzClass = `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"gpu.example.com"},
"spec":{"selectors":[{"cel":{"expression":"device.driver == 'gpu.nvidia.com'"}}],
"config":[{"opaque":{"driver":"example.com","parameters":{"kind":"x"}}}],"extendedResourceName":"example.com/gpu"}}`

const fuzzTaintRule = `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceTaintRule","metadata":{"name":"r"},
"spec":{"deviceSelector":{"driver":"gpu.nvidia.com","pool":"node-1","device":"gpu-0"},
"taint":{"key":"example.com/maintenance","value":"planned","effect":"NoExecute"}}}`

const fuzzSlice = `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"s"},
"spec":{"driver":"gpu.nvidia.com","pool":{"name":"node-1","generation":1,"resourceSliceCount":1},"nodeName":"node-1",
"devices":[
 {"name":"gpu-0","attributes":{"type":{"string":"gpu"},"index":{"int":0},"driverVersion":{"version":"580.1.0"},
  "gpu.nvidia.com/uuid":{"string":"GPU-1"},"resource.kubernetes.io/pcieRoot":{"string":"pci0000:00"}},
  "capacity":{"memory":{"value":"80Gi"}},
  "taints":[{"key":"gpu.nvidia.com/xid","value":"48","effect":"NoSchedule"}]},
 {"name":"gpu-0-mig-1g10gb-19-0","attributes":{"type":{"string":"mig"},"profile":{"string":"1g.10gb"}},
  "capacity":{"memory":{"value":"10Gi"}},
  "consumesCounters":[{"counterSet":"gpu-0-counter-set","counters":{"memory-slice-0":{"value":"1"}}}],
  "bindingConditions":["example.com/ready"],"bindingFailureConditions":["example.com/failed"]}]}}`

const fuzzCounterSlice = `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"counters"},
"spec":{"driver":"gpu.nvidia.com","pool":{"name":"node-1","generation":1,"resourceSliceCount":2},"nodeName":"node-1",
"sharedCounters":[{"name":"gpu-0-counter-set","counters":{"memory-slice-0":{"value":"1"},"multiprocessors":{"value":"132"}}}]}}`

const fuzzSharedSlice = `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"shared"},
"spec":{"driver":"gpu.nvidia.com","pool":{"name":"node-1","generation":1,"resourceSliceCount":1},"nodeName":"node-1",
"devices":[
 {"name":"gpu-0","allowMultipleAllocations":true,
  "capacity":{"memory":{"value":"80Gi","requestPolicy":{"default":"1Gi","validRange":{"min":"1Gi","max":"80Gi","step":"1Gi"}}},
   "shares":{"value":"4","requestPolicy":{"default":"1","validValues":["1","2","4"]}}}}]}}`

// Values a field may be swapped for: good and bad names, lengths at and past limits, numbers,
// versions, operators, expressions, quantities.
var fuzzValues = []any{
	"", "x", "A", "Bad_Name", "-a", "a-", "a.b", "a_b", "a/b", "a/b/c", "example.com/x", "/x", "x/",
	"kubernetes.io/x", "nvidia.com/gpu", "requests.example.com/x", "cpu", "hugepages-2Mi",
	strings.Repeat("a", 32), strings.Repeat("a", 33), strings.Repeat("a", 63), strings.Repeat("a", 64),
	strings.Repeat("a", 65), strings.Repeat("a", 253), strings.Repeat("a", 254),
	"1.2.3", "1.2", "01.2.3", "1.2.3-rc.1", "NoSchedule", "NoExecute", "None", "Foo", "Exists", "Equal",
	"ExactCount", "All", "device.driver == 'x'", "device.attributes['a'].b > 1", "1 +", "true",
	"-1Gi", "0", "1Gi", "2Gi", "80Gi", "81Gi", "1.5Gi", "0.5", "3", "5", "1e3", "!@#",
	0, -1, 1, 2, 33, 65, true, false, nil,
}

type fuzzSeed struct {
	doc      string
	resource string
	strategy rest.RESTCreateStrategy
}

func TestGpuDRAValidationFuzz(t *testing.T) {
	count, seed := 1000, uint64(1)
	if v, err := strconv.Atoi(os.Getenv("GPU_DRA_VALIDATION_FUZZ")); err == nil {
		count = v
	}
	if v, err := strconv.ParseUint(os.Getenv("GPU_DRA_VALIDATION_SEED"), 10, 64); err == nil {
		seed = v
	}
	namespaces := adminNamespaces()
	seeds := []fuzzSeed{
		{fuzzClaim, "resourceclaims", resourceclaim.NewStrategy(namespaces, nil)},
		{fuzzTemplate, "resourceclaimtemplates", resourceclaimtemplate.NewStrategy(namespaces)},
		{fuzzClass, "deviceclasses", deviceclass.Strategy},
		{fuzzTaintRule, "devicetaintrules", devicetaintrule.Strategy},
		{fuzzSlice, "resourceslices", resourceslice.Strategy},
		{fuzzCounterSlice, "resourceslices", resourceslice.Strategy},
		{fuzzSharedSlice, "resourceslices", resourceslice.Strategy},
	}
	// Each seed must be accepted by both as it is.
	for _, s := range seeds {
		if problem := compareJSON([]byte(s.doc), s.resource, s.strategy); problem != "" {
			t.Fatalf("seed %s: %s", s.resource, problem)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	mismatches, refused := 0, 0
	for i := range count {
		s := seeds[rng.IntN(len(seeds))]
		var doc any
		if err := json.Unmarshal([]byte(s.doc), &doc); err != nil {
			t.Fatal(err)
		}
		for range 1 + rng.IntN(2) {
			doc = mutate(rng, doc)
		}
		data, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if want, err := apiServerCreate(data, s.resource, s.strategy); err != nil || len(want) > 0 {
			refused++
		}
		if problem := compareJSON(data, s.resource, s.strategy); problem != "" {
			mismatches++
			shown := string(data)
			if len(shown) > 2000 {
				shown = shown[:2000] + "..."
			}
			if len(problem) > 2000 {
				problem = problem[:2000] + "..."
			}
			t.Errorf("object %d (seed %d): %s\n%s", i, seed, problem, shown)
		}
	}
	gates := "default gates"
	if g := os.Getenv("GPU_DRA_VALIDATION_GATES"); g != "" {
		gates = "gates " + g
	}
	line := fmt.Sprintf("validation fuzz (seed %d, %s): %d changed objects, %d refused by the API server, %d mismatches", seed, gates, count, refused, mismatches)
	t.Log(line)
	if report := os.Getenv("GPU_DRA_TEST_REPORT"); report != "" {
		if f, err := os.OpenFile(report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
}

// mutate changes one place of doc (never apiVersion or kind) and returns the new doc.
func mutate(rng *rand.Rand, doc any) any {
	type place struct {
		set   func(any)
		value any
	}
	var places []place
	var walk func(v any, set func(any))
	walk = func(v any, set func(any)) {
		places = append(places, place{set, v})
		switch v := v.(type) {
		case map[string]any:
			// In key order: Go's map order is random, and a seed must pick the same places.
			for _, k := range slices.Sorted(maps.Keys(v)) {
				if k == "apiVersion" || k == "kind" {
					continue
				}
				child := v[k]
				walk(child, func(n any) {
					if n == deleted {
						delete(v, k)
					} else {
						v[k] = n
					}
				})
			}
		case []any:
			for i, child := range v {
				walk(child, func(n any) {
					if n == deleted {
						v[i] = nil
					} else {
						v[i] = n
					}
				})
			}
		}
	}
	walk(doc, func(n any) { doc = n })
	p := places[1+rng.IntN(len(places)-1)]
	switch v := p.value.(type) {
	case []any:
		switch rng.IntN(4) {
		case 0:
			p.set([]any{})
		case 1:
			if len(v) > 0 {
				p.set(append(v[:0:0], v[1:]...))
			}
		case 2:
			if len(v) > 0 {
				p.set(append(append([]any{}, v...), v[rng.IntN(len(v))]))
			}
		default:
			if len(v) > 0 {
				grown := append([]any{}, v...)
				limit := []int{8, 16, 32, 64, 128}[rng.IntN(5)]
				for len(grown) <= limit {
					grown = append(grown, v[rng.IntN(len(v))])
				}
				p.set(grown)
			}
		}
	case map[string]any:
		if rng.IntN(2) == 0 {
			p.set(deleted)
		} else {
			p.set(map[string]any{})
		}
	default:
		if rng.IntN(8) == 0 {
			p.set(deleted)
		} else {
			p.set(fuzzValues[rng.IntN(len(fuzzValues))])
		}
	}
	return doc
}

// deleted, passed to a place's setter, removes the field (or nulls a list item).
var deleted = &struct{}{}
