// alloc-oracle runs the structured-parameters allocator kube-scheduler uses
// (k8s.io/dynamic-resource-allocation/structured, features derived from the feature gates
// exactly as the scheduler's DynamicResources plugin does) for one node, so the Rust driver's
// ResourceSlices and the project's claims can be checked against the real allocation.
//
// Usage:
//
//	alloc-oracle --slices FILE --classes FILE --claims FILE [--allocated FILE] [--pods 2,1,...]
//	             [--node NAME] [--node-labels k=v,...] [--node-declared-features F,...]
//	             [--feature-gates A=true,...] [--timeout 60s] [--filter-timeout 10s]
//
// Input files hold resource.k8s.io/v1 objects (ResourceSlice, DeviceClass, ResourceClaim) as
// one YAML/JSON object, multi-document YAML, a `kind: List` with `items`, or a JSON array.
// Unknown fields are rejected; the apiserver's defaulting is applied, validation is not (inputs
// must be objects the apiserver would accept).
// Slices of all nodes may be given; the allocator only uses those available on --node
// (default "sim-node-1"; the Node object gets the given labels plus kubernetes.io/hostname).
//
// Claims in --claims are allocated one at a time, in file order; each successful allocation
// marks its devices (or, with consumable capacity, its shares and consumed capacity) as in use
// for the claims after it, as the scheduler's allocated-devices tracker would. Claims in
// --allocated must carry status.allocation; their devices start out in use. A claim in --claims
// that is already allocated is reported as an error (pass it with --allocated instead).
//
// --pods groups the claims into pods, in file order (sizes summing to the number of claims):
// each pod's claims are allocated together in one Allocate call, as the scheduler does for a
// pod with several claims; each claim of a pod that does not fit gets the pod's outcome.
//
// Output: one JSON document on stdout:
//
//	{
//	  "node": "sim-node-1",
//	  "claims": [
//	    {"namespace": "default", "name": "a", "allocation": <resource.k8s.io/v1 AllocationResult>},
//	    {"namespace": "default", "name": "b", "unsatisfiable": true, "reason": "..."},
//	    {"namespace": "default", "name": "c", "error": "..."}
//	  ]
//	}
//
// Exactly one of allocation / unsatisfiable / error is set per claim:
//   - unsatisfiable: the allocator found no allocation on this node (nil result, or an error
//     wrapping structured.ErrFailedAllocationOnNode, whose text is the reason) — the scheduler
//     would mark the node unschedulable for the pod;
//   - error: a fatal allocator error (CEL compile/runtime error, missing class, ...) — the
//     scheduler would abort the scheduling attempt with this error. A pod whose allocation
//     searched longer than --filter-timeout gets the scheduler's timeout error and
//     "timedOut": true.
//
// Exit status: 0 when it ran (whatever the per-claim outcomes), 1 on bad input, 2 on bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	resourcev1defaults "k8s.io/kubernetes/pkg/apis/resource/v1"
	"k8s.io/utils/ptr"

	"gpu-dra/e2e/harness/internal/draconfig"
	"gpu-dra/e2e/harness/internal/kobj"
)

const apiVersion = "resource.k8s.io/v1"

type claimResult struct {
	Namespace     string                        `json:"namespace,omitempty"`
	Name          string                        `json:"name"`
	Allocation    *resourceapi.AllocationResult `json:"allocation,omitempty"`
	Unsatisfiable bool                          `json:"unsatisfiable,omitempty"`
	Reason        string                        `json:"reason,omitempty"`
	Error         string                        `json:"error,omitempty"`
	TimedOut      bool                          `json:"timedOut,omitempty"`
}

type report struct {
	Node   string        `json:"node"`
	Claims []claimResult `json:"claims"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("alloc-oracle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	slicesFile := fs.String("slices", "", "ResourceSlices (required)")
	classesFile := fs.String("classes", "", "DeviceClasses (required)")
	claimsFile := fs.String("claims", "", "ResourceClaims to allocate, in order (required)")
	allocatedFile := fs.String("allocated", "", "already allocated ResourceClaims (optional)")
	nodeName := fs.String("node", "sim-node-1", "node to allocate on")
	nodeLabels := fs.String("node-labels", "", "extra node labels, k=v,...")
	declared := fs.String("node-declared-features", "", "node status.declaredFeatures, comma-separated (e.g. DRAOptionalNodeOperations)")
	gates := fs.String("feature-gates", "", "feature gates, kube-scheduler syntax (default: 1.37 defaults)")
	timeout := fs.Duration("timeout", time.Minute, "overall allocation timeout")
	filterTimeout := fs.Duration("filter-timeout", 10*time.Second, "per-pod allocation timeout, as kube-scheduler's DynamicResources filterTimeout (0: none)")
	pods := fs.String("pods", "", "claims per pod, in file order (e.g. 2,1,3); default: one claim per pod")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlags.Lookup("v").Value, "v", "allocator log verbosity (klog, to stderr; 5-7 explain decisions)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(stderr, "alloc-oracle: "+format+"\n", args...)
		return code
	}
	if *slicesFile == "" || *classesFile == "" || *claimsFile == "" {
		return fail(2, "--slices, --classes and --claims are required")
	}
	if err := draconfig.SetFeatureGates(*gates); err != nil {
		return fail(2, "--feature-gates: %v", err)
	}
	labels := map[string]string{v1.LabelHostname: *nodeName}
	if *nodeLabels != "" {
		for _, kv := range strings.Split(*nodeLabels, ",") {
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				return fail(2, "--node-labels: %q is not k=v", kv)
			}
			labels[k] = val
		}
	}

	slices, err := kobj.ReadFile[resourceapi.ResourceSlice](*slicesFile, apiVersion, "ResourceSlice")
	if err != nil {
		return fail(1, "%v", err)
	}
	classes, err := kobj.ReadFile[resourceapi.DeviceClass](*classesFile, apiVersion, "DeviceClass")
	if err != nil {
		return fail(1, "%v", err)
	}
	claims, err := kobj.ReadFile[resourceapi.ResourceClaim](*claimsFile, apiVersion, "ResourceClaim")
	if err != nil {
		return fail(1, "%v", err)
	}
	var allocated []*resourceapi.ResourceClaim
	if *allocatedFile != "" {
		if allocated, err = kobj.ReadFile[resourceapi.ResourceClaim](*allocatedFile, apiVersion, "ResourceClaim"); err != nil {
			return fail(1, "%v", err)
		}
	}

	// The allocator expects objects as stored by the apiserver: apply its defaulting
	// (e.g. allocationMode ExactCount, count 1, taint timeAdded).
	for _, s := range slices {
		resourcev1defaults.SetObjectDefaults_ResourceSlice(s)
	}
	for _, c := range append(claims, allocated...) {
		resourcev1defaults.SetObjectDefaults_ResourceClaim(c)
	}

	features := draconfig.AllocatorFeatures()
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range allocated {
		if c.Status.Allocation == nil {
			return fail(1, "%s: claim %s/%s in --allocated has no status.allocation", *allocatedFile, c.Namespace, c.Name)
		}
		markInUse(&state, c.Status.Allocation, features.ConsumableCapacity)
	}

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: *nodeName, Labels: labels}}
	if *declared != "" {
		// What the node's kubelet declares (nodedeclaredfeatures): the experimental allocator
		// only hands out devices of slices with skipNodeOperations on nodes declaring
		// DRAOptionalNodeOperations.
		node.Status.DeclaredFeatures = strings.Split(*declared, ",")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx = klog.NewContext(ctx, klog.Background().WithValues("node", *nodeName))
	// The scheduler's cache keeps 10 programs; size only affects recompilation, not results.
	celCache := draconfig.NewCELCache(64)
	lister := classLister(classes)

	sizes, err := podSizes(*pods, len(claims))
	if err != nil {
		return fail(2, "--pods: %v", err)
	}
	rep := report{Node: *nodeName, Claims: []claimResult{}}
	next := 0
	for _, size := range sizes {
		pod := claims[next : next+size]
		next += size
		results := make([]claimResult, len(pod))
		already := false
		for i, claim := range pod {
			results[i] = claimResult{Namespace: claim.Namespace, Name: claim.Name}
			if claim.Status.Allocation != nil {
				already = true
			}
		}
		if already {
			for i := range results {
				results[i].Error = "claim is already allocated (status.allocation set); pass it with --allocated"
			}
			rep.Claims = append(rep.Claims, results...)
			continue
		}
		// A fresh allocator per pod, as each scheduling cycle builds one from the current
		// allocated state.
		alloc, err := structured.NewAllocator(ctx, features, state, lister, slices, celCache)
		if err != nil {
			return fail(1, "create allocator: %v", err)
		}
		podCtx, podCancel := ctx, context.CancelFunc(func() {})
		if *filterTimeout > 0 {
			podCtx, podCancel = context.WithTimeout(ctx, *filterTimeout)
		}
		allocations, err := alloc.Allocate(podCtx, node, pod)
		podCancel()
		for i := range results {
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				// The scheduler's message: a transient error, the pod is retried with backoff.
				results[i].Error = fmt.Sprintf("node %s: timed out trying to allocate devices", *nodeName)
				results[i].TimedOut = true
			case errors.Is(err, structured.ErrFailedAllocationOnNode):
				results[i].Unsatisfiable, results[i].Reason = true, err.Error()
			case err != nil:
				results[i].Error = err.Error()
			case len(allocations) == 0:
				results[i].Unsatisfiable = true
			default:
				results[i].Allocation = &allocations[i]
				markInUse(&state, results[i].Allocation, features.ConsumableCapacity)
			}
		}
		rep.Claims = append(rep.Claims, results...)
	}

	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fail(1, "write output: %v", err)
	}
	return 0
}

// podSizes parses --pods; empty means one claim per pod.
func podSizes(text string, claims int) ([]int, error) {
	if text == "" {
		sizes := make([]int, claims)
		for i := range sizes {
			sizes[i] = 1
		}
		return sizes, nil
	}
	var sizes []int
	total := 0
	for _, part := range strings.Split(text, ",") {
		var n int
		if _, err := fmt.Sscanf(part, "%d", &n); err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number of claims", part)
		}
		sizes = append(sizes, n)
		total += n
	}
	if total != claims {
		return nil, fmt.Errorf("the pods hold %d claims, --claims has %d", total, claims)
	}
	return sizes, nil
}

// markInUse mirrors foreachAllocatedDevice in the scheduler's DynamicResources plugin:
// admin-access results do not consume the device; with consumable capacity, results with a
// share ID consume a share (and capacity) instead of the whole device.
func markInUse(state *structured.AllocatedState, alloc *resourceapi.AllocationResult, consumableCapacity bool) {
	for _, r := range alloc.Devices.Results {
		if ptr.Deref(r.AdminAccess, false) {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if consumableCapacity && r.ShareID != nil {
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
			continue
		}
		state.AllocatedDevices.Insert(id)
	}
}

// classLister serves DeviceClasses from memory (the scheduler uses an informer lister).
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
