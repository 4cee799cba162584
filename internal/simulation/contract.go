package simulation

import (
	"context"
	"time"

	"k8s.io/client-go/kubernetes"
)

// ContractClient is a client of a simulated API server on its own, every
// request of which goes at once (no world picks the steps, no scheduler or
// kubelet acts): it answers as the simulator's API server does, so that a
// test can run one scenario against it and against kube-apiserver and
// compare what each answers (test/integration/cluster's
// TestSimulatedAPIServerKeepsTheContract). Only pods and Leases are modelled.
// expire drops the server's history of changes, as the simulator's
// compaction fault does (a restart of kube-apiserver does it to the real
// one): a watch from an earlier resourceVersion then ends with 410 Expired.
// stop ends it.
func ContractClient() (client kubernetes.Interface, expire, stop func()) {
	st := &steps{}
	srv := newAPIServer(st, &History{}, time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for {
			for _, s := range st.snapshot() {
				st.take(s, nil)
			}
			select {
			case <-ctx.Done():
				st.close()
				return
			case <-tick.C:
			}
		}
	}()
	expire = func() {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		srv.compact()
	}
	return srv.client("contract"), expire, func() { cancel(); <-done }
}
