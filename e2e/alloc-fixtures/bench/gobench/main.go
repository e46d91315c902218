// gobench times Kubernetes' structured allocator (k8s.io/dynamic-resource-allocation, the
// code kube-scheduler runs) on the inputs benches/alloc.rs dumps, so the Rust allocator can
// be compared on identical work. Features are kube-scheduler 1.37's defaults, as in the
// alloc-oracle.
//
// Usage: gobench DIR   (DIR holds slices.json, classes.json, claims-1.json, claims-100.json)
//
// Prints one line per case: "<name> <ns/op> <allocated>".
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

var features = structured.Features{
	AdminAccess:            true,
	PrioritizedList:        true,
	PartitionableDevices:   true,
	DeviceTaints:           true,
	DeviceBindingAndStatus: true,
	ConsumableCapacity:     true,
}

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }
func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

func read[T any](dir, name string) []*T {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		panic(err)
	}
	var items []*T
	if err := json.Unmarshal(data, &items); err != nil {
		panic(fmt.Sprintf("%s: %v", name, err))
	}
	return items
}

// defaults applies the apiserver defaulting the allocator relies on.
func defaults(claims []*resourceapi.ResourceClaim) {
	for _, c := range claims {
		for i := range c.Spec.Devices.Requests {
			if e := c.Spec.Devices.Requests[i].Exactly; e != nil {
				if e.AllocationMode == "" {
					e.AllocationMode = resourceapi.DeviceAllocationModeExactCount
				}
				if e.AllocationMode == resourceapi.DeviceAllocationModeExactCount && e.Count == 0 {
					e.Count = 1
				}
			}
		}
	}
}

func newState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// allocateInOrder allocates claims one by one, a fresh allocator per claim as each
// scheduling cycle builds one, marking devices in use as the scheduler does.
func allocateInOrder(ctx context.Context, node *v1.Node, slices []*resourceapi.ResourceSlice,
	classes classLister, cache *cel.Cache, claims []*resourceapi.ResourceClaim) int {
	state := newState()
	allocated := 0
	for _, claim := range claims {
		alloc, err := structured.NewAllocator(ctx, features, state, classes, slices, cache)
		if err != nil {
			panic(err)
		}
		results, err := alloc.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
		if err != nil || len(results) == 0 {
			continue
		}
		allocated++
		for _, r := range results[0].Devices.Results {
			if ptr.Deref(r.AdminAccess, false) {
				continue
			}
			state.AllocatedDevices.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
	}
	return allocated
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gobench DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	slices := read[resourceapi.ResourceSlice](dir, "slices.json")
	classes := classLister(read[resourceapi.DeviceClass](dir, "classes.json"))
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-node", Labels: map[string]string{v1.LabelHostname: "sim-node"}}}
	// The scheduler's CEL cache lives across scheduling cycles; so does this one.
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	ctx := context.Background()
	for _, name := range []string{"claims-1.json", "claims-100.json"} {
		claims := read[resourceapi.ResourceClaim](dir, name)
		defaults(claims)
		allocated := allocateInOrder(ctx, node, slices, classes, cache, claims)
		r := testing.Benchmark(func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				allocateInOrder(ctx, node, slices, classes, cache, claims)
			}
		})
		fmt.Printf("%s %d %d\n", name, r.NsPerOp(), allocated)
	}
}
