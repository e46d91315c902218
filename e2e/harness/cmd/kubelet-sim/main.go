// kubelet-sim plays the kubelet's side of the DRA plugin protocol against a real plugin, on the
// upstream k8s.io/kubelet gRPC stubs (pluginregistration/v1, dra/v1, dra/v1beta1,
// dra-health/v1, dra-health/v1alpha1).
//
// Usage:
//
//	kubelet-sim --registration-socket PATH [--expect-name NAME] [--timeout 10s] register
//	kubelet-sim --registration-socket PATH ... prepare   --claim ns/name/uid [--claim ...] [--api v1|v1beta1] [--register]
//	kubelet-sim --registration-socket PATH ... unprepare --claim ns/name/uid [--claim ...] [--api v1|v1beta1] [--register]
//	kubelet-sim --registration-socket PATH ... watch     [--until [POOL/]DEVICE=STATUS] [--messages N] [--duration D]
//
// Flags may also follow the subcommand.
//
// Every operation first does what the kubelet plugin watcher does on a new socket: dial the
// registration socket, GetInfo, and validate the answer like the kubelet's DRA handler: type
// must be "DRAPlugin", the name non-empty (and equal to --expect-name when given), the
// endpoint (the registration socket itself when empty) an existing unix socket, and
// supported_versions must contain a DRA service the kubelet supports; the FIRST entry of the
// plugin's list that the kubelet supports (v1.DRAPlugin, v1beta1.DRAPlugin) is chosen. The
// health service is picked as the 1.37 kubelet does (v1.DRAResourceHealth, else v1alpha1).
//
// register: then calls NotifyRegistrationStatus(plugin_registered=true); on a validation
// failure it calls NotifyRegistrationStatus(false, error) as the kubelet does and exits 1.
// prepare/unprepare: call NodePrepareResources/NodeUnprepareResources on the endpoint with the
// chosen version (or --api); --register also sends NotifyRegistrationStatus(true) first.
// watch: sends NotifyRegistrationStatus(true), then opens the device health stream as the 1.37
// kubelet does: NodeWatchResources on the endpoint with the health service chosen at
// registration (v1.DRAResourceHealth when the plugin lists it, else v1alpha1.DRAResourceHealth
// read through the upstream v1 conversion wrapper); it fails when the plugin lists neither.
// It stops with exit 0 once a message shows --until's device with that health (STATUS:
// Unknown, Healthy or Unhealthy, case-insensitive; without POOL/ any pool matches), after
// --messages N messages, or when --duration D has elapsed; with --until or --messages,
// --duration is a deadline instead and elapsing is a failure. A stream error or end (EOF)
// before that is a failure (exit 1); with none of the three flags it runs until the stream ends.
//
// Output of register/prepare/unprepare: one JSON document on stdout (also on failure, with
// "ok": false and "error").
// For prepare/unprepare, "claims" lists each requested claim in order with the plugin's
// per-claim answer (devices: request_names, pool_name, device_name, cdi_device_ids, share_id;
// error); "missing": true marks a claim the response did not mention (the kubelet treats that
// as a failure), "unexpected_claims" lists UIDs in the response that were not requested.
// Output of watch: one JSON line per stream message on stdout, written as it arrives:
//
//	{"devices":[{"pool":"n1","device":"gpu-0","health":"Healthy","message":"...","lastUpdated":1700000000,"timeoutSeconds":30}]}
//
// (health: Unknown | Healthy | Unhealthy; lastUpdated: the message's last_updated_time, unix
// seconds; timeoutSeconds: health_check_timeout_seconds). Nothing else goes to stdout; the chosen
// health service, why the watch stopped, and errors go to stderr.
// Exit status: 0 when the RPCs succeeded (even if a claim carries an error), 1 on a
// registration/validation/transport failure (watch: also a stream error or end, or a condition
// not met within --duration), 2 on bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	healthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Same lists, same order as pkg/kubelet/cm/dra/plugin/dra_plugin.go in Kubernetes 1.37.
var (
	servicesSupportedByKubelet       = []string{drav1.DRAPluginService, drav1beta1.DRAPluginService}
	healthServicesSupportedByKubelet = []string{healthv1.DRAResourceHealthService, healthv1alpha1.DRAResourceHealthService}
)

type claimRef struct{ Namespace, Name, UID string }

type claimFlags []claimRef

func (c *claimFlags) String() string { return fmt.Sprint(*c) }

func (c *claimFlags) Set(v string) error {
	parts := strings.Split(v, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return fmt.Errorf("want namespace/name/uid, got %q", v)
	}
	*c = append(*c, claimRef{parts[0], parts[1], parts[2]})
	return nil
}

type deviceOut struct {
	RequestNames []string `json:"request_names"`
	PoolName     string   `json:"pool_name"`
	DeviceName   string   `json:"device_name"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
	ShareID      *string  `json:"share_id"` // null when absent (always absent in v1beta1)
}

type claimOut struct {
	Namespace string      `json:"namespace"`
	Name      string      `json:"name"`
	UID       string      `json:"uid"`
	Devices   []deviceOut `json:"devices,omitempty"`
	Error     string      `json:"error"`
	Missing   bool        `json:"missing,omitempty"`
}

type report struct {
	OK                bool       `json:"ok"`
	Operation         string     `json:"operation"`
	Error             string     `json:"error,omitempty"`
	Type              string     `json:"type,omitempty"`
	Name              string     `json:"name,omitempty"`
	Endpoint          string     `json:"endpoint,omitempty"`
	SupportedVersions []string   `json:"supported_versions,omitempty"`
	Version           string     `json:"version,omitempty"` // chosen DRA service, e.g. "v1.DRAPlugin"
	HealthService     string     `json:"health_service,omitempty"`
	API               string     `json:"api,omitempty"` // API used for prepare/unprepare: v1 | v1beta1
	Registered        bool       `json:"registered,omitempty"`
	Claims            []claimOut `json:"claims,omitempty"`
	UnexpectedClaims  []string   `json:"unexpected_claims,omitempty"`
	// cycle: each round's NodePrepareResources and NodeUnprepareResources call, in milliseconds.
	PrepareMs   []float64 `json:"prepare_ms,omitempty"`
	UnprepareMs []float64 `json:"unprepare_ms,omitempty"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kubelet-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	regSocket := fs.String("registration-socket", "", "plugin registration socket (required)")
	expectName := fs.String("expect-name", "", "fail unless the plugin's name is this")
	timeout := fs.Duration("timeout", 10*time.Second, "timeout of each gRPC call (kubelet: 1s GetInfo, 45s DRA calls)")
	var claims claimFlags
	fs.Var(&claims, "claim", "namespace/name/uid of a claim (repeatable; prepare/unprepare)")
	api := fs.String("api", "", "force the DRA API version for prepare/unprepare: v1 | v1beta1 (default: the one registration chose)")
	alsoRegister := fs.Bool("register", false, "prepare/unprepare: send NotifyRegistrationStatus(true) first")
	var until untilFlag
	fs.Var(&until, "until", "watch: exit 0 once a message shows this device with this health, `[POOL/]DEVICE=STATUS` (STATUS: Unknown|Healthy|Unhealthy)")
	messages := fs.Int("messages", 0, "watch: exit 0 after this many stream messages (0: no limit)")
	duration := fs.Duration("duration", 0, "watch: stop after this long, exit 0 (a deadline, exit 1, with --until or --messages; 0: none)")
	rounds := fs.Int("rounds", 1, "cycle: how many prepare+unprepare rounds of all claims (one call each), on one connection")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kubelet-sim --registration-socket PATH [flags] register|prepare|unprepare|cycle|watch [flags]")
		fs.PrintDefaults()
	}
	// Global flags, the subcommand, then the rest (flags may appear on either side).
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	op := fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kubelet-sim: unexpected arguments %q\n", fs.Args())
		return 2
	}
	switch op {
	case "register":
	case "prepare", "unprepare", "cycle":
		if *rounds < 1 {
			fmt.Fprintln(stderr, "kubelet-sim: --rounds must be at least 1")
			return 2
		}
		if len(claims) == 0 {
			fmt.Fprintf(stderr, "kubelet-sim: %s needs at least one --claim namespace/name/uid\n", op)
			return 2
		}
	case "watch":
		if *messages < 0 || *duration < 0 {
			fmt.Fprintln(stderr, "kubelet-sim: --messages and --duration must not be negative")
			return 2
		}
	default:
		fmt.Fprintf(stderr, "kubelet-sim: unknown operation %q (want register, prepare, unprepare, cycle or watch)\n", op)
		return 2
	}
	if *regSocket == "" {
		fmt.Fprintln(stderr, "kubelet-sim: --registration-socket is required")
		return 2
	}
	if *api != "" && *api != "v1" && *api != "v1beta1" {
		fmt.Fprintf(stderr, "kubelet-sim: --api must be v1 or v1beta1, got %q\n", *api)
		return 2
	}

	if op == "watch" {
		w := watchOpts{until: until.cond, messages: *messages, duration: *duration}
		if err := runWatch(*regSocket, *expectName, *timeout, w, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "kubelet-sim: watch failed: %v\n", err)
			return 1
		}
		return 0
	}

	rep := &report{Operation: op}
	err := execute(rep, *regSocket, *expectName, *timeout, op, claims, *api, *alsoRegister || op == "register", *rounds)
	if err != nil {
		rep.OK, rep.Error = false, err.Error()
		fmt.Fprintf(stderr, "kubelet-sim: %s failed: %v\n", op, err)
	} else {
		rep.OK = true
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if encErr := enc.Encode(rep); encErr != nil {
		fmt.Fprintf(stderr, "kubelet-sim: write output: %v\n", encErr)
		return 1
	}
	if err != nil {
		return 1
	}
	return 0
}

// dialDRA dials a DRA or health endpoint as the kubelet's DRA plugin manager does
// (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go): target "unix:<endpoint>", so gRPC sends
// ":authority: localhost".
func dialDRA(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// dialRegistration dials the registration socket exactly as the kubelet's plugin watcher does
// (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go, func dial): the bare
// socket path as the target with a unix context dialer. gRPC then sends the percent-encoded
// path ("%2Fvar%2Flib%2F...") as ":authority", which a server must accept.
func dialRegistration(ctx context.Context, path string, timeout time.Duration) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	//nolint:staticcheck // DialContext with WithBlock is what the kubelet calls.
	return grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
}

func execute(rep *report, regSocket, expectName string, timeout time.Duration, op string, claims []claimRef, api string, notify bool, rounds int) error {
	if err := registerPlugin(rep, regSocket, expectName, timeout, notify); err != nil {
		return err
	}
	if op == "register" {
		return nil
	}

	if api == "" {
		api = strings.TrimSuffix(rep.Version, ".DRAPlugin")
	}
	rep.API = api
	draConn, err := dialDRA(rep.Endpoint)
	if err != nil {
		return fmt.Errorf("dial DRA endpoint %s: %w", rep.Endpoint, err)
	}
	defer draConn.Close()
	if op == "cycle" {
		return cycle(rep, draConn, api, claims, timeout, rounds)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	switch op {
	case "prepare":
		return prepare(ctx, rep, draConn, api, claims)
	default:
		return unprepare(ctx, rep, draConn, api, claims)
	}
}

// cycle prepares and unprepares the claims `rounds` times (each a call with every claim, as the
// kubelet sends a pod's claims), timing each call; the first error (a call's, or a claim's)
// ends it. rep.Claims holds the last round's answers.
func cycle(rep *report, conn *grpc.ClientConn, api string, claims []claimRef, timeout time.Duration, rounds int) error {
	call := func(f func(context.Context, *report, *grpc.ClientConn, string, []claimRef) error) (float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		rep.Claims, rep.UnexpectedClaims = nil, nil
		start := time.Now()
		err := f(ctx, rep, conn, api, claims)
		ms := float64(time.Since(start).Microseconds()) / 1000
		if err == nil {
			for _, c := range rep.Claims {
				if c.Error != "" || c.Missing {
					return ms, fmt.Errorf("claim %s/%s: %q (missing: %v)", c.Namespace, c.Name, c.Error, c.Missing)
				}
			}
		}
		return ms, err
	}
	for i := 0; i < rounds; i++ {
		ms, err := call(prepare)
		if err != nil {
			return fmt.Errorf("round %d: prepare: %w", i+1, err)
		}
		rep.PrepareMs = append(rep.PrepareMs, ms)
		ms, err = call(unprepare)
		if err != nil {
			return fmt.Errorf("round %d: unprepare: %w", i+1, err)
		}
		rep.UnprepareMs = append(rep.UnprepareMs, ms)
	}
	return nil
}

// registerPlugin does what the kubelet's plugin watcher and DRA handler do with a new
// registration socket: GetInfo, validate (NotifyRegistrationStatus(false, error) on failure)
// and, when notify is set, NotifyRegistrationStatus(true). It fills rep from the answer.
func registerPlugin(rep *report, regSocket, expectName string, timeout time.Duration, notify bool) error {
	if err := checkSocket(regSocket); err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	conn, err := dialRegistration(context.Background(), regSocket, timeout)
	if err != nil {
		return fmt.Errorf("dial registration socket %s: %w", regSocket, err)
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("GetInfo on %s: %w", regSocket, err)
	}
	rep.Type, rep.Name, rep.Endpoint, rep.SupportedVersions = info.Type, info.Name, info.Endpoint, info.SupportedVersions
	if rep.Endpoint == "" {
		rep.Endpoint = regSocket // kubelet: an empty endpoint means the registration socket itself
	}

	if verr := validate(rep, regSocket, expectName); verr != nil {
		// The kubelet reports validation failures back to the plugin before giving up.
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if _, nerr := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{
			PluginRegistered: false,
			Error:            "RegisterPlugin error -- plugin validation failed with err: " + verr.Error(),
		}); nerr != nil {
			return fmt.Errorf("%w (and NotifyRegistrationStatus(false) failed: %v)", verr, nerr)
		}
		return verr
	}

	if notify {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
		cancel()
		if err != nil {
			return fmt.Errorf("NotifyRegistrationStatus(true): %w", err)
		}
		rep.Registered = true
	}
	return nil
}

// validate mirrors the kubelet: operation_generator.go (type → handler) and
// DRAPluginManager.ValidatePlugin/validateSupportedServices, plus checks the endpoint exists.
func validate(rep *report, regSocket, expectName string) error {
	if rep.Type != registerapi.DRAPlugin {
		return fmt.Errorf("RegisterPlugin error -- no handler registered for plugin type: %s at socket %s (want %q)", rep.Type, regSocket, registerapi.DRAPlugin)
	}
	if rep.Name == "" {
		return errors.New("plugin returned an empty driver name")
	}
	if expectName != "" && rep.Name != expectName {
		return fmt.Errorf("plugin name is %q, expected %q", rep.Name, expectName)
	}
	if len(rep.SupportedVersions) == 0 {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: empty list of supported gRPC services (aka supported versions)", rep.Name, rep.Endpoint)
	}
	for _, s := range rep.SupportedVersions {
		if slices.Contains(servicesSupportedByKubelet, s) {
			rep.Version = s
			break
		}
	}
	if rep.Version == "" {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: none of services supported by the plugin (%q) are supported by the kubelet (%q)", rep.Name, rep.Endpoint, rep.SupportedVersions, servicesSupportedByKubelet)
	}
	for _, s := range healthServicesSupportedByKubelet {
		if slices.Contains(rep.SupportedVersions, s) {
			rep.HealthService = s
			break
		}
	}
	if err := checkSocket(rep.Endpoint); err != nil {
		return fmt.Errorf("DRA endpoint of plugin %s: %w", rep.Name, err)
	}
	return nil
}

func checkSocket(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s is not a unix socket (mode %s)", path, st.Mode())
	}
	return nil
}

func prepare(ctx context.Context, rep *report, conn *grpc.ClientConn, api string, claims []claimRef) error {
	answers := map[string]claimOut{}
	switch api {
	case "v1":
		req := &drav1.NodePrepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, &drav1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
		}
		resp, err := drav1.NewDRAPluginClient(conn).NodePrepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("NodePrepareResources (v1): %w", err)
		}
		for uid, r := range resp.GetClaims() {
			out := claimOut{Error: r.GetError()}
			for _, d := range r.GetDevices() {
				out.Devices = append(out.Devices, deviceOut{
					RequestNames: nonNil(d.GetRequestNames()), PoolName: d.GetPoolName(), DeviceName: d.GetDeviceName(),
					CDIDeviceIDs: nonNil(d.GetCdiDeviceIds()), ShareID: d.ShareId,
				})
			}
			answers[uid] = out
		}
	case "v1beta1":
		req := &drav1beta1.NodePrepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
		}
		resp, err := drav1beta1.NewDRAPluginClient(conn).NodePrepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("NodePrepareResources (v1beta1): %w", err)
		}
		for uid, r := range resp.GetClaims() {
			out := claimOut{Error: r.GetError()}
			for _, d := range r.GetDevices() {
				out.Devices = append(out.Devices, deviceOut{
					RequestNames: nonNil(d.GetRequestNames()), PoolName: d.GetPoolName(), DeviceName: d.GetDeviceName(),
					CDIDeviceIDs: nonNil(d.GetCdiDeviceIds()),
				})
			}
			answers[uid] = out
		}
	}
	collect(rep, claims, answers)
	return nil
}

func unprepare(ctx context.Context, rep *report, conn *grpc.ClientConn, api string, claims []claimRef) error {
	answers := map[string]claimOut{}
	switch api {
	case "v1":
		req := &drav1.NodeUnprepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, &drav1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
		}
		resp, err := drav1.NewDRAPluginClient(conn).NodeUnprepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("NodeUnprepareResources (v1): %w", err)
		}
		for uid, r := range resp.GetClaims() {
			answers[uid] = claimOut{Error: r.GetError()}
		}
	case "v1beta1":
		req := &drav1beta1.NodeUnprepareResourcesRequest{}
		for _, c := range claims {
			req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
		}
		resp, err := drav1beta1.NewDRAPluginClient(conn).NodeUnprepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("NodeUnprepareResources (v1beta1): %w", err)
		}
		for uid, r := range resp.GetClaims() {
			answers[uid] = claimOut{Error: r.GetError()}
		}
	}
	collect(rep, claims, answers)
	return nil
}

// collect orders the per-UID answers like the request and flags missing/unexpected UIDs.
func collect(rep *report, claims []claimRef, answers map[string]claimOut) {
	for _, c := range claims {
		out, ok := answers[c.UID]
		out.Namespace, out.Name, out.UID, out.Missing = c.Namespace, c.Name, c.UID, !ok
		delete(answers, c.UID)
		rep.Claims = append(rep.Claims, out)
	}
	for uid := range answers {
		rep.UnexpectedClaims = append(rep.UnexpectedClaims, uid)
	}
	slices.Sort(rep.UnexpectedClaims)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// untilCond is watch's --until: a message that shows Device (in Pool, any pool when "") with
// this health ends the watch successfully.
type untilCond struct {
	Pool, Device string
	Health       healthv1.HealthStatus
}

func (c untilCond) String() string {
	if c.Pool == "" {
		return c.Device + "=" + healthName(c.Health)
	}
	return c.Pool + "/" + c.Device + "=" + healthName(c.Health)
}

type untilFlag struct{ cond *untilCond }

func (u *untilFlag) String() string {
	if u == nil || u.cond == nil {
		return ""
	}
	return u.cond.String()
}

func (u *untilFlag) Set(v string) error {
	if u.cond != nil {
		return fmt.Errorf("only one --until is supported (already %s)", u.cond)
	}
	dev, status, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want [POOL/]DEVICE=STATUS, got %q", v)
	}
	c := untilCond{Device: dev}
	// Device names are DNS labels; pool names may contain slashes: split at the last one.
	if i := strings.LastIndex(dev, "/"); i >= 0 {
		c.Pool, c.Device = dev[:i], dev[i+1:]
		if c.Pool == "" {
			return fmt.Errorf("empty pool in %q", v)
		}
	}
	if c.Device == "" {
		return fmt.Errorf("empty device in %q", v)
	}
	found := false
	for _, h := range []healthv1.HealthStatus{healthv1.HealthStatus_UNKNOWN, healthv1.HealthStatus_HEALTHY, healthv1.HealthStatus_UNHEALTHY} {
		if strings.EqualFold(status, healthName(h)) {
			c.Health, found = h, true
		}
	}
	if !found {
		return fmt.Errorf("health must be Unknown, Healthy or Unhealthy, got %q", status)
	}
	u.cond = &c
	return nil
}

func (c *untilCond) matches(d *healthv1.DeviceHealth) bool {
	return d.GetDevice().GetDeviceName() == c.Device && (c.Pool == "" || d.GetDevice().GetPoolName() == c.Pool) &&
		d.GetHealth() == c.Health
}

// healthName is the enum's name as the kubelet writes it into ResourceHealth: Unknown, Healthy,
// Unhealthy.
func healthName(h healthv1.HealthStatus) string {
	switch h {
	case healthv1.HealthStatus_UNKNOWN:
		return "Unknown"
	case healthv1.HealthStatus_HEALTHY:
		return "Healthy"
	case healthv1.HealthStatus_UNHEALTHY:
		return "Unhealthy"
	default:
		return fmt.Sprintf("HealthStatus(%d)", int32(h))
	}
}

type healthDeviceOut struct {
	Pool           string `json:"pool"`
	Device         string `json:"device"`
	Health         string `json:"health"`
	Message        string `json:"message"`
	LastUpdated    int64  `json:"lastUpdated"`
	TimeoutSeconds int64  `json:"timeoutSeconds"`
}

// healthLine is one stream message, printed as one JSON line.
type healthLine struct {
	Devices []healthDeviceOut `json:"devices"`
}

type watchOpts struct {
	until    *untilCond
	messages int
	duration time.Duration
}

// goal describes what the watch waits for, for messages; "" when it just runs.
func (w watchOpts) goal() string {
	var parts []string
	if w.until != nil {
		parts = append(parts, w.until.String())
	}
	if w.messages > 0 {
		parts = append(parts, fmt.Sprintf("%d message(s)", w.messages))
	}
	return strings.Join(parts, " or ")
}

// runWatch registers with the plugin (NotifyRegistrationStatus(true), as the kubelet does before
// it relies on a plugin), then opens the health stream and prints it; see the file comment.
func runWatch(regSocket, expectName string, timeout time.Duration, w watchOpts, stdout, stderr io.Writer) error {
	rep := &report{Operation: "watch"}
	if err := registerPlugin(rep, regSocket, expectName, timeout, true); err != nil {
		return err
	}
	if rep.HealthService == "" {
		return fmt.Errorf("plugin %s does not advertise a device health service in its registration: supported_versions %q contains none of the health services the kubelet supports (%q)",
			rep.Name, rep.SupportedVersions, healthServicesSupportedByKubelet)
	}
	conn, err := dialDRA(rep.Endpoint)
	if err != nil {
		return fmt.Errorf("dial DRA endpoint %s: %w", rep.Endpoint, err)
	}
	defer conn.Close()

	// Like the kubelet: no deadline on the stream; --duration cancels it. (Not a context
	// deadline: gRPC's own deadline timer may end the stream before ctx.Err() is set.)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var elapsed atomic.Bool
	if w.duration > 0 {
		timer := time.AfterFunc(w.duration, func() { elapsed.Store(true); cancel() })
		defer timer.Stop()
	}
	// pkg/kubelet/cm/dra/plugin/dra_plugin.go, DRAPlugin.NodeWatchResources.
	var client healthv1.DRAResourceHealthClient
	switch rep.HealthService {
	case healthv1.DRAResourceHealthService:
		client = healthv1.NewDRAResourceHealthClient(conn)
	default: // healthv1alpha1.DRAResourceHealthService
		client = healthv1.V1Alpha1ClientWrapper{Client: healthv1alpha1.NewDRAResourceHealthClient(conn)}
	}
	fmt.Fprintf(stderr, "kubelet-sim: watch: plugin %s registered, NodeWatchResources on %s at %s\n", rep.Name, rep.HealthService, rep.Endpoint)
	stream, err := client.NodeWatchResources(ctx, &healthv1.NodeWatchResourcesRequest{})
	if err != nil {
		return fmt.Errorf("NodeWatchResources (%s): %w", rep.HealthService, err)
	}

	goal := w.goal()
	for n := 0; ; {
		msg, err := stream.Recv()
		if err != nil {
			switch {
			case elapsed.Load():
				if goal != "" {
					return fmt.Errorf("%s not seen within --duration %s (%d message(s) received)", goal, w.duration, n)
				}
				fmt.Fprintf(stderr, "kubelet-sim: watch: --duration %s elapsed, %d message(s) received\n", w.duration, n)
				return nil
			case errors.Is(err, io.EOF):
				err = fmt.Errorf("health stream (%s) ended by the plugin (EOF) after %d message(s)", rep.HealthService, n)
			default:
				err = fmt.Errorf("health stream (%s) failed after %d message(s): %w", rep.HealthService, n, err)
			}
			if goal != "" {
				err = fmt.Errorf("%w, before %s was seen", err, goal)
			}
			return err
		}
		n++
		line := healthLine{Devices: []healthDeviceOut{}}
		matched := false
		for _, d := range msg.GetDevices() {
			line.Devices = append(line.Devices, healthDeviceOut{
				Pool: d.GetDevice().GetPoolName(), Device: d.GetDevice().GetDeviceName(), Health: healthName(d.GetHealth()),
				Message: d.GetMessage(), LastUpdated: d.GetLastUpdatedTime(), TimeoutSeconds: d.GetHealthCheckTimeoutSeconds(),
			})
			matched = matched || (w.until != nil && w.until.matches(d))
		}
		b, err := json.Marshal(line)
		if err != nil {
			return fmt.Errorf("encode message %d: %w", n, err)
		}
		// One write per line, unbuffered: the e2e scripts tail this while it runs.
		if _, err := stdout.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		if matched {
			fmt.Fprintf(stderr, "kubelet-sim: watch: message %d shows %s\n", n, w.until)
			return nil
		}
		if w.messages > 0 && n >= w.messages {
			fmt.Fprintf(stderr, "kubelet-sim: watch: %d message(s) received\n", n)
			return nil
		}
	}
}
