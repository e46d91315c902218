// Package draconfig derives the DRA library options from Kubernetes feature gates exactly as
// kube-scheduler does, so the oracles answer like the scheduler of the pinned release.
//
// Importing k8s.io/kubernetes/pkg/features registers every gate with its versioned default,
// so with no --feature-gates the oracles use the 1.37 defaults (partitionable devices,
// consumable capacity, device taints, admin access, prioritized list, binding conditions on;
// alpha gates off).
package draconfig

import (
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/features"
)

// SetFeatureGates applies a kube-scheduler style --feature-gates value ("A=true,B=false").
func SetFeatureGates(spec string) error {
	if spec == "" {
		return nil
	}
	return utilfeature.DefaultMutableFeatureGate.Set(spec)
}

// CELFeatures mirrors the cel.NewCache call in the scheduler's DynamicResources plugin.
func CELFeatures() cel.Features {
	g := utilfeature.DefaultFeatureGate
	return cel.Features{
		EnableConsumableCapacity: g.Enabled(features.DRAConsumableCapacity),
		EnableListTypeAttributes: g.Enabled(features.DRAListTypeAttributes),
	}
}

// AllocatorFeatures mirrors dynamicresources.AllocatorFeatures (scheduler plugin), without
// importing the scheduler framework into the oracles.
func AllocatorFeatures() structured.Features {
	g := utilfeature.DefaultFeatureGate
	return structured.Features{
		AdminAccess:             g.Enabled(features.DRAAdminAccess),
		PrioritizedList:         g.Enabled(features.DRAPrioritizedList),
		PartitionableDevices:    g.Enabled(features.DRAPartitionableDevices),
		DeviceTaints:            g.Enabled(features.DRADeviceTaints),
		DeviceBindingAndStatus:  g.Enabled(features.DRADeviceBindingConditions) && g.Enabled(features.DRAResourceClaimDeviceStatus),
		ConsumableCapacity:      g.Enabled(features.DRAConsumableCapacity),
		FractionalCapacityRange: g.Enabled(features.DRAFractionalCapacityRange),
		ListTypeAttributes:      g.Enabled(features.DRAListTypeAttributes),
		OptionalNodeOperations:  g.Enabled(features.DRAOptionalNodeOperations),
		DerivedAttributes:       g.Enabled(features.DRADerivedAttributes),
		CompatibilityGroups:     g.Enabled(features.DRADeviceCompatibilityGroups),
	}
}

// NewCELCache returns the scheduler's compiled-selector cache type with the gate-derived
// features. The scheduler keeps 10 entries; callers that evaluate many distinct expressions
// pass a larger size (results are identical, only recompilation differs).
func NewCELCache(size int) *cel.Cache {
	return cel.NewCache(size, CELFeatures())
}
