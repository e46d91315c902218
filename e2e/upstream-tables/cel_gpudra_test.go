// Kubernetes' own CEL selector test table (k8s.io/dynamic-resource-allocation/cel,
// compile_test.go's testcases: expressions on devices with the compile errors, cost estimates,
// matches and evaluation errors the scheduler and the API server must give) run against
// gpu-dra's CEL engine (crates/dra-cel), through the cel_case example binary named by
// $CEL_CASE.
//
// The table is a test variable of its package, so e2e/upstream-tables.sh cel copies the pinned module
// and places this file beside compile_test.go; nothing upstream is changed. Each case runs as
// TestCEL runs it, for every feature combination it allows, and is held to the same checks:
// the compile error (substring), the cost estimate (exactly), the match or the evaluation
// error (substring). Two things TestCEL also checks are not compared: the actual cost of an
// evaluation (the binary does not report it; our evaluator enforces the same limit), and the
// environment type (stored and new expressions compile alike in our engine, which implements
// the 1.37 library both share).
package cel

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

type gpudraCase struct {
	Expression         string             `json:"expression"`
	Driver             string             `json:"driver"`
	Device             resourceapi.Device `json:"device"`
	ListTypeAttributes bool               `json:"listTypeAttributes"`
	ConsumableCapacity bool               `json:"consumableCapacity"`
}

type gpudraAnswer struct {
	CompileError *string `json:"compileError"`
	Cost         uint64  `json:"cost"`
	Match        *bool   `json:"match"`
	MatchError   *string `json:"matchError"`
	BadInput     *string `json:"badInput"`
}

func TestUpstreamCELTable(t *testing.T) {
	bin := os.Getenv("CEL_CASE")
	if bin == "" {
		t.Fatal("CEL_CASE must name the cel_case binary (cargo build -p dra-cel --example cel_case)")
	}
	cmd := exec.Command(bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	answers := bufio.NewScanner(stdout)
	answers.Buffer(make([]byte, 1<<20), 1<<24)
	ask := func(c gpudraCase) (gpudraAnswer, error) {
		line, err := json.Marshal(c)
		if err != nil {
			return gpudraAnswer{}, err
		}
		if _, err := fmt.Fprintf(stdin, "%s\n", line); err != nil {
			return gpudraAnswer{}, err
		}
		if !answers.Scan() {
			return gpudraAnswer{}, fmt.Errorf("cel_case gave no answer: %v", answers.Err())
		}
		var a gpudraAnswer
		if err := json.Unmarshal(answers.Bytes(), &a); err != nil {
			return gpudraAnswer{}, fmt.Errorf("cel_case answered %q: %w", answers.Text(), err)
		}
		if a.BadInput != nil {
			return gpudraAnswer{}, fmt.Errorf("cel_case refused the case: %s", *a.BadInput)
		}
		return a, nil
	}

	for name, scenario := range testcases {
		t.Run(name, func(t *testing.T) {
			listTypes, consumables := []bool{true, false}, []bool{true, false}
			if scenario.features != nil {
				listTypes = []bool{scenario.features.EnableListTypeAttributes}
				consumables = []bool{scenario.features.EnableConsumableCapacity}
			}
			for _, c := range combinations(listTypes, consumables) {
				listType, consumable := c[0], c[1]
				t.Run(fmt.Sprintf("list-type-attributes=%v/consumable-capacity=%v", listType, consumable), func(t *testing.T) {
					a, err := ask(gpudraCase{
						Expression: scenario.expression,
						Driver:     scenario.driver,
						Device: resourceapi.Device{
							Name:                     "device",
							Attributes:               scenario.attributes,
							Capacity:                 scenario.capacity,
							AllowMultipleAllocations: scenario.allowMultipleAllocations,
						},
						ListTypeAttributes: listType,
						ConsumableCapacity: consumable,
					})
					if err != nil {
						t.Fatal(err)
					}
					if stop := expectError(t, "compile", a.CompileError, scenario.expectCompileError); stop {
						return
					}
					if scenario.expectCost != a.Cost {
						t.Errorf("ERROR: expected CEL cost %d, got %d instead", scenario.expectCost, a.Cost)
					}
					if stop := expectError(t, "evaluation", a.MatchError, scenario.expectMatchError); stop {
						return
					}
					if a.Match == nil || *a.Match != scenario.expectMatch {
						t.Fatalf("FAILURE: expected result %v, got %v", scenario.expectMatch, a.Match)
					}
				})
			}
		})
	}
}

func combinations(a, b []bool) [][2]bool {
	var out [][2]bool
	for _, x := range a {
		for _, y := range b {
			out = append(out, [2]bool{x, y})
		}
	}
	return out
}

// expectError holds one stage's error to the table's expectation (a substring, or "" for none)
// as TestCEL does; it says whether the case ends there (the stage failed as expected).
func expectError(t *testing.T, stage string, got *string, want string) bool {
	t.Helper()
	switch {
	case got != nil && want == "":
		t.Fatalf("FAILURE: unexpected %s error: %v", stage, *got)
	case got != nil && !strings.Contains(*got, want):
		t.Fatalf("FAILURE: expected %s error to contain %q, but got instead: %v", stage, want, *got)
	case got == nil && want != "":
		t.Fatalf("FAILURE: expected %s error %q, got none", stage, want)
	}
	return got != nil
}
