package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	healthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
)

// testPlugin is a minimal DRA plugin: registration + DRA v1 (+ v1beta1) on unix sockets, plus
// the device health services (v1, v1alpha1) that its registration info lists.
type testPlugin struct {
	registerapi.UnimplementedRegistrationServer
	drav1.UnimplementedDRAPluginServer

	info     *registerapi.PluginInfo
	mu       sync.Mutex
	statuses []*registerapi.RegistrationStatus
	prepared []string // "v1:<uid>" / "v1beta1:<uid>"
	regSock  string
	// :authority of each call, by method ("GetInfo", "NodePrepareResources", "NodeWatchResources").
	authorities map[string]string
	// health feeds the health stream: each message is sent as it arrives; closing the channel
	// ends the stream with healthErr (nil: a clean end, EOF for the client).
	health    chan *healthv1.NodeWatchResourcesResponse
	healthErr error
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

// watchHealth serves one NodeWatchResources stream from p.health; version is recorded.
func (p *testPlugin) watchHealth(ctx context.Context, version string, send func(*healthv1.NodeWatchResourcesResponse) error) error {
	p.recordAuthority(ctx, "NodeWatchResources")
	p.record("health-" + version)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-p.health:
			if !ok {
				p.mu.Lock()
				defer p.mu.Unlock()
				return p.healthErr
			}
			if err := send(m); err != nil {
				return err
			}
		}
	}
}

func (p *testPlugin) endHealth(err error) {
	p.mu.Lock()
	p.healthErr = err
	p.mu.Unlock()
	close(p.health)
}

type healthV1Server struct {
	healthv1.UnimplementedDRAResourceHealthServer
	p *testPlugin
}

func (s healthV1Server) NodeWatchResources(_ *healthv1.NodeWatchResourcesRequest, stream healthv1.DRAResourceHealth_NodeWatchResourcesServer) error {
	return s.p.watchHealth(stream.Context(), "v1", stream.Send)
}

// healthV1alpha1Server serves v1alpha1 natively (no v1 wrapper), like a driver built before v1.
type healthV1alpha1Server struct {
	healthv1alpha1.UnimplementedDRAResourceHealthServer
	p *testPlugin
}

func (s healthV1alpha1Server) NodeWatchResources(_ *healthv1alpha1.NodeWatchResourcesRequest, stream healthv1alpha1.DRAResourceHealth_NodeWatchResourcesServer) error {
	return s.p.watchHealth(stream.Context(), "v1alpha1", func(m *healthv1.NodeWatchResourcesResponse) error {
		out := &healthv1alpha1.NodeWatchResourcesResponse{}
		for _, d := range m.Devices {
			out.Devices = append(out.Devices, &healthv1alpha1.DeviceHealth{
				Device:          &healthv1alpha1.DeviceIdentifier{PoolName: d.Device.PoolName, DeviceName: d.Device.DeviceName},
				Health:          healthv1alpha1.HealthStatus(d.Health),
				LastUpdatedTime: d.LastUpdatedTime, HealthCheckTimeoutSeconds: d.HealthCheckTimeoutSeconds, Message: d.Message,
			})
		}
		return stream.Send(out)
	})
}

// startPlugin serves registration on <dir>/reg.sock and DRA on <dir>/dra.sock.
// By default v1 and v1beta1 are both advertised and served, and no health service; a health
// service (v1.DRAResourceHealth, v1alpha1.DRAResourceHealth) is served when mutate lists it.
func startPlugin(t *testing.T, mutate func(info *registerapi.PluginInfo)) *testPlugin {
	t.Helper()
	// Short path: AF_UNIX paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "ksim")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &testPlugin{regSock: filepath.Join(dir, "reg.sock"), health: make(chan *healthv1.NodeWatchResourcesResponse, 16)}
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
		if slices.Contains(p.info.SupportedVersions, healthv1.DRAResourceHealthService) {
			healthv1.RegisterDRAResourceHealthServer(s, healthV1Server{p: p})
		}
		if slices.Contains(p.info.SupportedVersions, healthv1alpha1.DRAResourceHealthService) {
			healthv1alpha1.RegisterDRAResourceHealthServer(s, healthV1alpha1Server{p: p})
		}
	})
	return p
}

// withHealth returns a startPlugin mutation that appends health services to the plugin's list.
func withHealth(services ...string) func(*registerapi.PluginInfo) {
	return func(info *registerapi.PluginInfo) {
		info.SupportedVersions = append(info.SupportedVersions, services...)
	}
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

func TestCycleTimesEveryCallAndStopsAtAClaimError(t *testing.T) {
	p := startPlugin(t, nil)
	code, rep, stderr := runSim(t, "--registration-socket", p.regSock, "cycle", "--rounds", "3", "--claim", "default/ok/uid-1")
	if code != 0 || !rep.OK || len(rep.PrepareMs) != 3 || len(rep.UnprepareMs) != 3 {
		t.Fatalf("cycle (%d): %+v %s", code, rep, stderr)
	}
	if want := "v1:uid-1,v1-unprepare:uid-1,v1:uid-1,v1-unprepare:uid-1,v1:uid-1,v1-unprepare:uid-1"; strings.Join(p.prepared, ",") != want {
		t.Errorf("plugin saw %v, want %s", p.prepared, want)
	}
	code, rep, stderr = runSim(t, "--registration-socket", p.regSock, "cycle", "--rounds", "5", "--claim", "default/broken/uid-2")
	if code != 1 || rep.OK || len(rep.PrepareMs) != 0 || !strings.Contains(stderr, "round 1: prepare") || !strings.Contains(stderr, "device gpu-9 is gone") {
		t.Errorf("a claim error must end the cycle: (%d) %+v %s", code, rep, stderr)
	}
	if code, _, _ := runSim(t, "--registration-socket", p.regSock, "cycle", "--rounds", "0", "--claim", "default/ok/uid-1"); code != 2 {
		t.Errorf("--rounds 0: exit %d, want 2", code)
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
		{"--registration-socket", "x", "watch", "--until", "gpu-0"},
		{"--registration-socket", "x", "watch", "--until", "gpu-0=Broken"},
		{"--registration-socket", "x", "watch", "--until", "/gpu-0=Healthy"},
		{"--registration-socket", "x", "watch", "--until", "n1/=Healthy"},
		{"--registration-socket", "x", "watch", "--until", "a=Healthy", "--until", "b=Healthy"},
		{"--registration-socket", "x", "watch", "--messages", "-1"},
		{"--registration-socket", "x", "watch", "--duration", "-1s"},
		{"--registration-socket", "x", "watch", "extra"},
	} {
		if code, _, _ := runSim(t, args...); code != 2 {
			t.Errorf("%v: want exit 2, got %d", args, code)
		}
	}
}

func healthMsg(devs ...*healthv1.DeviceHealth) *healthv1.NodeWatchResourcesResponse {
	return &healthv1.NodeWatchResourcesResponse{Devices: devs}
}

func devHealth(device string, h healthv1.HealthStatus, msg string) *healthv1.DeviceHealth {
	return &healthv1.DeviceHealth{
		Device: &healthv1.DeviceIdentifier{PoolName: "n1", DeviceName: device}, Health: h,
		Message: msg, LastUpdatedTime: 1700000000, HealthCheckTimeoutSeconds: 30,
	}
}

// runWatchSim runs a watch to its end; every stdout line must be one JSON object.
func runWatchSim(t *testing.T, args ...string) (int, []string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	var lines []string
	for l := range strings.SplitSeq(stdout.String(), "\n") {
		if l == "" {
			continue
		}
		var line healthLine
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("stdout line is not a JSON object: %v\n%s", err, l)
		}
		lines = append(lines, l)
	}
	if stdout.Len() > 0 && !strings.HasSuffix(stdout.String(), "\n") {
		t.Errorf("stdout does not end with a newline: %q", stdout.String())
	}
	return code, lines, stderr.String()
}

// The watch prints each message as one JSON line as soon as it arrives, and --until ends it
// (exit 0) on the message that shows the device with that health, though the stream goes on.
func TestWatchStreamsLinesUntilUnhealthy(t *testing.T) {
	p := startPlugin(t, withHealth(healthv1.DRAResourceHealthService, healthv1alpha1.DRAResourceHealthService))
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		code := run([]string{"--registration-socket", p.regSock, "watch", "--until", "gpu-0=Unhealthy"}, pw, &stderr)
		pw.Close()
		done <- code
	}()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("stdout closed early; stderr: %s", stderr.String())
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no line within 10s")
		}
		return ""
	}

	p.health <- healthMsg(devHealth("gpu-0", healthv1.HealthStatus_HEALTHY, "ok"), devHealth("gpu-1", healthv1.HealthStatus_HEALTHY, "ok"))
	if got, want := next(), `{"devices":[`+
		`{"pool":"n1","device":"gpu-0","health":"Healthy","message":"ok","lastUpdated":1700000000,"timeoutSeconds":30},`+
		`{"pool":"n1","device":"gpu-1","health":"Healthy","message":"ok","lastUpdated":1700000000,"timeoutSeconds":30}]}`; got != want {
		t.Errorf("line 1:\n got %s\nwant %s", got, want)
	}
	select {
	case code := <-done:
		t.Fatalf("watch ended (%d) before gpu-0 turned Unhealthy; stderr: %s", code, stderr.String())
	case <-time.After(100 * time.Millisecond):
	}
	// gpu-1 turning Unhealthy does not match; gpu-0 does; the last message is never read.
	p.health <- healthMsg(devHealth("gpu-1", healthv1.HealthStatus_UNHEALTHY, "XID 48"))
	p.health <- healthMsg(devHealth("gpu-1", healthv1.HealthStatus_UNHEALTHY, "XID 48"), devHealth("gpu-0", healthv1.HealthStatus_UNHEALTHY, "XID 79: fallen off the bus"))
	p.health <- healthMsg(devHealth("gpu-0", healthv1.HealthStatus_HEALTHY, "recovered"))
	next()
	if got := next(); !strings.Contains(got, `{"pool":"n1","device":"gpu-0","health":"Unhealthy","message":"XID 79: fallen off the bus","lastUpdated":1700000000,"timeoutSeconds":30}`) {
		t.Errorf("line 3 should show gpu-0 Unhealthy: %s", got)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("want exit 0 once gpu-0=Unhealthy was seen, got %d: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end after gpu-0=Unhealthy")
	}
	if l, ok := <-lines; ok {
		t.Errorf("unexpected line after the match: %s", l)
	}
	if !strings.Contains(stderr.String(), "v1.DRAResourceHealth") || !strings.Contains(stderr.String(), "message 3 shows gpu-0=Unhealthy") {
		t.Errorf("stderr should name the health service and the match: %s", stderr.String())
	}
	if !slices.Contains(p.prepared, "health-v1") || slices.Contains(p.prepared, "health-v1alpha1") {
		t.Errorf("both health services listed: the kubelet prefers v1, plugin saw %v", p.prepared)
	}
	if len(p.statuses) != 1 || !p.statuses[0].PluginRegistered {
		t.Errorf("watch registers first, got %v", p.statuses)
	}
	if got := p.authorities["NodeWatchResources"]; got != "localhost" {
		t.Errorf("health :authority = %q, want localhost", got)
	}
}

func TestWatchUsesV1alpha1WhenOnlyItIsListed(t *testing.T) {
	// The plugin lists (and serves) only v1alpha1: v1 would fail with Unimplemented.
	p := startPlugin(t, withHealth(healthv1alpha1.DRAResourceHealthService))
	p.health <- healthMsg(devHealth("gpu-3", healthv1.HealthStatus_UNHEALTHY, "ECC"))
	p.health <- healthMsg()
	code, lines, stderr := runWatchSim(t, "--registration-socket", p.regSock, "watch", "--messages", "2", "--until", "n1/gpu-3=healthy")
	if code != 0 {
		t.Fatalf("watch (%d): %s", code, stderr)
	}
	want := []string{
		`{"devices":[{"pool":"n1","device":"gpu-3","health":"Unhealthy","message":"ECC","lastUpdated":1700000000,"timeoutSeconds":30}]}`,
		`{"devices":[]}`,
	}
	if !slices.Equal(lines, want) {
		t.Errorf("lines:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if !slices.Equal(p.prepared, []string{"health-v1alpha1"}) || !strings.Contains(stderr, "v1alpha1.DRAResourceHealth") {
		t.Errorf("want the v1alpha1 health service, plugin saw %v; stderr %s", p.prepared, stderr)
	}
}

func TestWatchWithoutHealthService(t *testing.T) {
	p := startPlugin(t, nil)
	code, lines, stderr := runWatchSim(t, "--registration-socket", p.regSock, "watch", "--until", "gpu-0=Unhealthy")
	if code != 1 || len(lines) != 0 {
		t.Fatalf("want exit 1 and no output, got %d %v", code, lines)
	}
	for _, want := range []string{"watch failed", "gpu.nvidia.com does not advertise a device health service", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr should mention %q: %s", want, stderr)
		}
	}
	if len(p.prepared) != 0 {
		t.Errorf("no health stream should have been opened: %v", p.prepared)
	}
}

func TestWatchStreamEndsBeforeCondition(t *testing.T) {
	for name, tc := range map[string]struct {
		end  error
		want string
	}{
		"eof":   {want: "ended by the plugin (EOF) after 1 message(s), before gpu-0=Unhealthy was seen"},
		"error": {end: status.Error(codes.Internal, "NVML went away"), want: "failed after 1 message(s): rpc error: code = Internal desc = NVML went away, before gpu-0=Unhealthy"},
	} {
		t.Run(name, func(t *testing.T) {
			p := startPlugin(t, withHealth(healthv1.DRAResourceHealthService))
			p.health <- healthMsg(devHealth("gpu-0", healthv1.HealthStatus_HEALTHY, ""))
			p.endHealth(tc.end)
			code, lines, stderr := runWatchSim(t, "--registration-socket", p.regSock, "watch", "--until", "gpu-0=Unhealthy", "--duration", "10s")
			if code != 1 || len(lines) != 1 || !strings.Contains(stderr, tc.want) {
				t.Errorf("want exit 1, 1 line and %q; got %d, %v: %s", tc.want, code, lines, stderr)
			}
		})
	}
}

func TestWatchDuration(t *testing.T) {
	p := startPlugin(t, withHealth(healthv1.DRAResourceHealthService))
	p.health <- healthMsg(devHealth("gpu-0", healthv1.HealthStatus_UNKNOWN, "no data yet"))
	start := time.Now()
	code, lines, stderr := runWatchSim(t, "--registration-socket", p.regSock, "watch", "--duration", "300ms")
	if code != 0 || len(lines) != 1 || !strings.Contains(lines[0], `"health":"Unknown"`) || !strings.Contains(stderr, "--duration 300ms elapsed, 1 message(s)") {
		t.Errorf("--duration alone: want exit 0 after the line, got %d %v: %s", code, lines, stderr)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Errorf("stopped after %s, before --duration", el)
	}

	// With a condition, --duration is a deadline.
	code, lines, stderr = runWatchSim(t, "--registration-socket", p.regSock, "watch", "--duration", "300ms", "--until", "gpu-0=Unhealthy")
	if code != 1 || len(lines) != 0 || !strings.Contains(stderr, "gpu-0=Unhealthy not seen within --duration 300ms (0 message(s) received)") {
		t.Errorf("--until not met within --duration: want exit 1, got %d %v: %s", code, lines, stderr)
	}
}

func TestUntilFlag(t *testing.T) {
	for in, want := range map[string]untilCond{
		"gpu-0=Unhealthy":                      {Device: "gpu-0", Health: healthv1.HealthStatus_UNHEALTHY},
		"n1/gpu-0=healthy":                     {Pool: "n1", Device: "gpu-0", Health: healthv1.HealthStatus_HEALTHY},
		"example.com/n1/gpu-0=UNKNOWN":         {Pool: "example.com/n1", Device: "gpu-0", Health: healthv1.HealthStatus_UNKNOWN},
		"node-a/gpu-0-mig-1g.10gb-0=Unhealthy": {Pool: "node-a", Device: "gpu-0-mig-1g.10gb-0", Health: healthv1.HealthStatus_UNHEALTHY},
	} {
		var u untilFlag
		if err := u.Set(in); err != nil || *u.cond != want {
			t.Errorf("%s: got %+v, %v; want %+v", in, u.cond, err, want)
		}
	}
}
