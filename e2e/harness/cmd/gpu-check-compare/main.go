// gpu-check-compare: two read-only comparisons e2e/gpu-check.sh runs on a machine with a real GPU.
//
//	gpu-check-compare --slices FILE --smi FILE [--lgipp FILE]
//	gpu-check-compare --cdi-ours FILE --cdi-ours-device NAME --cdi-nvidia FILE --cdi-nvidia-device NAME
//
// The first (step 2): the GPUs gpu-dra publishes (`gpu-dra slices -o json`) against what
// nvidia-smi reports on the same machine (`nvidia-smi -q -x`, and `nvidia-smi mig -lgipp` where
// MIG mode is on). Per GPU (matched by minor number): UUID, product name, architecture, PCI bus
// ID, memory (whole GPUs: nvidia-smi's FB total in MiB against our `memory` capacity), driver and
// CUDA versions, MIG capability (nvidia-smi's current MIG mode is N/A exactly when the GPU cannot
// do MIG), the MIG devices that exist (static offer) and, where MIG mode is on and none exist,
// every placement of every profile (dynamic offer) against -lgipp. One line per check, "ok" or
// "MISMATCH"; "explained" where a difference is by design and the line says why.
//
// The second (step 7, parity): what a container holding one GPU gets from our CDI spec
// (`gpu-dra cdi`) against what it gets from NVIDIA's (`nvidia-ctk cdi generate`), entry by entry
// as tests/cdi_nvidia_ctk.rs compares them on the simulator: the spec's common edits plus the
// device's, as env, device nodes, mounts (options sorted), the links the create-symlinks hook
// makes (each followed through the others to where it ends), the update-ldcache folders and
// every other hook. A device NAME may carry its kind (`k8s.gpu.nvidia.com/claim=NAME`). One line
// per entry only one side has: "explained" where a row of cdiExplained matches it (the line says
// why), else "MISMATCH"; then the count line. A row that matches nothing is fine here (a real
// node need not have every case the simulator's driver root has).
//
// Exit status: 0 all checks ok or explained; 1 a mismatch; 2 usage or an input that does not
// parse (a format this tool does not know must not pass as "no differences").
package main

import (
	_ "embed"
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

type smiLog struct {
	DriverVersion string   `xml:"driver_version"`
	CudaVersion   string   `xml:"cuda_version"`
	GPUs          []smiGPU `xml:"gpu"`
}

type smiGPU struct {
	ID           string `xml:"id,attr"`
	ProductName  string `xml:"product_name"`
	Architecture string `xml:"product_architecture"`
	UUID         string `xml:"uuid"`
	Minor        string `xml:"minor_number"`
	MigMode      struct {
		Current string `xml:"current_mig"`
	} `xml:"mig_mode"`
	MigDevices struct {
		Devices []struct {
			GpuInstanceID     string `xml:"gpu_instance_id"`
			ComputeInstanceID string `xml:"compute_instance_id"`
		} `xml:"mig_device"`
	} `xml:"mig_devices"`
	FBMemory struct {
		Total string `xml:"total"`
	} `xml:"fb_memory_usage"`
	PCI struct {
		BusID string `xml:"pci_bus_id"`
	} `xml:"pci"`
}

type attribute struct {
	String  *string `json:"string"`
	Int     *int64  `json:"int"`
	Version *string `json:"version"`
}

type device struct {
	Name       string               `json:"name"`
	Attributes map[string]attribute `json:"attributes"`
	Capacity   map[string]struct {
		Value string `json:"value"`
	} `json:"capacity"`
}

type sliceList struct {
	Items []struct {
		Spec struct {
			Devices []device `json:"devices"`
		} `json:"spec"`
	} `json:"items"`
}

// placement is one (GPU instance profile id, start) pair.
type placement struct{ profile, start int }

var (
	migName   = regexp.MustCompile(`^gpu-(\d+)-mig-.+-(\d+)-(\d+)$`)
	lgippLine = regexp.MustCompile(`^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([0-9,\s]*)\}\s*:\s*(\d+)\s*$`)
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: gpu-check-compare --slices FILE --smi FILE [--lgipp FILE]
       gpu-check-compare --cdi-ours FILE --cdi-ours-device NAME --cdi-nvidia FILE --cdi-nvidia-device NAME`

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpu-check-compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	slicesPath := fs.String("slices", "", "gpu-dra slices -o json output")
	smiPath := fs.String("smi", "", "nvidia-smi -q -x output")
	lgippPath := fs.String("lgipp", "", "nvidia-smi mig -lgipp output (where MIG mode is on)")
	oursPath := fs.String("cdi-ours", "", "our CDI spec (gpu-dra cdi)")
	oursDevice := fs.String("cdi-ours-device", "", "the device of --cdi-ours to compare")
	nvidiaPath := fs.String("cdi-nvidia", "", "NVIDIA's CDI spec (nvidia-ctk cdi generate)")
	nvidiaDevice := fs.String("cdi-nvidia-device", "", "the device of --cdi-nvidia to compare")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	smiMode := given["slices"] || given["smi"] || given["lgipp"]
	cdiMode := given["cdi-ours"] || given["cdi-ours-device"] || given["cdi-nvidia"] || given["cdi-nvidia-device"]
	switch {
	case smiMode && cdiMode:
		fmt.Fprintln(stderr, "gpu-check-compare: --slices/--smi/--lgipp and --cdi-* are two modes: give one")
		fmt.Fprintln(stderr, usage)
		return 2
	case cdiMode:
		if *oursPath == "" || *oursDevice == "" || *nvidiaPath == "" || *nvidiaDevice == "" {
			fmt.Fprintln(stderr, usage)
			return 2
		}
		return runCDI(*oursPath, *oursDevice, *nvidiaPath, *nvidiaDevice, stdout, stderr)
	}
	if *slicesPath == "" || *smiPath == "" {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "gpu-check-compare: "+format+"\n", a...)
		return 2
	}
	var list sliceList
	if raw, err := os.ReadFile(*slicesPath); err != nil {
		return fail("--slices: %v", err)
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return fail("--slices %s: %v", *slicesPath, err)
	}
	var log smiLog
	if raw, err := os.ReadFile(*smiPath); err != nil {
		return fail("--smi: %v", err)
	} else if err := xml.Unmarshal(raw, &log); err != nil {
		return fail("--smi %s: %v", *smiPath, err)
	}
	if len(log.GPUs) == 0 {
		return fail("--smi %s: no <gpu> element: not nvidia-smi -q -x output", *smiPath)
	}
	lgipp := map[int]map[placement]bool{}
	if *lgippPath != "" {
		raw, err := os.ReadFile(*lgippPath)
		if err != nil {
			return fail("--lgipp: %v", err)
		}
		if lgipp, err = parseLgipp(string(raw)); err != nil {
			return fail("--lgipp %s: %v", *lgippPath, err)
		}
	}
	mismatches := compare(list, log, lgipp, stdout)
	fmt.Fprintf(stdout, "%d GPUs compared, %d mismatches\n", len(log.GPUs), mismatches)
	if mismatches > 0 {
		return 1
	}
	return 0
}

// parseLgipp reads `nvidia-smi mig -lgipp`: "GPU  0 Profile ID 19 Placements: {0,1,2}:1".
func parseLgipp(text string) (map[int]map[placement]bool, error) {
	out := map[int]map[placement]bool{}
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		m := lgippLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d %q: not a placement line", n+1, line)
		}
		gpu, _ := strconv.Atoi(m[1])
		profile, _ := strconv.Atoi(m[2])
		if out[gpu] == nil {
			out[gpu] = map[placement]bool{}
		}
		for _, s := range strings.Split(m[3], ",") {
			start, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("line %d %q: start %q", n+1, line, s)
			}
			out[gpu][placement{profile, start}] = true
		}
	}
	return out, nil
}

func str(d *device, key string) string {
	if a, ok := d.Attributes[key]; ok {
		switch {
		case a.String != nil:
			return *a.String
		case a.Version != nil:
			return *a.Version
		case a.Int != nil:
			return strconv.FormatInt(*a.Int, 10)
		}
	}
	return ""
}

// busID normalizes "00000000:17:00.0" and "0000:17:00.0" to "0000:17:00.0".
func busID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) > 4 {
		return domain[len(domain)-4:] + ":" + rest
	}
	return id
}

// semver normalizes "580.95.05" and "12.9" the way Kubernetes version attributes hold them.
func semver(v string) string {
	parts := strings.Split(strings.TrimSpace(v), ".")
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		if n, err := strconv.Atoi(p); err == nil {
			parts[i] = strconv.Itoa(n)
		}
	}
	return strings.Join(parts, ".")
}

// quantityBytes reads a Kubernetes quantity with a binary or decimal suffix, or none.
func quantityBytes(q string) (int64, bool) {
	suffixes := []struct {
		s string
		m int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	for _, s := range suffixes {
		if n, ok := strings.CutSuffix(q, s.s); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v * s.m, err == nil
		}
	}
	v, err := strconv.ParseInt(q, 10, 64)
	return v, err == nil
}

func compare(list sliceList, log smiLog, lgipp map[int]map[placement]bool, out io.Writer) int {
	byName := map[string]*device{}
	migOf := map[string][]*device{} // by minor
	for i := range list.Items {
		for j := range list.Items[i].Spec.Devices {
			d := &list.Items[i].Spec.Devices[j]
			byName[d.Name] = d
			if m := migName.FindStringSubmatch(d.Name); m != nil {
				migOf[m[1]] = append(migOf[m[1]], d)
			}
		}
	}
	mismatches := 0
	check := func(gpu, what, ours, theirs string) {
		if ours == theirs {
			fmt.Fprintf(out, "ok        gpu-%s %s: %s\n", gpu, what, ours)
			return
		}
		mismatches++
		fmt.Fprintf(out, "MISMATCH  gpu-%s %s: ours %q, nvidia-smi %q\n", gpu, what, ours, theirs)
	}
	explained := func(gpu, what, why string) {
		fmt.Fprintf(out, "explained gpu-%s %s: %s\n", gpu, what, why)
	}
	for index, g := range log.GPUs {
		minor := strings.TrimSpace(g.Minor)
		whole := byName["gpu-"+minor]
		migs := migOf[minor]
		// The GPU's own attributes, from the whole device or (in MIG mode) any of its MIG devices.
		ref := whole
		if ref == nil && len(migs) > 0 {
			ref = migs[0]
		}
		if ref == nil {
			mismatches++
			fmt.Fprintf(out, "MISMATCH  gpu-%s (%s): nvidia-smi reports it, we publish no device of it\n", minor, g.UUID)
			continue
		}
		uuid := str(ref, "uuid")
		if whole == nil {
			uuid = str(ref, "parentUUID")
		}
		check(minor, "uuid", uuid, strings.TrimSpace(g.UUID))
		check(minor, "productName", str(ref, "productName"), strings.TrimSpace(g.ProductName))
		if arch := strings.TrimSpace(g.Architecture); arch != "" {
			check(minor, "architecture", str(ref, "architecture"), arch)
		}
		check(minor, "pciBusID", busID(str(ref, "resource.kubernetes.io/pciBusID")), busID(g.PCI.BusID))
		check(minor, "driverVersion", str(ref, "driverVersion"), semver(log.DriverVersion))
		if cuda := strings.TrimSpace(log.CudaVersion); cuda != "" && !strings.EqualFold(cuda, "N/A") {
			check(minor, "cudaDriverVersion", str(ref, "cudaDriverVersion"), semver(cuda))
		}
		if whole != nil {
			total := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(g.FBMemory.Total), "MiB"))
			smiMiB, err := strconv.ParseInt(total, 10, 64)
			ours, ok := quantityBytes(whole.Capacity["memory"].Value)
			switch {
			case err != nil || !ok:
				mismatches++
				fmt.Fprintf(out, "MISMATCH  gpu-%s memory: ours %q, nvidia-smi %q (unreadable)\n", minor, whole.Capacity["memory"].Value, g.FBMemory.Total)
			default:
				check(minor, "memory MiB", strconv.FormatInt(ours>>20, 10), strconv.FormatInt(smiMiB, 10))
			}
		}
		mode := strings.TrimSpace(g.MigMode.Current)
		capable := !strings.EqualFold(mode, "N/A") && mode != ""
		switch {
		case !capable && len(migs) > 0:
			mismatches++
			fmt.Fprintf(out, "MISMATCH  gpu-%s MIG: we offer %d MIG devices, nvidia-smi says the GPU cannot do MIG\n", minor, len(migs))
		case !capable:
			fmt.Fprintf(out, "ok        gpu-%s MIG: not capable, none offered\n", minor)
		case len(migs) == 0 && strings.EqualFold(mode, "Disabled") && strings.EqualFold(str(ref, "architecture"), "Ampere"):
			explained(minor, "MIG", "capable, MIG mode off on an Ampere GPU: --mig auto offers MIG there only in MIG mode (enabling it needs a GPU reset)")
		case len(migs) == 0:
			mismatches++
			fmt.Fprintf(out, "MISMATCH  gpu-%s MIG: nvidia-smi says MIG mode %s, we offer no MIG device\n", minor, mode)
		case len(g.MigDevices.Devices) > 0:
			check(minor, "MIG devices (existing)", strconv.Itoa(len(migs)), strconv.Itoa(len(g.MigDevices.Devices)))
		case strings.EqualFold(mode, "Enabled"):
			theirs, ok := lgipp[index]
			if !ok {
				mismatches++
				fmt.Fprintf(out, "MISMATCH  gpu-%s MIG placements: MIG mode on but no -lgipp lines for GPU %d\n", minor, index)
				break
			}
			ours := map[placement]bool{}
			for _, d := range migs {
				m := migName.FindStringSubmatch(d.Name)
				profile, _ := strconv.Atoi(m[2])
				start, _ := strconv.Atoi(m[3])
				ours[placement{profile, start}] = true
			}
			check(minor, "MIG placements (profile id:start)", placements(ours), placements(theirs))
		default:
			fmt.Fprintf(out, "ok        gpu-%s MIG: capable, MIG mode off, %d placements offered (nvidia-smi lists placements only in MIG mode)\n", minor, len(migs))
		}
	}
	return mismatches
}

func placements(set map[placement]bool) string {
	list := make([]placement, 0, len(set))
	for p := range set {
		list = append(list, p)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].profile != list[j].profile {
			return list[i].profile < list[j].profile
		}
		return list[i].start < list[j].start
	})
	parts := make([]string, len(list))
	for i, p := range list {
		parts[i] = fmt.Sprintf("%d:%d", p.profile, p.start)
	}
	return strings.Join(parts, " ")
}

// cdiSpec is the part of a CDI spec (tags.cncf.io/container-device-interface/specs-go) that
// says what a container gets.
type cdiSpec struct {
	CDIVersion     string      `json:"cdiVersion"`
	Kind           string      `json:"kind"`
	Devices        []cdiDevice `json:"devices"`
	ContainerEdits cdiEdits    `json:"containerEdits"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string `json:"env"`
	DeviceNodes []struct {
		Path     string `json:"path"`
		HostPath string `json:"hostPath"`
	} `json:"deviceNodes"`
	Mounts []struct {
		HostPath      string   `json:"hostPath"`
		ContainerPath string   `json:"containerPath"`
		Options       []string `json:"options"`
	} `json:"mounts"`
	Hooks []struct {
		HookName string   `json:"hookName"`
		Path     string   `json:"path"`
		Args     []string `json:"args"`
	} `json:"hooks"`
}

// cdiDifferencesTSV: the differences between our spec and nvidia-ctk's that are by design, shared
// with tests/cdi_nvidia_ctk.rs. side is the one spec that has the entry ("nvidia" or "ours");
// entry a glob (`*`: any text) over the entries as cdiEntries names them.
//
//go:embed cdi-differences.tsv
var cdiDifferencesTSV string

type cdiDifference struct{ side, entry, why string }

// cdiExplained is cdiDifferencesTSV parsed; a malformed row stops the tool at start.
var cdiExplained = parseCDIDifferences(cdiDifferencesTSV)

func parseCDIDifferences(text string) []cdiDifference {
	var rows []cdiDifference
	for n, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cols := strings.Split(line, "\t")
		if len(cols) != 3 || (cols[0] != "nvidia" && cols[0] != "ours") {
			panic(fmt.Sprintf("cdi-differences.tsv line %d: want side<TAB>entry<TAB>why with side nvidia or ours, got %q", n+1, line))
		}
		rows = append(rows, cdiDifference{cols[0], cols[1], cols[2]})
	}
	return rows
}

// runCDI compares what a container holding one device gets from our spec and from NVIDIA's.
func runCDI(oursPath, oursDevice, nvidiaPath, nvidiaDevice string, stdout, stderr io.Writer) int {
	ours, err := specEntries("--cdi-ours", oursPath, oursDevice)
	if err == nil {
		var theirs map[string]bool
		if theirs, err = specEntries("--cdi-nvidia", nvidiaPath, nvidiaDevice); err == nil {
			if compareCDI(ours, theirs, stdout) > 0 {
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "gpu-check-compare: %v\n", err)
	return 2
}

// compareCDI prints each entry only one side has, then the count line; returns the mismatches.
func compareCDI(ours, theirs map[string]bool, out io.Writer) int {
	union := map[string]bool{}
	for e := range ours {
		union[e] = true
	}
	for e := range theirs {
		union[e] = true
	}
	explained, mismatches := 0, 0
	for _, side := range []struct {
		name      string
		has, lack map[string]bool
	}{{"nvidia", theirs, ours}, {"ours", ours, theirs}} {
		only := []string{}
		for e := range side.has {
			if !side.lack[e] {
				only = append(only, e)
			}
		}
		sort.Strings(only)
	entries:
		for _, e := range only {
			for _, row := range cdiExplained {
				if row.side == side.name && glob(row.entry, e) {
					explained++
					fmt.Fprintf(out, "explained only %s: %s (%s)\n", side.name, e, row.why)
					continue entries
				}
			}
			mismatches++
			fmt.Fprintf(out, "MISMATCH  only %s: %s\n", side.name, e)
		}
	}
	fmt.Fprintf(out, "CDI vs nvidia-ctk: %d entries compared, %d differences explained, %d mismatches\n",
		len(union), explained, mismatches)
	return mismatches
}

// specEntries reads the spec at file (given as option) and names what a container holding its
// device name (with or without the spec's kind before a `=`) gets.
func specEntries(option, file, name string) (map[string]bool, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", option, err)
	}
	var spec cdiSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("%s %s: %v", option, file, err)
	}
	if spec.CDIVersion == "" || spec.Kind == "" {
		return nil, fmt.Errorf("%s %s: no cdiVersion or kind: not a CDI spec", option, file)
	}
	if kind, short, ok := strings.Cut(name, "="); ok {
		if kind != spec.Kind {
			return nil, fmt.Errorf("%s %s: device %q: the spec's kind is %q", option, file, name, spec.Kind)
		}
		name = short
	}
	names := []string{}
	for i := range spec.Devices {
		if spec.Devices[i].Name != name {
			names = append(names, spec.Devices[i].Name)
			continue
		}
		entries, err := cdiEntries(&spec, i)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", option, file, err)
		}
		if len(entries) == 0 {
			return nil, fmt.Errorf("%s %s: device %q: its edits give a container nothing", option, file, name)
		}
		return entries, nil
	}
	return nil, fmt.Errorf("%s %s: devices: no device named %q (it has %q)", option, file, name, names)
}

// cdiEntries names what a container holding spec.Devices[device] gets from the spec's common
// edits and the device's, as tests/cdi_nvidia_ctk.rs's `entries` does. Beyond it: a device node
// without hostPath is at its path (the CDI default), and a hook argument that is not a --link
// (create-symlinks) or --folder (update-ldcache) is kept in a hook entry, not dropped.
func cdiEntries(spec *cdiSpec, device int) (map[string]bool, error) {
	out := map[string]bool{}
	links := map[string]string{}
	for _, edits := range []struct {
		field string
		edits *cdiEdits
	}{
		{"containerEdits", &spec.ContainerEdits},
		{fmt.Sprintf("devices[%d].containerEdits", device), &spec.Devices[device].ContainerEdits},
	} {
		e := edits.edits
		for i, env := range e.Env {
			if name, _, ok := strings.Cut(env, "="); !ok || name == "" {
				return nil, fmt.Errorf("%s.env[%d] %q: not NAME=VALUE", edits.field, i, env)
			}
			out["env "+env] = true
		}
		for i, node := range e.DeviceNodes {
			if node.Path == "" {
				return nil, fmt.Errorf("%s.deviceNodes[%d].path: empty", edits.field, i)
			}
			host := node.HostPath
			if host == "" {
				host = node.Path
			}
			out["device-node "+node.Path+" "+host] = true
		}
		for i, mount := range e.Mounts {
			if mount.ContainerPath == "" || mount.HostPath == "" {
				return nil, fmt.Errorf("%s.mounts[%d]: containerPath %q, hostPath %q: both are needed",
					edits.field, i, mount.ContainerPath, mount.HostPath)
			}
			options := append([]string(nil), mount.Options...)
			sort.Strings(options)
			out["mount "+mount.ContainerPath+" "+mount.HostPath+" "+strings.Join(options, ",")] = true
		}
		for i, hook := range e.Hooks {
			field := fmt.Sprintf("%s.hooks[%d]", edits.field, i)
			if hook.HookName == "" || len(hook.Args) == 0 {
				return nil, fmt.Errorf("%s: hookName %q, args %q: both are needed", field, hook.HookName, hook.Args)
			}
			args := hook.Args[1:]
			var command string
			if len(args) > 0 {
				command, args = args[0], args[1:]
			}
			switch command {
			case "create-symlinks":
				values, other, err := flagValues(args, "link")
				if err != nil {
					return nil, fmt.Errorf("%s.args: %v", field, err)
				}
				for _, v := range values {
					target, link, ok := strings.Cut(v, "::")
					if !ok || target == "" || !path.IsAbs(link) {
						return nil, fmt.Errorf("%s.args: --link %q: not TARGET::/LINK", field, v)
					}
					link = path.Clean(link)
					if !path.IsAbs(target) {
						target = path.Join(path.Dir(link), target)
					}
					links[link] = path.Clean(target)
				}
				if len(other) > 0 {
					out[fmt.Sprintf("hook create-symlinks %s (%s)", strings.Join(other, " "), hook.HookName)] = true
				}
			case "update-ldcache":
				values, other, err := flagValues(args, "folder")
				if err != nil {
					return nil, fmt.Errorf("%s.args: %v", field, err)
				}
				for _, v := range values {
					out["ldcache-folder "+v] = true
				}
				if len(other) > 0 {
					out[fmt.Sprintf("hook update-ldcache %s (%s)", strings.Join(other, " "), hook.HookName)] = true
				}
			default:
				out[fmt.Sprintf("hook %s (%s)", strings.Join(hook.Args[1:], " "), hook.HookName)] = true
			}
		}
	}
	// A link is the file it ends at, however many links lead there.
	for link, target := range links {
		end := target
		for range 8 {
			next, ok := links[end]
			if !ok {
				break
			}
			end = next
		}
		out["link "+link+" -> "+end] = true
	}
	return out, nil
}

// flagValues splits args into the values of --name (as `--name V` or `--name=V`) and the rest.
func flagValues(args []string, name string) (values, other []string, err error) {
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--"+name:
			if i+1 == len(args) {
				return nil, nil, fmt.Errorf("--%s without a value", name)
			}
			values = append(values, args[i+1])
			i++
		case strings.HasPrefix(a, "--"+name+"="):
			values = append(values, strings.TrimPrefix(a, "--"+name+"="))
		default:
			other = append(other, a)
		}
	}
	return values, other, nil
}

// glob reports whether text matches pattern, where `*` stands for any text (as
// tests/differential's glob).
func glob(pattern, text string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == text
	}
	first, last := parts[0], parts[len(parts)-1]
	if !strings.HasPrefix(text, first) || len(text) < len(first)+len(last) || !strings.HasSuffix(text, last) {
		return false
	}
	rest := text[len(first) : len(text)-len(last)]
	for _, part := range parts[1 : len(parts)-1] {
		at := strings.Index(rest, part)
		if at < 0 {
			return false
		}
		rest = rest[at+len(part):]
	}
	return true
}
