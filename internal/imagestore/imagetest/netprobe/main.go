// Command netprobe serves, on $LISTEN (default :8080), what a pod's network
// looks like from inside: GET / answers one JSON object (NetReport) with the
// pod's name ($HOSTNAME), its interface addresses, $POD_IP, and who the
// apiserver says the pod is, asked with client-go's in-cluster config (a
// SelfSubjectReview: any authenticated user may make one); GET /fetch?url=U
// answers the body of U fetched from inside the pod. Tests of the local node's
// pod network put it, built static, into an image (imagetest.NetProbe).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// NetReport is what GET / answers.
type NetReport struct {
	Pod   string   `json:"pod"`
	PodIP string   `json:"podIP"`
	Addrs []string `json:"addrs"`
	// APIUser is the user name the apiserver gave the pod's service-account
	// token, or "error: ..." when the apiserver could not be asked.
	APIUser string `json:"apiUser"`
}

func main() {
	addr := os.Getenv("LISTEN")
	if addr == "" {
		addr = ":8080"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		rep := NetReport{Pod: os.Getenv("HOSTNAME"), PodIP: os.Getenv("POD_IP"), APIUser: apiUser(r.Context())}
		if as, err := net.InterfaceAddrs(); err == nil {
			for _, a := range as {
				rep.Addrs = append(rep.Addrs, a.String())
			}
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET /fetch", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL.Query().Get("url"), nil) //nolint:gosec // fetching what the test names is the probe's job
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := http.DefaultClient.Do(req) //nolint:gosec // fetching what the test names is the probe's job
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		_, _ = io.Copy(w, resp.Body)
	})
	fmt.Println("listening on", addr)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func apiUser(ctx context.Context) string {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return "error: " + err.Error()
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "error: " + err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "error: " + err.Error()
	}
	return r.Status.UserInfo.Username
}
