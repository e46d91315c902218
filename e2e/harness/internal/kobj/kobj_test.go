package kobj

import (
	"fmt"
	"strings"
	"testing"
)

type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Pad string `json:"pad,omitempty"`
}

// A JSON array of exactly 4096 bytes with no trailing newline once read as empty.
func TestReadsJSONOfEveryLengthAroundTheDecoderBuffer(t *testing.T) {
	for size := 4000; size <= 4200; size++ {
		head := `[{"apiVersion":"v1","kind":"Thing","metadata":{"name":"a"},"pad":"`
		tail := `"}]`
		pad := size - len(head) - len(tail)
		input := head + strings.Repeat("x", pad) + tail
		objs, err := Read[object](strings.NewReader(input), "v1", "Thing")
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		if len(objs) != 1 || objs[0].Metadata.Name != "a" {
			t.Fatalf("%d bytes: got %d objects, want 1", size, len(objs))
		}
	}
}

func TestReadsMultiDocumentYAML(t *testing.T) {
	input := "apiVersion: v1\nkind: Thing\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Thing\nmetadata: {name: b}"
	objs, err := Read[object](strings.NewReader(input), "v1", "Thing")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(len(objs)); got != "2" {
		t.Fatalf("got %s objects, want 2", got)
	}
}
