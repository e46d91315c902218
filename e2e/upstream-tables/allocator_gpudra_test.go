// Package gpudra runs Kubernetes' own allocator test table
// (k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting, the cases the
// stable, incubating and experimental allocators must all pass) against gpu-dra's Rust
// allocator (crates/dra-allocator), through the allocate_json example binary named by
// $ALLOCATE_JSON.
//
// The table is internal to its module, so e2e/upstream-tables.sh copies the pinned module
// and places this file inside it, at structured/internal/gpudra; nothing upstream is changed.
// Each Allocate call sends the test's objects to the binary as JSON and decodes its answer:
// results, "unsatisfiable" (with the scheduler's reason, if any, wrapping
// ErrFailedAllocationOnNode as the Go allocator does), or a fatal error's text.
//
// What the adapter adds itself, and why: the context. A Go allocator checks ctx while it
// searches; the binary cannot see ctx, so a ctx already done is answered here with its error
// (as the Go allocators do before searching), and a ctx deadline becomes the binary's search
// timeout, whose expiry is reported as context.DeadlineExceeded, as the scheduler sees it.
// Each call also runs gpu-dra's explain on the same inputs (the allocator table's scenarios
// are its test cases too): it must render and reach the same decision, or the case fails.
// Every feature the Go allocators have is supported (the experimental one's too, derived
// attributes included), so no case is skipped.
package gpudra

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured/internal"
	"k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting"
)

func TestUpstreamAllocatorTable(t *testing.T) {
	bin := os.Getenv("ALLOCATE_JSON")
	if bin == "" {
		t.Fatal("ALLOCATE_JSON must name the allocate_json binary (cargo build --release -p dra-allocator --example allocate_json)")
	}
	supported := internal.FeaturesAll
	newAllocator := func(
		ctx context.Context,
		features internal.Features,
		state internal.AllocatedState,
		classLister internal.DeviceClassLister,
		slices []*resourceapi.ResourceSlice,
		celCache *cel.Cache,
	) (internal.Allocator, error) {
		classes, err := classLister.List()
		if err != nil {
			return nil, err
		}
		return &rustAllocator{bin: bin, features: features, state: state, classes: classes, slices: slices}, nil
	}
	// Both tables, as the incubating and experimental implementations run them.
	allocatortesting.TestAllocator(t, supported, newAllocator)
	allocatortesting.TestLexicographicalAllocator(t, supported, newAllocator)
}

// calls numbers the dumps of $ALLOCATE_JSON_DUMP.
var calls atomic.Int64

type rustAllocator struct {
	// channel and invocations are the binary's last answer's: which Go implementation it
	// reproduces (the table expects some search counts per implementation) and how often
	// its search stepped.
	channel     internal.AllocatorChannel
	invocations int64
	bin         string
	features    internal.Features
	state       internal.AllocatedState
	classes     []*resourceapi.DeviceClass
	slices      []*resourceapi.ResourceSlice
}

func (a *rustAllocator) Channel() internal.AllocatorChannel { return a.channel }

func (a *rustAllocator) GetStats() internal.Stats {
	return internal.Stats{NumAllocateOneInvocations: a.invocations}
}

type deviceID struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
}

type shareID struct {
	deviceID
	ShareID string `json:"shareID"`
}

type consumed struct {
	deviceID
	Capacity map[string]string `json:"capacity"`
}

type allocated struct {
	Devices          []deviceID `json:"devices"`
	Shares           []shareID  `json:"shares"`
	ConsumedCapacity []consumed `json:"consumedCapacity"`
}

type request struct {
	Features       map[string]bool              `json:"features"`
	Allocated      allocated                    `json:"allocated"`
	Classes        []*resourceapi.DeviceClass   `json:"classes"`
	Slices         []*resourceapi.ResourceSlice `json:"slices"`
	Node           *v1.Node                     `json:"node"`
	Claims         []*resourceapi.ResourceClaim `json:"claims"`
	TimeoutSeconds *float64                     `json:"timeoutSeconds,omitempty"`
	Explain        bool                         `json:"explain"`
}

type answer struct {
	Results       []resourceapi.AllocationResult `json:"results"`
	Unsatisfiable bool                           `json:"unsatisfiable"`
	Reason        *string                        `json:"reason"`
	TimedOut      bool                           `json:"timedOut"`
	Error         *string                        `json:"error"`
	Channel       string                         `json:"channel"`
	Invocations   int64                          `json:"allocateOneInvocations"`
	Explanation   string                         `json:"explanation"`
	ExplainAgrees bool                           `json:"explainAgrees"`
}

func id(d internal.DeviceID) deviceID {
	return deviceID{Driver: d.Driver.String(), Pool: d.Pool.String(), Device: d.Device.String()}
}

func (a *rustAllocator) Allocate(ctx context.Context, node *v1.Node, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("allocation not started: %w", err)
	}
	req := request{
		Features: map[string]bool{
			"AdminAccess":             a.features.AdminAccess,
			"CompatibilityGroups":     a.features.CompatibilityGroups,
			"ConsumableCapacity":      a.features.ConsumableCapacity,
			"DerivedAttributes":       a.features.DerivedAttributes,
			"DeviceBindingAndStatus":  a.features.DeviceBindingAndStatus,
			"DeviceTaints":            a.features.DeviceTaints,
			"FractionalCapacityRange": a.features.FractionalCapacityRange,
			"ListTypeAttributes":      a.features.ListTypeAttributes,
			"OptionalNodeOperations":  a.features.OptionalNodeOperations,
			"PartitionableDevices":    a.features.PartitionableDevices,
			"PrioritizedList":         a.features.PrioritizedList,
		},
		Classes: a.classes,
		Slices:  exactSlices(a.slices),
		Node:    node,
		Claims:  exactClaims(claims),
		// gpu-dra explain runs on every case too: it must reach the allocator's decision.
		Explain: true,
	}
	for d := range a.state.AllocatedDevices {
		req.Allocated.Devices = append(req.Allocated.Devices, id(d))
	}
	for s := range a.state.AllocatedSharedDeviceIDs {
		req.Allocated.Shares = append(req.Allocated.Shares, shareID{
			deviceID: deviceID{Driver: s.Driver.String(), Pool: s.Pool.String(), Device: s.Device.String()},
			ShareID:  s.ShareID.String(),
		})
	}
	for d, c := range a.state.AggregatedCapacity {
		entry := consumed{deviceID: id(d), Capacity: map[string]string{}}
		for name, q := range c {
			exact := exactForm(*q)
			entry.Capacity[string(name)] = exact.String()
		}
		req.Allocated.ConsumedCapacity = append(req.Allocated.ConsumedCapacity, entry)
	}
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline).Seconds()
		if left <= 0 {
			return nil, fmt.Errorf("allocation not started: %w", context.DeadlineExceeded)
		}
		req.TimeoutSeconds = &left
	}
	input, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	cmd := exec.CommandContext(ctx, a.bin)
	cmd.Stdin = bytes.NewReader(input)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("allocate_json interrupted: %w", ctxErr)
		}
		return nil, fmt.Errorf("allocate_json: %v: %s", err, stderr.String())
	}
	if dir := os.Getenv("ALLOCATE_JSON_DUMP"); dir != "" {
		// For chasing a difference by hand: the request and the answer of each call.
		base := filepath.Join(dir, fmt.Sprintf("call-%04d", calls.Add(1)))
		_ = os.WriteFile(base+".request.json", input, 0o644)
		_ = os.WriteFile(base+".answer.json", stdout.Bytes(), 0o644)
	}
	var out answer
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, fmt.Errorf("allocate_json answered %q: %w", stdout.String(), err)
	}
	if !out.ExplainAgrees || out.Explanation == "" {
		return nil, fmt.Errorf("gpu-dra explain disagrees with the allocation on these inputs:\n%s", out.Explanation)
	}
	a.channel = internal.AllocatorChannel(out.Channel)
	a.invocations += out.Invocations
	switch {
	case out.TimedOut:
		return nil, fmt.Errorf("%s: %w", *out.Error, context.DeadlineExceeded)
	case out.Error != nil:
		return nil, errors.New(*out.Error)
	case out.Unsatisfiable && out.Reason != nil:
		return nil, fmt.Errorf("%s%w", *out.Reason, internal.ErrFailedAllocationOnNode)
	case out.Unsatisfiable:
		return nil, nil
	}
	borrowRepresentations(out.Results, claims, a.slices)
	return out.Results, nil
}

// computed is q as arithmetic leaves it: negating twice drops the text parsing cached.
func computed(q resource.Quantity) resource.Quantity {
	q.Neg()
	q.Neg()
	return q
}

// exactForm is q in a form whose text says its value. Go's text of a DecimalSI quantity past
// 999E drops the exponent (apimachinery v0.37.2: ParseQuantity("2000000000000000000000")
// prints "2"), and the table holds such quantities; they go to the binary in exponent form.
func exactForm(q resource.Quantity) resource.Quantity {
	if back, err := resource.ParseQuantity(q.String()); err == nil && back.Cmp(q) == 0 {
		return q
	}
	return *resource.NewDecimalQuantity(*q.AsDec(), resource.DecimalExponent)
}

func exactMap[K comparable](m map[K]resource.Quantity) {
	for k, q := range m {
		m[k] = exactForm(q)
	}
}

func exactPointer(q *resource.Quantity) {
	if q != nil {
		*q = exactForm(*q)
	}
}

// exactClaims copies claims with their capacity requests in exact form.
func exactClaims(claims []*resourceapi.ResourceClaim) []*resourceapi.ResourceClaim {
	out := make([]*resourceapi.ResourceClaim, len(claims))
	for i, claim := range claims {
		c := claim.DeepCopy()
		for ri := range c.Spec.Devices.Requests {
			r := &c.Spec.Devices.Requests[ri]
			if r.Exactly != nil && r.Exactly.Capacity != nil {
				exactMap(r.Exactly.Capacity.Requests)
			}
			for si := range r.FirstAvailable {
				if sub := &r.FirstAvailable[si]; sub.Capacity != nil {
					exactMap(sub.Capacity.Requests)
				}
			}
		}
		out[i] = c
	}
	return out
}

// exactSlices copies slices with their capacities, policies and counters in exact form.
func exactSlices(slices []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i, slice := range slices {
		s := slice.DeepCopy()
		for ci := range s.Spec.SharedCounters {
			for name, c := range s.Spec.SharedCounters[ci].Counters {
				c.Value = exactForm(c.Value)
				s.Spec.SharedCounters[ci].Counters[name] = c
			}
		}
		for di := range s.Spec.Devices {
			d := &s.Spec.Devices[di]
			for name, c := range d.Capacity {
				c.Value = exactForm(c.Value)
				if p := c.RequestPolicy; p != nil {
					exactPointer(p.Default)
					for vi := range p.ValidValues {
						p.ValidValues[vi] = exactForm(p.ValidValues[vi])
					}
					if r := p.ValidRange; r != nil {
						exactPointer(r.Min)
						exactPointer(r.Max)
						exactPointer(r.Step)
					}
				}
				d.Capacity[name] = c
			}
			for ci := range d.ConsumesCounters {
				for name, c := range d.ConsumesCounters[ci].Counters {
					c.Value = exactForm(c.Value)
					d.ConsumesCounters[ci].Counters[name] = c
				}
			}
		}
		out[i] = s
	}
	return out
}

// borrowRepresentations gives results the in-memory form a Go allocator gives them where JSON
// cannot carry it: a device's binding conditions are copied as the device has them (an empty
// list and none are one thing in JSON), and each consumed capacity gets the form below. The table compares results with reflect.DeepEqual, which tells apart
// equal quantities built differently (NewQuantity(2, BinarySI) and the "2" a JSON round trip
// parses), so the value the binary answered is given the form of the input a Go allocator
// copies it from, by the API's rule for consumed capacity: with a request for the capacity,
// the request itself or the policy's minimum or valid value it rounds up to; without one, the
// policy's default or the capacity's value. Any other value is one arithmetic built (a request
// rounded up to a step) and gets arithmetic's form, in the step's format. Values are never changed.
func borrowRepresentations(results []resourceapi.AllocationResult, claims []*resourceapi.ResourceClaim, resourceSlices []*resourceapi.ResourceSlice) {
	for ri := range results {
		if ri >= len(claims) {
			return
		}
		for ai := range results[ri].Devices.Results {
			result := &results[ri].Devices.Results[ai]
			requested := capacityRequests(claims[ri], result.Request)
			device := findDevice(resourceSlices, result.Driver, result.Pool, result.Device)
			var capacities map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
			if device != nil {
				capacities = device.Capacity
				// Copied from the device; nil and empty are one thing in JSON.
				if len(result.BindingConditions) == 0 && device.BindingConditions != nil {
					result.BindingConditions = slices.Clone(device.BindingConditions)
				}
				if len(result.BindingFailureConditions) == 0 && device.BindingFailureConditions != nil {
					result.BindingFailureConditions = slices.Clone(device.BindingFailureConditions)
				}
			}
			for name, q := range result.ConsumedCapacity {
				var sources []resource.Quantity
				c := capacities[name]
				if want, ok := requested[name]; ok {
					sources = append(sources, want)
					if p := c.RequestPolicy; p != nil {
						if p.ValidRange != nil && p.ValidRange.Min != nil {
							sources = append(sources, *p.ValidRange.Min)
						}
						sources = append(sources, p.ValidValues...)
					}
				} else {
					if p := c.RequestPolicy; p != nil && p.Default != nil {
						sources = append(sources, *p.Default)
					}
					sources = append(sources, c.Value)
				}
				form := computed(q)
				if p := c.RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Step != nil {
					// Rounding up to a step builds the value in the step's format.
					form.Format = p.ValidRange.Step.Format
				}
				for _, source := range sources {
					if source.Cmp(q) == 0 {
						form = source.DeepCopy()
						break
					}
				}
				result.ConsumedCapacity[name] = form
			}
		}
	}
}

// capacityRequests is what the claim's request (or subrequest, "request/sub") asks of each
// capacity.
func capacityRequests(claim *resourceapi.ResourceClaim, name string) map[resourceapi.QualifiedName]resource.Quantity {
	main, sub, _ := strings.Cut(name, "/")
	for _, r := range claim.Spec.Devices.Requests {
		if r.Name != main {
			continue
		}
		if sub == "" && r.Exactly != nil && r.Exactly.Capacity != nil {
			return r.Exactly.Capacity.Requests
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub && s.Capacity != nil {
				return s.Capacity.Requests
			}
		}
	}
	return nil
}

func findDevice(resourceSlices []*resourceapi.ResourceSlice, driver, pool, device string) *resourceapi.Device {
	for _, slice := range resourceSlices {
		if slice.Spec.Driver != driver || slice.Spec.Pool.Name != pool {
			continue
		}
		for i := range slice.Spec.Devices {
			if slice.Spec.Devices[i].Name == device {
				return &slice.Spec.Devices[i]
			}
		}
	}
	return nil
}
