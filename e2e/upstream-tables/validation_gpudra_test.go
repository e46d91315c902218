// Kubernetes' create-time validation tables for ResourceClaims, ResourceClaimTemplates,
// DeviceClasses, DeviceTaintRules and ResourceSlices (k8s.io/kubernetes
// pkg/apis/resource/validation: TestValidateClaim, TestValidateClaimTemplate, TestValidateClass,
// TestValidateDeviceTaint, TestValidateResourceSlice) run against `gpu-dra match --print-v1`,
// which refuses what the API server would refuse.
//
// e2e/upstream-tables.sh copies the package beside this file and renames its five exported
// create-time validators to upstream*; the functions below take their names, so every case of
// the tables goes through them. Each returns upstream's own errors (so the table still checks
// upstream against its expectations) plus one error naming any disagreement with gpu-dra.
//
// What gpu-dra is compared with is what the API server does with the object a user sends: the
// case's object in resource.k8s.io/v1, defaulted as the API server defaults it on decoding,
// then validated. The table validates its objects undefaulted (e.g. a request without an
// allocation mode is "Required value" there, ExactCount after defaulting), so the verdict
// compared is upstream's on the defaulted object. gpu-dra gets the v1 object undefaulted and
// defaults it itself. Agreement means: both accept, or both refuse and gpu-dra's error names a
// field upstream names (gpu-dra stops at the first error; upstream lists all).
//
// Two things a file given to `match` cannot carry are adapted, said here and counted nowhere
// else: an object without a namespace is in the caller's namespace (kubectl's and match's
// "default"; the table's "missing-namespace" case has the API server's request without one),
// and an object without a name gets a name before gpu-dra sees it, unless the case is about the
// name (generateName is the API server's to resolve).
package validation

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/component-base/featuregate"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	"k8s.io/kubernetes/pkg/registry/resource/deviceclass"
	"k8s.io/kubernetes/pkg/registry/resource/devicetaintrule"
	"k8s.io/kubernetes/pkg/registry/resource/resourceclaim"
	"k8s.io/kubernetes/pkg/registry/resource/resourceclaimtemplate"
	"k8s.io/kubernetes/pkg/registry/resource/resourceslice"
)

// The DRA gates `gpu-dra match --feature-gates` takes that are not locked in 1.37: each case
// runs with the table's values of them.
var gpuDRAGates = []string{
	"DRAConsumableCapacity", "DRADerivedAttributes", "DRADeviceBindingConditions",
	"DRADeviceCompatibilityGroups", "DRADeviceTaintRules", "DRADeviceTaints",
	"DRAFractionalCapacityRange", "DRAListTypeAttributes", "DRANodeAllocatableResources",
	"DRAOptionalNodeOperations", "DRAPartitionableDevices", "DRAPartitionableDevicesType",
	"DRAResourceClaimGranularStatusAuthorization", "DRAResourcePoolStatus",
	"DRASchedulerFilterTimeout", "DRAWorkloadResourceClaims", "GenericWorkload",
}

// GPU_DRA_VALIDATION_GATES (`A=true,...`) runs the tables with those gates on top of the
// defaults (the table's own per-case gates still win): DRADerivedAttributes=true makes the API
// server keep, and so check, requests' derivedAttributes, which it drops with the gate off.
func init() {
	if gates := os.Getenv("GPU_DRA_VALIDATION_GATES"); gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(gates); err != nil {
			panic(fmt.Sprintf("GPU_DRA_VALIDATION_GATES: %v", err))
		}
	}
}

func ValidateResourceClaim(claim *resource.ResourceClaim) field.ErrorList {
	errs := upstreamValidateResourceClaim(claim)
	strategy := resourceclaim.NewStrategy(adminNamespaces(), nil)
	return append(errs, compareWithGpuDRA(claim, &resourcev1.ResourceClaim{}, "ResourceClaim", "resourceclaims", strategy)...)
}

func ValidateResourceClaimTemplate(template *resource.ResourceClaimTemplate) field.ErrorList {
	errs := upstreamValidateResourceClaimTemplate(template)
	strategy := resourceclaimtemplate.NewStrategy(adminNamespaces())
	return append(errs, compareWithGpuDRA(template, &resourcev1.ResourceClaimTemplate{}, "ResourceClaimTemplate", "resourceclaimtemplates", strategy)...)
}

func ValidateDeviceClass(class *resource.DeviceClass) field.ErrorList {
	errs := upstreamValidateDeviceClass(class)
	return append(errs, compareWithGpuDRA(class, &resourcev1.DeviceClass{}, "DeviceClass", "deviceclasses", deviceclass.Strategy)...)
}

func ValidateDeviceTaintRule(rule *resource.DeviceTaintRule) field.ErrorList {
	errs := upstreamValidateDeviceTaintRule(rule)
	return append(errs, compareWithGpuDRA(rule, &resourcev1.DeviceTaintRule{}, "DeviceTaintRule", "devicetaintrules", devicetaintrule.Strategy)...)
}

func ValidateResourceSlice(slice *resource.ResourceSlice) field.ErrorList {
	errs := upstreamValidateResourceSlice(slice)
	return append(errs, compareWithGpuDRA(slice, &resourcev1.ResourceSlice{}, "ResourceSlice", "resourceslices", resourceslice.Strategy)...)
}

// adminNamespaces: the namespaces the table's objects are in, each labelled for admin access.
func adminNamespaces() corev1client.NamespaceInterface {
	var namespaces []runtime.Object
	for _, name := range []string{"default", "ns"} {
		namespaces = append(namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{resource.DRAAdminNamespaceLabelKey: "true"},
		}})
	}
	return fake.NewClientset(namespaces...).CoreV1().Namespaces()
}

// compareWithGpuDRA returns nothing when gpu-dra agrees with the API server about `internal`,
// else one error saying how it does not.
func compareWithGpuDRA(internal runtime.Object, v1 runtime.Object, kind string, resourceName string, strategy rest.RESTCreateStrategy) field.ErrorList {
	disagree := func(format string, args ...any) field.ErrorList {
		return field.ErrorList{field.InternalError(field.NewPath("gpu-dra"), fmt.Errorf(format, args...))}
	}
	sendable := internal.DeepCopyObject()
	jsonParameters(sendable)
	if err := legacyscheme.Scheme.Convert(sendable, v1, nil); err != nil {
		return disagree("converting to resource.k8s.io/v1: %v", err)
	}
	meta := v1.(metav1.Object)
	if meta.GetNamespace() == "" && strategy.NamespaceScoped() {
		meta.SetNamespace("default")
	}
	if meta.GetName() == "" && meta.GetGenerateName() == "" {
		meta.SetName("unnamed")
	}
	v1.GetObjectKind().SetGroupVersionKind(resourcev1.SchemeGroupVersion.WithKind(kind))

	data, err := json.Marshal(v1)
	if err != nil {
		return disagree("encoding: %v", err)
	}
	if problem := compareJSON(data, resourceName, strategy); problem != "" {
		return disagree("%s", problem)
	}
	return nil
}

// compareJSON says how gpu-dra disagrees with the API server about an object sent as `data`
// ("" when it does not). An object the API server cannot even decode must be refused by
// gpu-dra too (such errors name no field the way validation does).
func compareJSON(data []byte, resourceName string, strategy rest.RESTCreateStrategy) string {
	data = inCallersNamespace(data, strategy)
	want, err := apiServerCreate(data, resourceName, strategy)
	if err != nil {
		want = field.ErrorList{field.Invalid(nil, nil, err.Error())}
	}
	accepted, refusal, err := runGpuDRA(data)
	if err != nil {
		return err.Error()
	}
	switch {
	case len(want) == 0 && !accepted:
		return fmt.Sprintf("the API server accepts it, gpu-dra refuses it: %s", refusal)
	case len(want) > 0 && accepted:
		return fmt.Sprintf("the API server refuses it (%s), gpu-dra accepts it", want.ToAggregate())
	case len(want) > 0:
		named := refusedField(refusal)
		for _, e := range want {
			if e.Field == named || e.Field == "<nil>" {
				return ""
			}
		}
		return fmt.Sprintf("both refuse it, but gpu-dra names %q (%s) and the API server %s", named, refusal, want.ToAggregate())
	}
	return ""
}

// inCallersNamespace puts a namespaced object without a namespace in "default", as kubectl
// and `match` do (the API server takes it from the request).
func inCallersNamespace(data []byte, strategy rest.RESTCreateStrategy) []byte {
	if !strategy.NamespaceScoped() {
		return data
	}
	var obj map[string]any
	if json.Unmarshal(data, &obj) != nil {
		return data
	}
	meta, ok := obj["metadata"].(map[string]any)
	if !ok {
		return data
	}
	if ns, _ := meta["namespace"].(string); ns != "" {
		return data
	}
	meta["namespace"] = "default"
	if out, err := json.Marshal(obj); err == nil {
		return out
	}
	return data
}

// apiServerCreate is what kube-apiserver does with a create of the v1 object: decoding
// (with defaults, to the internal version), the resource's strategy (fields of disabled features dropped, status
// cleared), its validation, the generic object-meta checks and declarative validation. The
// namespace is taken to allow admin access (`match` cannot see namespaces' labels).
func apiServerCreate(data []byte, resourceName string, strategy rest.RESTCreateStrategy) (field.ErrorList, error) {
	obj, _, err := legacyscheme.Codecs.UniversalDecoder(resource.SchemeGroupVersion).Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding as the API server does: %v", err)
	}
	meta := obj.(metav1.Object)
	if meta.GetName() == "" && meta.GetGenerateName() != "" {
		meta.SetName(strategy.GenerateName(meta.GetGenerateName()))
	}
	ctx := genericapirequest.WithNamespace(context.Background(), meta.GetNamespace())
	ctx = genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: "create", APIGroup: resourcev1.GroupName, APIVersion: "v1",
		Resource: resourceName, Namespace: meta.GetNamespace(), Name: meta.GetName(),
	})
	strategy.PrepareForCreate(ctx, obj)
	return rest.ValidateCreate(ctx, obj, strategy), nil
}

// Opaque parameters that are not JSON cannot be written in a file: empty ones are left out,
// others go as a JSON string of their text (which the API server refuses too, "must be a valid
// JSON object").
func jsonParameters(obj runtime.Object) {
	fix := func(raw *runtime.RawExtension) {
		switch {
		case raw.Raw != nil && len(raw.Raw) == 0:
			raw.Raw = nil
		case len(raw.Raw) > 0 && !json.Valid(raw.Raw):
			raw.Raw, _ = json.Marshal(string(raw.Raw))
		}
	}
	var fixed []*resource.DeviceConfiguration
	switch o := obj.(type) {
	case *resource.ResourceClaim:
		for i := range o.Spec.Devices.Config {
			fixed = append(fixed, &o.Spec.Devices.Config[i].DeviceConfiguration)
		}
	case *resource.ResourceClaimTemplate:
		for i := range o.Spec.Spec.Devices.Config {
			fixed = append(fixed, &o.Spec.Spec.Devices.Config[i].DeviceConfiguration)
		}
	case *resource.DeviceClass:
		for i := range o.Spec.Config {
			fixed = append(fixed, &o.Spec.Config[i].DeviceConfiguration)
		}
	}
	for _, c := range fixed {
		if c.Opaque != nil {
			fix(&c.Opaque.Parameters)
		}
	}
}

// runGpuDRA gives the object to `gpu-dra match --print-v1` with the table's feature gates:
// accepted (exit 0) or refused (exit 2, its message).
func runGpuDRA(data []byte) (bool, string, error) {
	bin := os.Getenv("GPU_DRA")
	if bin == "" {
		return false, "", fmt.Errorf("GPU_DRA must name the gpu-dra binary")
	}
	dir, err := os.MkdirTemp("", "validation-gpudra")
	if err != nil {
		return false, "", err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "object.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		return false, "", err
	}
	var gates []string
	for _, gate := range gpuDRAGates {
		gates = append(gates, fmt.Sprintf("%s=%t", gate, utilfeature.DefaultFeatureGate.Enabled(featuregate.Feature(gate))))
	}
	cmd := exec.Command(bin, "match", "--print-v1", "--feature-gates", strings.Join(gates, ","), "-f", file)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	if os.Getenv("GPU_DRA_VALIDATION_LOG") != "" {
		fmt.Fprintf(os.Stderr, "gpu-dra on %s: %v %s\n", data, err, stderr.String())
	}
	if err == nil {
		return true, "", nil
	}
	if exit, ok := err.(*exec.ExitError); ok && exit.ExitCode() == 2 {
		return false, strings.TrimSpace(stderr.String()), nil
	}
	return false, "", fmt.Errorf("gpu-dra match: %v: %s", err, stderr.String())
}

// gpu-dra's refusal: `error: Kind ns/name (file, document N): FIELD: message`.
var refusalField = regexp.MustCompile(`\(.*, document \d+\): ([^ :]+): `)

func refusedField(refusal string) string {
	if m := refusalField.FindStringSubmatch(refusal); m != nil {
		return m[1]
	}
	return ""
}

// gpudraValidateDeviceCapacity stands in for the capacity helper in TestValidateDeviceCapacity
// (e2e/upstream-tables.sh points the test's one call at it): upstream's own errors, plus one
// naming any disagreement with gpu-dra about a ResourceSlice whose one device, allocatable more
// than once, has the scenario's capacity, with DRAConsumableCapacity on while it runs (the
// helper checks consumable capacity; without the gate the API server drops request policies)
// and the scenario's DRAFractionalCapacityRange.
func gpudraValidateDeviceCapacity(capacity resource.DeviceCapacity, fldPath *field.Path) field.ErrorList {
	errs := validateMultiAllocatableDeviceCapacity(capacity, fldPath)
	const gate = "DRAConsumableCapacity"
	was := utilfeature.DefaultFeatureGate.Enabled(gate)
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{gate: true}); err != nil {
		return append(errs, field.InternalError(field.NewPath("gpu-dra"), err))
	}
	defer func() { _ = utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{gate: was}) }()
	slice := &resource.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "capacity"},
		Spec: resource.ResourceSliceSpec{
			Driver:   "gpu.example.com",
			Pool:     resource.ResourcePool{Name: "pool", ResourceSliceCount: 1},
			NodeName: ptrTo("node"),
			Devices: []resource.Device{{
				Name:                     "device",
				AllowMultipleAllocations: ptrTo(true),
				Capacity:                 map[resource.QualifiedName]resource.DeviceCapacity{"capacity": capacity},
			}},
		},
	}
	return append(errs, compareWithGpuDRA(slice, &resourcev1.ResourceSlice{}, "ResourceSlice", "resourceslices", resourceslice.Strategy)...)
}

func ptrTo[T any](v T) *T { return &v }
