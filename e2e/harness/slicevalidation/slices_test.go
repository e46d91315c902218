// Package slicevalidation checks the ResourceSlices gpu-dra publishes against kube-apiserver's
// own create path (k8s.io/kubernetes v1.37: decoding with defaults, the resourceslice strategy,
// its handwritten and declarative validation), for every simulated GPU model and the options
// that change what is published: MIG offered dynamically, statically or not at all, consumable
// shares, VFIO passthrough, list-type attributes. The e2e tests publish to a real API server
// too, for a few configurations; this covers the rest without one.
//
// GPU_DRA names the gpu-dra binary (e2e/run-tests passes the one `cargo test` built). The API
// server runs with the e2e cluster's feature gates (e2e/versions.env K8S_FEATURE_GATES), which
// enable what these options publish; a field the strategy would drop counts as a failure, since
// the driver refuses to run where the API server drops what it publishes.
package slicevalidation

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	"k8s.io/kubernetes/pkg/registry/resource/resourceslice"
)

// Every model of the simulator's catalog (`gpu-dra slices --help`), two of the MIG-capable
// ones twice so that placements of several GPUs share one slice.
const allModels = "sim:2xH100-SXM5-80GB,1xA100-SXM4-40GB,1xA100-SXM4-80GB,1xA30-24GB,1xA10," +
	"1xH100-PCIE-80GB,1xH100-NVL-94GB,1xH20-96GB,1xGH200-96GB,1xH200-SXM5-141GB," +
	"2xB200-SXM6-180GB,1xGB200-186GB,1xGB10,1xRTX-PRO-6000-BSE-96GB,1xL40S,1xL4,1xT4"

func clusterGates(t *testing.T) string {
	t.Helper()
	file, err := os.Open(filepath.Join("..", "..", "versions.env"))
	if err != nil {
		t.Fatalf("reading the e2e cluster's gates: %v", err)
	}
	defer file.Close()
	lines := bufio.NewScanner(file)
	for lines.Scan() {
		if gates, ok := strings.CutPrefix(lines.Text(), "K8S_FEATURE_GATES="); ok {
			return gates
		}
	}
	t.Fatal("e2e/versions.env has no K8S_FEATURE_GATES")
	return ""
}

func gpuDRA(t *testing.T, args ...string) []byte {
	t.Helper()
	bin := os.Getenv("GPU_DRA")
	if bin == "" {
		t.Fatal("GPU_DRA must name the gpu-dra binary (cargo build; e2e/run-tests passes target/debug/gpu-dra)")
	}
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gpu-dra %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// A node whose second H100 and A100 hold MIG devices someone else made, so that `--mig static`
// (and `auto`, for those GPUs) publishes existing MIG devices.
func staticMIGState(t *testing.T) string {
	state := filepath.Join(t.TempDir(), "sim.json")
	sim := func(args ...string) {
		gpuDRA(t, append([]string{"sim", "--gpus", allModels, "--node-name", "n1", "--sim-state", state}, args...)...)
	}
	// GPU 1 is the second H100, GPU 2 the A100 (40GB): MIG mode on, then instances.
	for _, gpu := range []string{"1", "2"} {
		sim("mig-mode", "--gpu", gpu, "--enabled", "true")
		sim("reset", "--gpu", gpu)
	}
	sim("create", "--gpu", "1", "--profile", "3g.40gb")
	sim("create", "--gpu", "1", "--profile", "1g.10gb")
	sim("create", "--gpu", "2", "--profile", "2g.10gb")
	return state
}

func TestPublishedSlicesPassAPIServerValidation(t *testing.T) {
	if err := utilfeature.DefaultMutableFeatureGate.Set(clusterGates(t)); err != nil {
		t.Fatalf("setting the cluster's gates: %v", err)
	}
	state := staticMIGState(t)
	type option struct{ name, args string }
	var cases []option
	for _, mig := range []string{"auto", "dynamic", "static", "off"} {
		for _, shares := range []string{"off", "memory", "unlimited", "4"} {
			cases = append(cases, option{
				name: "mig=" + mig + ",shares=" + shares,
				args: "--mig " + mig + " --consumable-shares " + shares,
			})
		}
	}
	cases = append(cases,
		option{"passthrough", "--passthrough"},
		option{"passthrough,mig=dynamic", "--passthrough --mig dynamic"},
		option{"list-type attributes", "--feature-gates DRAListTypeAttributes=true"},
		option{"list-type attributes,shares=memory", "--feature-gates DRAListTypeAttributes=true --consumable-shares memory"},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"slices", "--gpus", allModels, "--node-name", "n1", "--sim-state", state, "-o", "json"}, strings.Fields(c.args)...)
			var list struct {
				Items []json.RawMessage `json:"items"`
			}
			if err := json.Unmarshal(gpuDRA(t, args...), &list); err != nil {
				t.Fatalf("gpu-dra slices printed no List: %v", err)
			}
			if len(list.Items) == 0 {
				t.Fatal("gpu-dra slices printed no ResourceSlice")
			}
			devices := 0
			for i, item := range list.Items {
				devices += validate(t, i, item)
			}
			t.Logf("%d slices, %d devices accepted", len(list.Items), devices)
		})
	}
}

// validate creates one slice as kube-apiserver would and returns its device count.
func validate(t *testing.T, index int, data []byte) int {
	t.Helper()
	slice, dropped, errs, err := create(data)
	if err != nil {
		t.Fatalf("slice %d: %v", index, err)
	}
	if dropped {
		t.Errorf("slice %d (%s): the API server drops fields of it with the cluster's gates", index, slice.Name)
	}
	if len(errs) > 0 {
		t.Errorf("slice %d (%s): the API server refuses it: %v", index, slice.Name, errs.ToAggregate())
	}
	return len(slice.Spec.Devices)
}

// create runs kube-apiserver's create path on a slice: whether the strategy dropped any of its
// spec, and what validation refuses.
func create(data []byte) (*resource.ResourceSlice, bool, field.ErrorList, error) {
	decoded, _, err := legacyscheme.Codecs.UniversalDecoder(resource.SchemeGroupVersion).Decode(data, nil, nil)
	if err != nil {
		return nil, false, nil, fmt.Errorf("the API server cannot decode it: %w", err)
	}
	slice := decoded.(*resource.ResourceSlice)
	if slice.Name == "" && slice.GenerateName != "" {
		slice.Name = slice.GenerateName + "x1234"
	}
	ctx := genericapirequest.WithRequestInfo(context.Background(), &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: "create", APIGroup: resourcev1.GroupName, APIVersion: "v1",
		Resource: "resourceslices", Name: slice.Name,
	})
	before := slice.Spec.DeepCopy()
	resourceslice.Strategy.PrepareForCreate(ctx, slice)
	dropped := !apiequality.Semantic.DeepEqual(*before, slice.Spec)
	return slice, dropped, rest.ValidateCreate(ctx, slice, resourceslice.Strategy), nil
}

// The check is not vacuous: a slice with a device name the API server refuses is refused.
func TestABadSliceIsRefused(t *testing.T) {
	data := gpuDRA(t, "slices", "--gpus", "sim:1xT4", "--node-name", "n1", "-o", "json")
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(data, &list); err != nil || len(list.Items) != 1 {
		t.Fatalf("gpu-dra slices: %v, %d items", err, len(list.Items))
	}
	list.Items[0]["spec"].(map[string]any)["devices"].([]any)[0].(map[string]any)["name"] = "GPU_0"
	bad, err := json.Marshal(list.Items[0])
	if err != nil {
		t.Fatal(err)
	}
	_, _, errs, err := create(bad)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) == 0 || errs[0].Field != "spec.devices[0].name" {
		t.Fatalf("a device named GPU_0 was not refused by its name: %v", errs)
	}
}
