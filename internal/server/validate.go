package server

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/task"
)

// validations asks the API server about each distinct pod template once per
// TTL instead of once per submission: schedulers submit the same template
// over and over, under another name each time.
//
// A verdict is keyed by the namespace and the task's spec (the template and
// everything BuildPod takes from the task but its name). The name only
// reaches the pod as its generated name, a label value that BuildPod makes
// valid and an annotation, so the API server's validation of the pod does
// not depend on it: a spec it accepted under one name it accepts under any
// valid name. Acceptances are kept for the TTL (a LimitRange, a Pod Security
// level or a webhook changed meanwhile is noticed once it has passed);
// refusals (422) and failures to ask are never kept. Concurrent submissions
// of one template share one dry run.
type validations struct {
	client kubernetes.Interface
	clock  clock.PassiveClock
	ttl    time.Duration // <= 0: every submission is asked about
	max    int

	mu       sync.Mutex
	accepted map[[sha256.Size]byte]time.Time // key -> when the acceptance expires
	flight   singleflight.Group
}

// validateTimeout bounds a shared dry run: it runs for every submission
// waiting on it, whatever becomes of the one that started it.
const validateTimeout = 30 * time.Second

func newValidations(client kubernetes.Interface, clk clock.PassiveClock, ttl time.Duration, maxEntries int) *validations {
	return &validations{client: client, clock: clk, ttl: ttl, max: maxEntries, accepted: map[[sha256.Size]byte]time.Time{}}
}

// validate returns what t.ValidateOnServer returns for t in namespace ns
// (an *task.InvalidError for a refusal, another error when the API server
// could not say), from the cache when t's spec was accepted in ns within the
// TTL (cached: no dry run was made or awaited for this call). A call that
// finds a dry run of the same spec in flight waits for its verdict; that dry
// run goes on when the call that started it ends.
func (v *validations) validate(ctx context.Context, t *task.Task, ns string) (cached bool, err error) {
	if v.ttl <= 0 {
		return false, t.ValidateOnServer(ctx, v.client, ns)
	}
	key, err := validationKey(t, ns)
	if err != nil {
		return false, t.ValidateOnServer(ctx, v.client, ns)
	}
	if v.known(key) {
		return true, nil
	}
	ch := v.flight.DoChan(string(key[:]), func() (any, error) {
		if v.known(key) { // accepted by a flight that ended since
			return true, nil
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), validateTimeout)
		defer cancel()
		err := t.ValidateOnServer(dctx, v.client, ns)
		if err == nil {
			v.remember(key, v.clock.Now().Add(v.ttl))
		}
		return false, err
	})
	select {
	case r := <-ch:
		known, _ := r.Val.(bool)
		return known, r.Err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// known reports whether an acceptance of key stands.
func (v *validations) known(key [sha256.Size]byte) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	exp, ok := v.accepted[key]
	return ok && v.clock.Now().Before(exp)
}

func (v *validations) remember(key [sha256.Size]byte, exp time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.accepted) >= v.max {
		now := v.clock.Now()
		for k, e := range v.accepted {
			if !now.Before(e) {
				delete(v.accepted, k)
			}
		}
		for k := range v.accepted { // still full: forget any
			if len(v.accepted) < v.max {
				break
			}
			delete(v.accepted, k)
		}
	}
	v.accepted[key] = exp
}

// validationKey identifies what the API server's verdict on t's pod in ns
// depends on: the namespace and the spec.
func validationKey(t *task.Task, ns string) ([sha256.Size]byte, error) {
	spec, err := json.Marshal(&t.Spec)
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("encoding the task's spec: %w", err)
	}
	return sha256.Sum256(append([]byte(ns+"\x00"), spec...)), nil
}
