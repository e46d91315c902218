// cdi-inject: what a container would get from the CDI spec files in one directory, computed by
// the CDI library container runtimes themselves use (tags.cncf.io/container-device-interface,
// the version containerd 2.x in e2e/containerd builds with).
//
//	cdi-inject --spec-dir DIR [--device QUALIFIED_ID ...] [--oci-spec FILE --write-spec OUT]
//
// --device may repeat and also takes a comma-separated list
// (e.g. k8s.gpu.nvidia.com/claim=uid-gpu-0,k8s.gpu.nvidia.com/claim=uid-gpu-1).
//
// --oci-spec: inject into this OCI runtime spec (a bundle's config.json) instead of an empty one,
// and write the result to --write-spec, as a runtime would before starting the container
// (e2e/gpu-check.sh runs runc on it). Only written when the injection succeeded.
//
// It loads a CDI cache over exactly DIR (no auto-refresh, no /etc/cdi or /var/run/cdi), then
// injects the devices into an empty OCI runtime spec (Process with no env, empty Linux), the
// way containerd's WithCDIDevices does (cdi.Refresh, then cdi.InjectDevices). One JSON object
// goes to stdout, always, even on failure:
//
//	{"specErrors": {"<spec file path>": ["..."]},      // files the cache rejected (or conflicts)
//	 "vendors": ["k8s.gpu.nvidia.com"], "devices": ["k8s.gpu.nvidia.com/claim=..."],
//	 "linuxDevices": [{"path","type","major","minor"}],
//	 "mounts": [{"source","destination","type","options"}],
//	 "env": ["K=V"],
//	 "hooks": {"prestart","createRuntime","createContainer","startContainer","poststart","poststop":
//	           [{"path","args","env"}]},
//	 "injectError": "", "unresolved": []}
//
// Arrays and objects are empty, never null. When injection fails, linuxDevices, mounts, env
// and hooks are empty (nothing of a partial injection is reported).
//
// Exit status: 0 ok; 1 usage or DIR missing/unreadable; 2 at least one spec file was rejected
// (errors also on stderr; the requested devices, if all resolved, are still injected, as
// containerd only warns about a failed refresh); 3 injection failed (unresolvable device, or
// an edit the library refuses to apply, see below) — 3 wins over 2.
//
// Device nodes whose host path does not exist (read from the library, v1.1.1):
//
//   - Loading a spec file never looks at the filesystem for device nodes: validation is
//     syntactic only (non-empty path; type "", "b", "c", "u" or "p"; permissions within
//     "rwm" or "none"). A missing node never makes a spec file rejected (exit 2).
//   - At injection, ContainerEdits.Apply calls DeviceNode.fillMissingInfo for every node:
//     it lstat()s hostPath (path when hostPath is empty) on THIS machine, as given (our fake
//     dev root paths are stat'ed as they are).
//   - If lstat fails (the path does not exist) or the file is not a device node (a regular
//     file gives "not a device node"), the error is IGNORED when the node is "minimally
//     specified": type set and major != 0 (or type "p"). The spec's type/major/minor are then
//     used as they are, and fileMode stays unset. Otherwise (no type, or major 0 — major 0
//     counts as "not given") injection FAILS: `failed to inject devices: failed to stat CDI
//     host device "<hostPath>": <lstat error or "not a device node">` → exit 3.
//   - If the node exists and is a real device node: fileMode is taken from it; a minimally
//     specified node keeps the spec's type/major/minor even if the host node differs; otherwise
//     type (when empty) and major/minor come from the host, and a spec type that differs from
//     the host's is an error (`host type mismatch`, exit 3).
//
// Nothing here works around library errors: they are what the tests want to detect.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

const (
	exitOK          = 0
	exitUsage       = 1
	exitSpecErrors  = 2
	exitInjectError = 3
)

type deviceList []string

func (d *deviceList) String() string { return strings.Join(*d, ",") }

func (d *deviceList) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			*d = append(*d, id)
		}
	}
	return nil
}

type linuxDevice struct {
	Path  string `json:"path"`
	Type  string `json:"type"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

type mount struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Options     []string `json:"options"`
}

type hook struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
}

type output struct {
	SpecErrors   map[string][]string `json:"specErrors"`
	Vendors      []string            `json:"vendors"`
	Devices      []string            `json:"devices"`
	LinuxDevices []linuxDevice       `json:"linuxDevices"`
	Mounts       []mount             `json:"mounts"`
	Env          []string            `json:"env"`
	Hooks        map[string][]hook   `json:"hooks"`
	InjectError  string              `json:"injectError"`
	Unresolved   []string            `json:"unresolved"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdi-inject", flag.ContinueOnError)
	fs.SetOutput(stderr)
	specDir := fs.String("spec-dir", "", "the only CDI spec directory to load (required)")
	var devices deviceList
	fs.Var(&devices, "device", "fully qualified CDI device to inject (repeatable, or comma-separated)")
	ociSpec := fs.String("oci-spec", "", "OCI runtime spec to inject into (default: an empty one)")
	writeSpec := fs.String("write-spec", "", "where to write the injected OCI spec (with --oci-spec)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *specDir == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: cdi-inject --spec-dir DIR [--device QUALIFIED_ID ...] [--oci-spec FILE --write-spec OUT]")
		return exitUsage
	}
	if (*ociSpec == "") != (*writeSpec == "") {
		fmt.Fprintln(stderr, "cdi-inject: --oci-spec and --write-spec go together")
		return exitUsage
	}
	base := &oci.Spec{Process: &oci.Process{Env: []string{}}, Linux: &oci.Linux{}}
	if *ociSpec != "" {
		raw, err := os.ReadFile(*ociSpec)
		if err == nil {
			base = &oci.Spec{}
			err = json.Unmarshal(raw, base)
		}
		if err != nil {
			fmt.Fprintf(stderr, "cdi-inject: --oci-spec %s: %v\n", *ociSpec, err)
			return exitUsage
		}
	}
	// The library silently skips a spec directory that does not exist; a test pointing at the
	// wrong directory must not look like "no devices".
	if st, err := os.Stat(*specDir); err != nil || !st.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		fmt.Fprintf(stderr, "cdi-inject: --spec-dir %s: %v\n", *specDir, err)
		return exitUsage
	}

	// NewCache loads the specs once (configure → refresh); its error is always nil in v1.1.1.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(*specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		fmt.Fprintf(stderr, "cdi-inject: %v\n", err)
		return exitUsage
	}

	out := output{
		SpecErrors:   map[string][]string{},
		Vendors:      nonNil(cache.ListVendors()),
		Devices:      nonNil(cache.ListDevices()),
		LinuxDevices: []linuxDevice{},
		Mounts:       []mount{},
		Env:          []string{},
		Hooks:        map[string][]hook{},
		Unresolved:   []string{},
	}
	for _, name := range []string{cdi.PrestartHook, cdi.CreateRuntimeHook, cdi.CreateContainerHook,
		cdi.StartContainerHook, cdi.PoststartHook, cdi.PoststopHook} {
		out.Hooks[name] = []hook{}
	}
	errFiles := []string{}
	for path, errs := range cache.GetErrors() {
		if len(errs) == 0 {
			continue
		}
		msgs := make([]string, 0, len(errs))
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		out.SpecErrors[path] = msgs
		errFiles = append(errFiles, path)
	}
	slices.Sort(errFiles)

	code := exitOK
	if len(errFiles) > 0 {
		code = exitSpecErrors
	}
	if len(devices) > 0 {
		spec := base
		unresolved, err := cache.InjectDevices(spec, devices...)
		if err != nil {
			out.InjectError = err.Error()
			out.Unresolved = nonNil(unresolved)
			code = exitInjectError
		} else {
			fill(&out, spec)
			if *writeSpec != "" {
				raw, err := json.MarshalIndent(spec, "", "  ")
				if err == nil {
					err = os.WriteFile(*writeSpec, raw, 0o644)
				}
				if err != nil {
					fmt.Fprintf(stderr, "cdi-inject: --write-spec %s: %v\n", *writeSpec, err)
					return exitUsage
				}
			}
		}
	}

	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "cdi-inject: writing JSON: %v\n", err)
		return exitUsage
	}
	for _, path := range errFiles {
		for _, msg := range out.SpecErrors[path] {
			fmt.Fprintf(stderr, "cdi-inject: spec file %s rejected: %s\n", path, msg)
		}
	}
	if out.InjectError != "" {
		fmt.Fprintf(stderr, "cdi-inject: %s\n", out.InjectError)
	}
	return code
}

// fill copies what the injection put into the OCI spec into out.
func fill(out *output, spec *oci.Spec) {
	if spec.Process != nil {
		out.Env = nonNil(spec.Process.Env)
	}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			out.LinuxDevices = append(out.LinuxDevices, linuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
		}
	}
	for _, m := range spec.Mounts {
		out.Mounts = append(out.Mounts, mount{Source: m.Source, Destination: m.Destination, Type: m.Type, Options: nonNil(m.Options)})
	}
	if h := spec.Hooks; h != nil {
		for name, hooks := range map[string][]oci.Hook{
			cdi.PrestartHook:        h.Prestart, //nolint:staticcheck // deprecated in OCI, still injected by CDI
			cdi.CreateRuntimeHook:   h.CreateRuntime,
			cdi.CreateContainerHook: h.CreateContainer,
			cdi.StartContainerHook:  h.StartContainer,
			cdi.PoststartHook:       h.Poststart,
			cdi.PoststopHook:        h.Poststop,
		} {
			for _, k := range hooks {
				out.Hooks[name] = append(out.Hooks[name], hook{Path: k.Path, Args: nonNil(k.Args), Env: nonNil(k.Env)})
			}
		}
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
