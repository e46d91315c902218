// kubelet-sim plays the kubelet's side of the DRA plugin protocol against a real plugin, on the
// upstream k8s.io/kubelet gRPC stubs (pluginregistration/v1, dra/v1, dra/v1beta1).
//
// Usage:
//
//	kubelet-sim --registration-socket PATH [--expect-name NAME] [--timeout 10s] register
//	kubelet-sim --registration-socket PATH ... prepare   --claim ns/name/uid [--claim ...] [--api v1|v1beta1] [--register]
//	kubelet-sim --registration-socket PATH ... unprepare --claim ns/name/uid [--claim ...] [--api v1|v1beta1] [--register]
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
//
// Output: one JSON document on stdout (also on failure, with "ok": false and "error").
// For prepare/unprepare, "claims" lists each requested claim in order with the plugin's
// per-claim answer (devices: request_names, pool_name, device_name, cdi_device_ids, share_id;
// error); "missing": true marks a claim the response did not mention (the kubelet treats that
// as a failure), "unexpected_claims" lists UIDs in the response that were not requested.
// Exit status: 0 when the RPCs succeeded (even if a claim carries an error), 1 on a
// registration/validation/transport failure, 2 on bad usage.
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
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kubelet-sim --registration-socket PATH [flags] register|prepare|unprepare [flags]")
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
	case "prepare", "unprepare":
		if len(claims) == 0 {
			fmt.Fprintf(stderr, "kubelet-sim: %s needs at least one --claim namespace/name/uid\n", op)
			return 2
		}
	default:
		fmt.Fprintf(stderr, "kubelet-sim: unknown operation %q (want register, prepare or unprepare)\n", op)
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

	rep := &report{Operation: op}
	err := execute(rep, *regSocket, *expectName, *timeout, op, claims, *api, *alsoRegister || op == "register")
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

func execute(rep *report, regSocket, expectName string, timeout time.Duration, op string, claims []claimRef, api string, notify bool) error {
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
	ctx, cancel = context.WithTimeout(context.Background(), timeout)
	defer cancel()
	switch op {
	case "prepare":
		return prepare(ctx, rep, draConn, api, claims)
	default:
		return unprepare(ctx, rep, draConn, api, claims)
	}
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
