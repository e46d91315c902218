package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// proxyTo starts api-delay's handler (plain HTTP in front, TLS to upstream) and returns its URL.
func proxyTo(t *testing.T, upstream *httptest.Server, delay time.Duration) string {
	t.Helper()
	target, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	roots := upstream.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	front := httptest.NewServer(newHandler(target, roots, regexp.MustCompile(`^slow-`), delay))
	t.Cleanup(front.Close)
	return front.URL
}

func TestDelaysOnlyMatchingClaimReads(t *testing.T) {
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, r.Header.Get("Authorization"))
	}))
	defer upstream.Close()
	const delay = 300 * time.Millisecond
	front := proxyTo(t, upstream, delay)
	const claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"
	for _, tc := range []struct {
		method, path string
		held         bool
	}{
		{"GET", claims + "slow-0", true},
		{"GET", claims + "fast-1", false},
		{"GET", claims + "slow-0/status", false},
		{"GET", claims + "slow-0?watch=true", false},
		{"PUT", claims + "slow-0", false},
		{"GET", "/api/v1/pods", false},
	} {
		req, _ := http.NewRequest(tc.method, front+tc.path, nil)
		req.Header.Set("Authorization", "Bearer token")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		want := tc.method + " " + strings.SplitN(tc.path, "?", 2)[0] + " Bearer token"
		if string(body) != want {
			t.Errorf("%s %s: upstream saw %q, want %q", tc.method, tc.path, body, want)
		}
		if held := took >= delay; held != tc.held {
			t.Errorf("%s %s: took %s, held=%v, want held=%v", tc.method, tc.path, took, held, tc.held)
		}
	}
}

func TestWatchStreams(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `{"type":"ADDED"}`)
		w.(http.Flusher).Flush()
		<-release // the watch stays open
	}))
	defer upstream.Close()
	defer close(release)
	resp, err := http.Get(proxyTo(t, upstream, time.Hour) + "/apis/resource.k8s.io/v1/resourceclaims?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(resp.Body).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if s != "{\"type\":\"ADDED\"}\n" {
			t.Fatalf("first event %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first watch event did not come through while the watch is open")
	}
}
