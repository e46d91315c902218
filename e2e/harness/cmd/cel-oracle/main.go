// cel-oracle evaluates DRA CEL device selectors with the Kubernetes library kube-scheduler uses
// (k8s.io/dynamic-resource-allocation/cel, StoredExpressions environment, runtime cost limit
// 1,000,000), so the Rust implementation can be checked against it.
//
// Protocol (shared with `gpu-dra cel eval --batch`): JSON lines on stdin,
//
//	{"driver": "gpu.nvidia.com", "expression": "...", "device": <resource.k8s.io/v1 Device>}
//
// and exactly one line on stdout per input line, in order:
//
//	{"result": true|false}
//	{"error": {"kind": "compile"|"runtime", "message": "..."}}
//
// "driver" is the ResourceSlice's spec.driver: it is device.driver in CEL and the domain of
// attribute/capacity names that have no "domain/" prefix, exactly as the allocator passes it.
// Compile messages are cel.Error.Detail; runtime messages are the error after
// cel.EnhanceRuntimeError (the text the scheduler embeds after "CEL runtime error: ").
// A line that is not valid input yields {"error": {"kind": "input", ...}} (harness bug, not a
// CEL outcome). Empty lines are skipped and produce no output.
//
// Each distinct expression is compiled once (cache of compiled programs, compile errors are
// cached too). Output is flushed whenever no further input is buffered, so the tool can run
// as a co-process answering one line at a time.
//
// Flags: --feature-gates (kube-scheduler syntax; default: the 1.37 defaults).
//
// --estimate-cost compiles as kube-apiserver's validation does (validateCELExpression in
// k8s.io/kubernetes/pkg/apis/resource/validation: NewExpressions environment, worst-case cost
// estimation on) instead of evaluating; "device" may then be omitted and each answer is
//
//	{"cost": <estimated maximum cost>}  (validation rejects it when above 1,000,000)
//	{"error": {"kind": "compile", "message": "..."}}
//
// An input line with "derived": true is compiled as a new derived attribute's expression.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/dynamic-resource-allocation/cel"

	"gpu-dra/e2e/harness/internal/draconfig"
)

type input struct {
	Driver     string              `json:"driver"`
	Expression string              `json:"expression"`
	Device     *resourceapi.Device `json:"device"`
	// With --estimate-cost: compile as a new derived attribute's expression (a request's
	// derivedAttributes[].expression), as validation does.
	Derived bool `json:"derived"`
}

type errorOut struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

type output struct {
	Result *bool     `json:"result,omitempty"`
	Error  *errorOut `json:"error,omitempty"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cel-oracle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gates := fs.String("feature-gates", "", "feature gates, kube-scheduler syntax (default: 1.37 defaults)")
	estimateCost := fs.Bool("estimate-cost", false, "compile as the API server validates (NewExpressions, cost estimation) and print the estimated cost")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := draconfig.SetFeatureGates(*gates); err != nil {
		fmt.Fprintf(stderr, "cel-oracle: --feature-gates: %v\n", err)
		return 2
	}
	if err := evalStream(context.Background(), cel.GetCompiler(draconfig.CELFeatures()), *estimateCost, stdin, stdout); err != nil {
		fmt.Fprintf(stderr, "cel-oracle: %v\n", err)
		return 1
	}
	return 0
}

// compiler is the subset of the DRA compiler the oracle needs (the concrete type is unexported).
type compiler interface {
	CompileCELExpression(expression string, options cel.Options) cel.CompilationResult
}

func evalStream(ctx context.Context, c compiler, estimateCost bool, stdin io.Reader, stdout io.Writer) error {
	in := bufio.NewReaderSize(stdin, 1<<20)
	out := bufio.NewWriter(stdout)
	enc := json.NewEncoder(out) // Encode appends '\n': one line per answer
	enc.SetEscapeHTML(false)
	// Same options as cel.Cache.GetOrCompile (what the allocator uses): no cost estimation.
	compiled := map[string]cel.CompilationResult{}
	for {
		line, readErr := in.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			answer := func() any { return evalLine(ctx, c, compiled, line) }
			if estimateCost {
				answer = func() any { return estimateLine(c, line) }
			}
			if err := enc.Encode(answer()); err != nil {
				return err
			}
		}
		if readErr != nil {
			if errors.Is(readErr, io.EOF) {
				return out.Flush()
			}
			return readErr
		}
		if in.Buffered() == 0 {
			if err := out.Flush(); err != nil {
				return err
			}
		}
	}
}

func evalLine(ctx context.Context, c compiler, compiled map[string]cel.CompilationResult, line []byte) output {
	var req input
	if err := json.Unmarshal(line, &req); err != nil {
		return errorf("input", "invalid input line: %v", err)
	}
	if req.Device == nil {
		return errorf("input", `input line has no "device"`)
	}
	res, ok := compiled[req.Expression]
	if !ok {
		res = c.CompileCELExpression(req.Expression, cel.Options{DisableCostEstimation: true})
		compiled[req.Expression] = res
	}
	if res.Error != nil {
		return errorf("compile", "%s", res.Error.Detail)
	}
	// Same cel.Device the allocator builds (selectorsMatch in structured/internal/*).
	matches, _, err := res.DeviceMatches(ctx, cel.Device{
		Driver:                   req.Driver,
		AllowMultipleAllocations: req.Device.AllowMultipleAllocations,
		Attributes:               req.Device.Attributes,
		Capacity:                 req.Device.Capacity,
	})
	if err != nil {
		return errorf("runtime", "%s", cel.EnhanceRuntimeError(err).Error())
	}
	return output{Result: &matches}
}

type costOutput struct {
	Cost uint64 `json:"cost"`
}

// estimateLine compiles like validateCELExpression: the length limit is the caller's business
// (the API server rejects longer expressions without compiling them).
func estimateLine(c compiler, line []byte) any {
	var req input
	if err := json.Unmarshal(line, &req); err != nil {
		return errorf("input", "invalid input line: %v", err)
	}
	envType := environment.NewExpressions
	res := c.CompileCELExpression(req.Expression, cel.Options{EnvType: &envType, DerivedAttribute: req.Derived})
	if res.Error != nil {
		return errorf("compile", "%s", res.Error.Detail)
	}
	return costOutput{Cost: res.MaxCost}
}

func errorf(kind, format string, args ...any) output {
	return output{Error: &errorOut{Kind: kind, Message: fmt.Sprintf(format, args...)}}
}
