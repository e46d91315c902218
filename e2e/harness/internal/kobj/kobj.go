// Package kobj reads Kubernetes objects of one kind from the file formats the oracles accept:
// a single YAML or JSON object, multi-document YAML, a `kind: List` (or `<Kind>List`)
// with `items`, or a plain JSON array of objects — in any mix.
package kobj

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
)

// ReadFile reads all objects of kind `kind` (e.g. "ResourceSlice") in apiVersion `apiVersion`
// from path. Objects without kind/apiVersion are accepted as that kind; any other kind or
// version is an error, as are unknown fields (typos in hand-written test inputs must be loud).
func ReadFile[T any](path, apiVersion, kind string) ([]*T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	objs, err := Read[T](f, apiVersion, kind)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

// Read is ReadFile on a stream.
func Read[T any](r io.Reader, apiVersion, kind string) ([]*T, error) {
	// apimachinery's decoder reads a JSON input of exactly 4096 bytes (its stream's buffer)
	// with no trailing newline as empty: end every input with one.
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(append(data, '\n')), 4096)
	var out []*T
	for doc := 1; ; doc++ {
		var v any
		if err := dec.Decode(&v); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		objs, err := collect[T](v, apiVersion, kind)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		out = append(out, objs...)
	}
}

func collect[T any](v any, apiVersion, kind string) ([]*T, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil // empty YAML document
	case []any:
		var out []*T
		for i, item := range v {
			objs, err := collect[T](item, apiVersion, kind)
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			out = append(out, objs...)
		}
		return out, nil
	case map[string]any:
		k, _ := v["kind"].(string)
		if k == "List" || (k != "" && strings.HasSuffix(k, "List")) {
			items, _ := v["items"].([]any)
			return collect[T](items, apiVersion, kind)
		}
		if k != "" && k != kind {
			return nil, fmt.Errorf("expected kind %s, got %s", kind, k)
		}
		if av, _ := v["apiVersion"].(string); av != "" && av != apiVersion {
			return nil, fmt.Errorf("expected apiVersion %s, got %s", apiVersion, av)
		}
		data, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		obj := new(T)
		strictErrs, err := sigsjson.UnmarshalStrict(data, obj)
		if err != nil {
			return nil, err
		}
		if len(strictErrs) > 0 {
			return nil, fmt.Errorf("%s: %w", kind, errors.Join(strictErrs...))
		}
		return []*T{obj}, nil
	default:
		return nil, fmt.Errorf("expected an object or a list of objects, got %T", v)
	}
}
