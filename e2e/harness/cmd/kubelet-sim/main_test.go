package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
)

// testPlugin is a minimal DRA plugin: registration + DRA v1 (+ v1beta1) on unix sockets.
type testPlugin struct {
	registerapi.UnimplementedRegistrationServer
	drav1.UnimplementedDRAPluginServer

	info     *registerapi.PluginInfo
	mu       sync.Mutex
	statuses []*registerapi.RegistrationStatus
	prepared []string // "v1:<uid>" / "v1beta1:<uid>"
	regSock  string
	// :authority of each call, by method ("GetInfo", "NodePrepareResources").
	authorities map[string]string
}

func (p *testPlugin) recordAuthority(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.authorities == nil {
		p.authorities = map[string]string{}
	}
	p.authorities[method] = strings.Join(md.Get(":authority"), ",")
}

func (p *testPlugin) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p.recordAuthority(ctx, "GetInfo")
	return p.info, nil
}

func (p *testPlugin) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.statuses = append(p.statuses, s)
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (p *testPlugin) NodePrepareResources(ctx context.Context, req *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	p.recordAuthority(ctx, "NodePrepareResources")
	resp := &drav1.NodePrepareResourcesResponse{Claims: map[string]*drav1.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		p.record("v1:" + c.Uid)
		if c.Name == "broken" {
			resp.Claims[c.Uid] = &drav1.NodePrepareResourceResponse{Error: "device gpu-9 is gone"}
			continue
		}
		if c.Name == "ignored" {
			continue // the plugin forgets this claim
		}
		resp.Claims[c.Uid] = &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{{
			RequestNames: []string{"gpu"}, PoolName: "node-a", DeviceName: "gpu-0",
			CdiDeviceIds: []string{"k8s.gpu.nvidia.com/claim=" + c.Uid + "-gpu-0"},
			ShareId:      ptr.To("0b3c1a52-5c43-4a8c-9b25-2b1b7b0a7c10"),
		}}}
	}
	return resp, nil
}

func (p *testPlugin) NodeUnprepareResources(_ context.Context, req *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	resp := &drav1.NodeUnprepareResourcesResponse{Claims: map[string]*drav1.NodeUnprepareResourceResponse{}}
	for _, c := range req.Claims {
		p.record("v1-unprepare:" + c.Uid)
		resp.Claims[c.Uid] = &drav1.NodeUnprepareResourceResponse{}
	}
	return resp, nil
}

func (p *testPlugin) record(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prepared = append(p.prepared, s)
}

// v1beta1Server serves the v1beta1 API (no share_id) for the same plugin.
type v1beta1Server struct {
	drav1beta1.UnimplementedDRAPluginServer
	p *testPlugin
}

func (s v1beta1Server) NodePrepareResources(_ context.Context, req *drav1beta1.NodePrepareResourcesRequest) (*drav1beta1.NodePrepareResourcesResponse, error) {
	resp := &drav1beta1.NodePrepareResourcesResponse{Claims: map[string]*drav1beta1.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		s.p.record("v1beta1:" + c.Uid)
		resp.Claims[c.Uid] = &drav1beta1.NodePrepareResourceResponse{Devices: []*drav1beta1.Device{{
			PoolName: "node-a", DeviceName: "gpu-1",
		}}}
	}
	return resp, nil
}

// startPlugin serves registration on <dir>/reg.sock and DRA on <dir>/dra.sock.
// versions nil → v1 and v1beta1 both advertised and served.
func startPlugin(t *testing.T, mutate func(info *registerapi.PluginInfo)) *testPlugin {
	t.Helper()
	// Short path: AF_UNIX paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "ksim")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &testPlugin{regSock: filepath.Join(dir, "reg.sock")}
	p.info = &registerapi.PluginInfo{
		Type:              registerapi.DRAPlugin,
		Name:              "gpu.nvidia.com",
		Endpoint:          filepath.Join(dir, "dra.sock"),
		SupportedVersions: []string{drav1.DRAPluginService, drav1beta1.DRAPluginService},
	}
	if mutate != nil {
		mutate(p.info)
	}
	serve := func(path string, register func(*grpc.Server)) {
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer()
		register(s)
		go s.Serve(l) //nolint:errcheck // ends with Stop
		t.Cleanup(s.Stop)
	}
	serve(p.regSock, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) })
	serve(filepath.Join(dir, "dra.sock"), func(s *grpc.Server) {
		drav1.RegisterDRAPluginServer(s, p)
		drav1beta1.RegisterDRAPluginServer(s, v1beta1Server{p: p})
	})
	return p
}

func runSim(t *testing.T, args ...string) (int, report, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	var rep report
	if stdout.Len() > 0 {
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("stdout is not one JSON document: %v\n%s", err, stdout.String())
		}
	}
	return code, rep, stderr.String()
}

func TestRegister(t *testing.T) {
	p := startPlugin(t, nil)
	code, rep, stderr := runSim(t, "--registration-socket", p.regSock, "--expect-name", "gpu.nvidia.com", "register")
	if code != 0 || !rep.OK || !rep.Registered {
		t.Fatalf("register failed: code %d, report %+v, stderr %s", code, rep, stderr)
	}
	if rep.Version != "v1.DRAPlugin" || rep.Endpoint != p.info.Endpoint || rep.HealthService != "" {
		t.Errorf("unexpected registration result %+v", rep)
	}
	if len(p.statuses) != 1 || !p.statuses[0].PluginRegistered {
		t.Errorf("plugin should have been told it is registered, got %v", p.statuses)
	}
}

// The kubelet's plugin watcher dials the bare socket path, so the registration server sees the
// percent-encoded path as :authority (what h2-based servers used to reject); the DRA manager
// dials "unix:<path>", which gives "localhost".
func TestDialsLikeTheKubelet(t *testing.T) {
	p := startPlugin(t, nil)
	code, _, stderr := runSim(t, "--registration-socket", p.regSock, "prepare", "--claim", "default/c/uid-1")
	if code != 0 {
		t.Fatalf("prepare failed: %s", stderr)
	}
	wantReg := strings.ReplaceAll(p.regSock, "/", "%2F")
	if got := p.authorities["GetInfo"]; got != wantReg {
		t.Errorf("registration :authority = %q, want the percent-encoded socket path %q", got, wantReg)
	}
	if got := p.authorities["NodePrepareResources"]; got != "localhost" {
		t.Errorf("DRA :authority = %q, want localhost", got)
	}
}

func TestRegisterPicksFirstSupportedOfPluginList(t *testing.T) {
	p := startPlugin(t, func(info *registerapi.PluginInfo) {
		info.SupportedVersions = []string{"v2.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}
	})
	code, rep, stderr := runSim(t, "--registration-socket", p.regSock, "register")
	if code != 0 {
		t.Fatalf("register failed: %s", stderr)
	}
	if rep.Version != "v1beta1.DRAPlugin" || rep.HealthService != "v1.DRAResourceHealth" {
		t.Errorf("kubelet picks the first supported entry of the plugin's list: got %q / health %q", rep.Version, rep.HealthService)
	}
}

func TestRegisterRejectsUnsupportedVersion(t *testing.T) {
	p := startPlugin(t, func(info *registerapi.PluginInfo) { info.SupportedVersions = []string{"v9.DRAPlugin"} })
	code, rep, stderr := runSim(t, "--registration-socket", p.regSock, "register")
	if code == 0 || rep.OK {
		t.Fatalf("expected failure, got code %d report %+v", code, rep)
	}
	for _, want := range []string{"v9.DRAPlugin", "none of services supported by the plugin", "v1.DRAPlugin"} {
		if !strings.Contains(stderr, want) || !strings.Contains(rep.Error, want) {
			t.Errorf("error should mention %q; stderr: %s", want, stderr)
		}
	}
	if len(p.statuses) != 1 || p.statuses[0].PluginRegistered || !strings.Contains(p.statuses[0].Error, "v9.DRAPlugin") {
		t.Errorf("plugin should get NotifyRegistrationStatus(false, error), got %v", p.statuses)
	}
}

func TestRegisterRejectsBadInfo(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*registerapi.PluginInfo)
		args   []string
		want   string
	}{
		"wrong type":    {mutate: func(i *registerapi.PluginInfo) { i.Type = "CSIPlugin" }, want: "no handler registered for plugin type: CSIPlugin"},
		"empty name":    {mutate: func(i *registerapi.PluginInfo) { i.Name = "" }, want: "empty driver name"},
		"name mismatch": {args: []string{"--expect-name", "other.example.com"}, want: `expected "other.example.com"`},
		"no endpoint":   {mutate: func(i *registerapi.PluginInfo) { i.Endpoint += ".missing" }, want: "dra.sock.missing: no such file"},
		"no versions":   {mutate: func(i *registerapi.PluginInfo) { i.SupportedVersions = nil }, want: "empty list of supported gRPC services"},
	} {
		t.Run(name, func(t *testing.T) {
			p := startPlugin(t, tc.mutate)
			code, _, stderr := runSim(t, append([]string{"--registration-socket", p.regSock, "register"}, tc.args...)...)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Errorf("want exit 1 and %q, got %d: %s", tc.want, code, stderr)
			}
		})
	}
}

func TestMissingRegistrationSocket(t *testing.T) {
	code, _, stderr := runSim(t, "--registration-socket", filepath.Join(t.TempDir(), "nope.sock"), "register")
	if code != 1 || !strings.Contains(stderr, "no such file") {
		t.Errorf("got %d: %s", code, stderr)
	}
}

func TestPrepareUnprepareV1(t *testing.T) {
	p := startPlugin(t, nil)
	code, rep, stderr := runSim(t, "--registration-socket", p.regSock, "prepare", "--register",
		"--claim", "default/ok/uid-1", "--claim", "default/broken/uid-2", "--claim", "ns2/ignored/uid-3")
	if code != 0 || !rep.OK {
		t.Fatalf("prepare failed (%d): %s", code, stderr)
	}
	if rep.API != "v1" || len(rep.Claims) != 3 || len(p.statuses) != 1 {
		t.Fatalf("unexpected report %+v (statuses %v)", rep, p.statuses)
	}
	ok, broken, ignored := rep.Claims[0], rep.Claims[1], rep.Claims[2]
	if ok.UID != "uid-1" || len(ok.Devices) != 1 || ok.Error != "" {
		t.Fatalf("claim ok: %+v", ok)
	}
	d := ok.Devices[0]
	if d.PoolName != "node-a" || d.DeviceName != "gpu-0" || d.RequestNames[0] != "gpu" ||
		d.CDIDeviceIDs[0] != "k8s.gpu.nvidia.com/claim=uid-1-gpu-0" || d.ShareID == nil {
		t.Errorf("device: %+v", d)
	}
	if broken.Error != "device gpu-9 is gone" || broken.Missing {
		t.Errorf("claim broken: %+v", broken)
	}
	if !ignored.Missing {
		t.Errorf("claim ignored should be flagged missing: %+v", ignored)
	}

	code, rep, stderr = runSim(t, "--registration-socket", p.regSock, "unprepare", "--claim", "default/ok/uid-1")
	if code != 0 || len(rep.Claims) != 1 || rep.Claims[0].Error != "" || rep.Claims[0].Missing {
		t.Fatalf("unprepare (%d): %+v %s", code, rep, stderr)
	}
	if want := []string{"v1:uid-1", "v1:uid-2", "v1:uid-3", "v1-unprepare:uid-1"}; strings.Join(p.prepared, ",") != strings.Join(want, ",") {
		t.Errorf("plugin saw %v, want %v", p.prepared, want)
	}
}

func TestPrepareForcedV1beta1(t *testing.T) {
	p := startPlugin(t, nil)
	code, rep, stderr := runSim(t, "--registration-socket", p.regSock, "--api", "v1beta1", "prepare", "--claim", "default/c/uid-9")
	if code != 0 || rep.API != "v1beta1" || rep.Version != "v1.DRAPlugin" {
		t.Fatalf("(%d) %+v %s", code, rep, stderr)
	}
	if d := rep.Claims[0].Devices[0]; d.DeviceName != "gpu-1" || d.ShareID != nil {
		t.Errorf("v1beta1 device: %+v", d)
	}
	if len(p.statuses) != 0 {
		t.Errorf("prepare without --register must not notify, got %v", p.statuses)
	}
}

func TestPrepareTransportFailure(t *testing.T) {
	// An empty endpoint makes the kubelet use the registration socket for DRA calls; this
	// plugin serves no DRA service there, so the RPC fails with Unimplemented.
	p := startPlugin(t, func(i *registerapi.PluginInfo) { i.Endpoint = "" })
	code, rep, stderr := runSim(t, "--registration-socket", p.regSock, "prepare", "--claim", "default/c/uid-1")
	if code != 1 || rep.OK || !strings.Contains(stderr, "Unimplemented") {
		t.Errorf("want transport failure, got %d %+v: %s", code, rep, stderr)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"register"},
		{"--registration-socket", "x", "prepare"},
		{"--registration-socket", "x", "frobnicate"},
		{"--registration-socket", "x", "--api", "v2", "prepare", "--claim", "a/b/c"},
		{"--registration-socket", "x", "prepare", "--claim", "a/b"},
	} {
		if code, _, _ := runSim(t, args...); code != 2 {
			t.Errorf("%v: want exit 2, got %d", args, code)
		}
	}
}
