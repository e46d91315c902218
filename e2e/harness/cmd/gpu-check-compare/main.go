// gpu-check-compare: the GPUs gpu-dra publishes (`gpu-dra slices -o json`) against what
// nvidia-smi reports on the same machine (`nvidia-smi -q -x`, and `nvidia-smi mig -lgipp` where
// MIG mode is on). Run by e2e/gpu-check.sh on a machine with a real GPU; only reads files.
//
//	gpu-check-compare --slices FILE --smi FILE [--lgipp FILE]
//
// Per GPU (matched by minor number): UUID, product name, architecture, PCI bus ID, memory (whole
// GPUs: nvidia-smi's FB total in MiB against our `memory` capacity), driver and CUDA versions,
// MIG capability (nvidia-smi's current MIG mode is N/A exactly when the GPU cannot do MIG), the
// MIG devices that exist (static offer) and, where MIG mode is on and none exist, every
// placement of every profile (dynamic offer) against -lgipp. One line per check, "ok" or
// "MISMATCH"; "explained" where a difference is by design and the line says why.
//
// Exit status: 0 all checks ok or explained; 1 a mismatch; 2 usage or an input that does not
// parse (a format this tool does not know must not pass as "no differences").
package main

import (
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"os"
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

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpu-check-compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	slicesPath := fs.String("slices", "", "gpu-dra slices -o json output")
	smiPath := fs.String("smi", "", "nvidia-smi -q -x output")
	lgippPath := fs.String("lgipp", "", "nvidia-smi mig -lgipp output (where MIG mode is on)")
	if err := fs.Parse(args); err != nil || *slicesPath == "" || *smiPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: gpu-check-compare --slices FILE --smi FILE [--lgipp FILE]")
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
