// api-delay is a TLS reverse proxy in front of the e2e cluster's kube-apiserver that holds back
// the reads of chosen ResourceClaims, to show what a slow API server does to a node driver
// (e2e/bench-kubelet.sh).
//
// Usage:
//
//	api-delay --listen ADDR --upstream https://127.0.0.1:PORT --cert apiserver.crt --key apiserver.key \
//	          --ca ca.crt [--delay-claims REGEX --delay 10s]
//
// It serves TLS with the API server's own certificate and key, so a client that verifies the API
// server against the cluster CA (a pod using the kubernetes Service) accepts the proxy as the API
// server. Every request is forwarded unchanged to --upstream over TLS verified with --ca; the
// client's bearer token travels in its Authorization header (client certificates do not pass: TLS
// ends here). Responses are flushed as they arrive, so watches stream.
//
// A GET of one ResourceClaim (/apis/resource.k8s.io/VERSION/namespaces/NS/resourceclaims/NAME,
// not a watch) whose NAME matches --delay-claims (Go regexp, unanchored) waits --delay before it
// is forwarded; one line on stderr says so when it starts and when it goes on. Everything else
// passes at once. Each new client connection is logged too ("connection from ADDR").
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"time"
)

// claimPath matches the path of one ResourceClaim (any resource.k8s.io version); the groups
// are the namespace and the name. A subresource (/status) does not match.
var claimPath = regexp.MustCompile(`^/apis/resource\.k8s\.io/[^/]+/namespaces/([^/]+)/resourceclaims/([^/]+)$`)

func main() {
	listen := flag.String("listen", "", "address to serve on, host:port")
	upstream := flag.String("upstream", "", "the API server, https://host:port")
	certFile := flag.String("cert", "", "serving certificate (the API server's)")
	keyFile := flag.String("key", "", "serving key (the API server's)")
	caFile := flag.String("ca", "", "CA that signed the upstream API server's certificate")
	delayClaims := flag.String("delay-claims", "", "delay GETs of ResourceClaims whose name matches this regexp (empty: none)")
	delay := flag.Duration("delay", 10*time.Second, "how long to hold back a matching GET")
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("api-delay: ")
	if *listen == "" || *upstream == "" || *certFile == "" || *keyFile == "" || *caFile == "" {
		log.Fatal("--listen, --upstream, --cert, --key and --ca are required")
	}
	var match *regexp.Regexp
	if *delayClaims != "" {
		var err error
		if match, err = regexp.Compile(*delayClaims); err != nil {
			log.Fatalf("--delay-claims: %v", err)
		}
	}
	target, err := url.Parse(*upstream)
	if err != nil || target.Scheme != "https" || target.Host == "" {
		log.Fatalf("--upstream %q: want https://host:port", *upstream)
	}
	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		log.Fatalf("--ca %s: no PEM certificate", *caFile)
	}

	log.Printf("serving https://%s -> %s (delaying GETs of claims matching %q by %s)", *listen, target, *delayClaims, *delay)
	// ListenAndServeTLS offers HTTP/2 to clients as the API server does. Each new client
	// connection is logged, so a caller can see who goes through the proxy.
	srv := &http.Server{
		Addr: *listen, Handler: newHandler(target, roots, match, *delay), ReadHeaderTimeout: 30 * time.Second,
		ConnState: func(c net.Conn, state http.ConnState) {
			if state == http.StateNew {
				log.Printf("connection from %s", c.RemoteAddr())
			}
		},
	}
	log.Fatal(srv.ListenAndServeTLS(*certFile, *keyFile))
}

// newHandler forwards every request to target (TLS verified with roots), holding back GETs of
// the ResourceClaims whose name match matches (nil: none) for delay.
func newHandler(target *url.URL, roots *x509.CertPool, match *regexp.Regexp, delay time.Duration) http.Handler {
	proxy := &httputil.ReverseProxy{
		// SetURL also sets the Host header to the upstream's; the path and query pass unchanged.
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:   true, // a custom TLS config turns HTTP/2 off unless asked for
			MaxIdleConnsPerHost: 100,
		},
		FlushInterval: -1, // flush every write: watches stream
	}

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if match != nil && r.Method == http.MethodGet && r.URL.Query().Get("watch") == "" {
			if m := claimPath.FindStringSubmatch(r.URL.Path); m != nil && match.MatchString(m[2]) {
				log.Printf("holding GET resourceclaim %s/%s for %s", m[1], m[2], delay)
				select {
				case <-time.After(delay):
					log.Printf("forwarding GET resourceclaim %s/%s", m[1], m[2])
				case <-r.Context().Done():
					log.Printf("client gave up on GET resourceclaim %s/%s", m[1], m[2])
					return
				}
			}
		}
		proxy.ServeHTTP(w, r)
	})
}
