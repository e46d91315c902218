// karpenter-gpu: Karpenter (sigs.k8s.io/karpenter, its kwok cloud provider) with instance types
// that carry gpu-dra's ResourceSlice templates, for e2e/karpenter.sh.
//
// Instance types come from INSTANCE_TYPES_FILE_PATH as in Karpenter's kwok provider; each type
// named NAME whose file GPU_DRA_TEMPLATES_DIR/NAME.json exists gets that file as its
// DynamicResources: the output of `gpu-dra templates --form karpenter -o json` for the model
// (resourceSliceTemplates and attributeBindings). The file is read strictly: an unknown field
// is an error, so a template Karpenter would not see is not silently dropped.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"unique"

	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kwok "sigs.k8s.io/karpenter/kwok/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"
)

// What `gpu-dra templates --form karpenter` writes (src/slices/template.rs).
type dynamicResources struct {
	ResourceSliceTemplates []sliceTemplate    `json:"resourceSliceTemplates"`
	AttributeBindings      []attributeBinding `json:"attributeBindings"`
}

type sliceTemplate struct {
	Driver         string                  `json:"driver"`
	Pool           string                  `json:"pool"`
	Devices        []resourcev1.Device     `json:"devices,omitempty"`
	SharedCounters []resourcev1.CounterSet `json:"sharedCounters,omitempty"`
}

type attributeBinding struct {
	Attribute string     `json:"attribute"`
	Devices   []deviceID `json:"devices"`
}

type deviceID struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
}

func readTemplates(path string) (cloudprovider.DynamicResources, error) {
	var out cloudprovider.DynamicResources
	raw, err := os.ReadFile(path)
	if err != nil {
		return out, err
	}
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.DisallowUnknownFields()
	var in dynamicResources
	if err := decoder.Decode(&in); err != nil {
		return out, fmt.Errorf("%s: %w", path, err)
	}
	if len(in.ResourceSliceTemplates) == 0 {
		return out, fmt.Errorf("%s: no resourceSliceTemplates", path)
	}
	for _, t := range in.ResourceSliceTemplates {
		template := &cloudprovider.ResourceSliceTemplate{
			Driver:         unique.Make(t.Driver),
			Pool:           cloudprovider.ResourcePool{Name: unique.Make(t.Pool)},
			SharedCounters: t.SharedCounters,
		}
		for _, d := range t.Devices {
			template.Devices = append(template.Devices, cloudprovider.Device{
				Name:                     unique.Make(d.Name),
				Attributes:               d.Attributes,
				Capacity:                 d.Capacity,
				AllowMultipleAllocations: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations,
				ConsumesCounters:         d.ConsumesCounters,
			})
		}
		out.ResourceSliceTemplates = append(out.ResourceSliceTemplates, template)
	}
	for _, b := range in.AttributeBindings {
		binding := &cloudprovider.AttributeBinding{Attribute: resourcev1.QualifiedName(b.Attribute)}
		for _, d := range b.Devices {
			binding.Devices = append(binding.Devices, cloudprovider.DeviceID{
				Driver: unique.Make(d.Driver), Pool: unique.Make(d.Pool), Device: unique.Make(d.Device),
			})
		}
		out.AttributeBindings = append(out.AttributeBindings, binding)
	}
	return out, nil
}

func main() {
	ctx, op := operator.NewOperator()
	instanceTypes, err := kwok.ConstructInstanceTypes(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "failed constructing instance types")
		os.Exit(1)
	}
	dir := os.Getenv("GPU_DRA_TEMPLATES_DIR")
	for _, it := range instanceTypes {
		if dir == "" {
			break
		}
		path := filepath.Join(dir, it.Name+".json")
		resources, err := readTemplates(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			log.FromContext(ctx).Error(err, "reading gpu-dra templates", "instanceType", it.Name)
			os.Exit(1)
		}
		it.DynamicResources = resources
		devices := 0
		for _, t := range resources.ResourceSliceTemplates {
			devices += len(t.Devices)
		}
		log.FromContext(ctx).Info("gpu-dra templates", "instanceType", it.Name,
			"slices", len(resources.ResourceSliceTemplates), "devices", devices,
			"attributeBindings", len(resources.AttributeBindings))
	}

	overlayUndecoratedCloudProvider := kwok.NewCloudProvider(ctx, op.GetClient(), instanceTypes)
	cloudProvider := overlay.Decorate(overlayUndecoratedCloudProvider, op.GetClient(), op.InstanceTypeStore)
	clusterState := state.NewCluster(op.Clock, op.GetClient(), cloudProvider)
	op.
		WithControllers(ctx, controllers.NewControllers(
			ctx,
			op.Manager,
			op.Clock,
			op.GetClient(),
			op.EventRecorder,
			cloudProvider,
			overlayUndecoratedCloudProvider,
			clusterState,
			op.InstanceTypeStore,
		)...).Start(ctx)
}
