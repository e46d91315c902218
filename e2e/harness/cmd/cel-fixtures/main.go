// cel-fixtures extracts the CEL expressions of the pinned modules' own tests (Kubernetes' DRA
// CEL compiler, its CEL libraries, resource validation, and the cel-go extension libraries the
// Kubernetes environment includes) into e2e/cel-fixtures/kubernetes-expressions.jsonl, so the
// differential tests replay upstream's cases instead of a hand-kept copy.
//
// It reads each test file with go/parser and takes every string literal (or concatenation of
// literals) that is the value of a field named expr, expression or exprs in a composite literal,
// in file order, without duplicates. Output: one JSON line per expression,
//
//	{"source": "<module>@<version>:<file>", "expression": "..."}
//
// Usage (from e2e/harness): go run ./cmd/cel-fixtures > ../cel-fixtures/kubernetes-expressions.jsonl
package main

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The test files read, per module.
var sources = []struct {
	module string
	files  []string
}{
	{"k8s.io/dynamic-resource-allocation", []string{"cel/compile_test.go"}},
	{"k8s.io/apiserver", []string{
		"pkg/cel/library/cidr_test.go",
		"pkg/cel/library/cost_test.go",
		"pkg/cel/library/format_test.go",
		"pkg/cel/library/ip_test.go",
		"pkg/cel/library/quantity_test.go",
		"pkg/cel/library/semver_test.go",
	}},
	{"k8s.io/kubernetes", []string{
		"pkg/apis/resource/validation/validation_deviceclass_test.go",
		"pkg/apis/resource/validation/validation_resourceclaim_test.go",
	}},
	{"github.com/google/cel-go", []string{
		"ext/lists_test.go",
		"ext/regex_test.go",
		"ext/sets_test.go",
		"ext/strings_test.go",
	}},
}

var fieldNames = map[string]bool{"expr": true, "expression": true, "exprs": true}

type fixture struct {
	Source     string `json:"source"`
	Expression string `json:"expression"`
}

func moduleDir(module string) (dir, version string, err error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", module).Output()
	if err != nil {
		return "", "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) != 2 || fields[0] == "" {
		return "", "", fmt.Errorf("go list -m %s: no module directory (run go mod download)", module)
	}
	return fields[0], fields[1], nil
}

// literal returns the value of a string literal or a + concatenation of them.
func literal(e ast.Expr) (string, bool) {
	switch v := e.(type) {
	case *ast.BasicLit:
		if v.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(v.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if v.Op != token.ADD {
			return "", false
		}
		l, ok1 := literal(v.X)
		r, ok2 := literal(v.Y)
		return l + r, ok1 && ok2
	case *ast.ParenExpr:
		return literal(v.X)
	}
	return "", false
}

func extract(path string) ([]string, error) {
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	var found []string
	ast.Inspect(file, func(n ast.Node) bool {
		kv, ok := n.(*ast.KeyValueExpr)
		if !ok {
			return true
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok || !fieldNames[strings.ToLower(key.Name)] {
			return true
		}
		if s, ok := literal(kv.Value); ok {
			found = append(found, s)
			return true
		}
		// exprs: []string{...}
		if list, ok := kv.Value.(*ast.CompositeLit); ok {
			for _, elt := range list.Elts {
				if s, ok := literal(elt); ok {
					found = append(found, s)
				}
			}
		}
		return true
	})
	return found, nil
}

func run() error {
	seen := map[string]bool{}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	for _, src := range sources {
		dir, version, err := moduleDir(src.module)
		if err != nil {
			return err
		}
		short := src.module[strings.LastIndex(src.module, "/")+1:]
		for _, rel := range src.files {
			exprs, err := extract(filepath.Join(dir, rel))
			if err != nil {
				return fmt.Errorf("%s@%s %s: %w", src.module, version, rel, err)
			}
			if len(exprs) == 0 {
				return fmt.Errorf("%s@%s %s: no expressions found (did the test's layout change?)", src.module, version, rel)
			}
			for _, e := range exprs {
				if strings.TrimSpace(e) == "" || seen[e] {
					continue
				}
				seen[e] = true
				if err := enc.Encode(fixture{Source: fmt.Sprintf("%s@%s:%s", short, version, filepath.Base(rel)), Expression: e}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cel-fixtures:", err)
		os.Exit(1)
	}
}
