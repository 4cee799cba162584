package server

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
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
	// observe, when set, gets the time of each dry run.
	observe func(time.Duration)

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

// Where a submission's verdict came from (validate's source).
const (
	verdictDryRun = "dry-run" // this call's own dry run
	verdictShared = "shared"  // the dry run of a concurrent call with the same spec
	verdictCached = "cached"  // an acceptance within the TTL
)

// validate returns what t.ValidateOnServer returns for t in namespace ns
// (an *task.InvalidError for a refusal, another error when the API server
// could not say), from the cache when t's spec was accepted in ns within the
// TTL, and where the verdict came from. A call that finds a dry run of the
// same spec in flight waits for its verdict; that dry run goes on when the
// call that started it ends. observe, when set, gets the time of each dry
// run.
func (v *validations) validate(ctx context.Context, t *task.Task, ns string) (source string, err error) {
	return v.validateOn(ctx, v.client, t, ns)
}

// validateOn is validate with the dry run on client (a cluster's, for a
// task placed on it by name: its spec, part of the key, names it).
func (v *validations) validateOn(ctx context.Context, client kubernetes.Interface, t *task.Task, ns string) (source string, err error) {
	if v.ttl <= 0 {
		return verdictDryRun, v.dryRun(ctx, client, t, ns)
	}
	key, err := validationKey(t, ns)
	if err != nil {
		return verdictDryRun, v.dryRun(ctx, client, t, ns)
	}
	if v.known(key) {
		return verdictCached, nil
	}
	var ran atomic.Bool // set by the flight's function, in the goroutine of the call that runs it
	ch := v.flight.DoChan(string(key[:]), func() (any, error) {
		if v.known(key) { // accepted by a flight that ended since
			return nil, nil
		}
		ran.Store(true)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), validateTimeout)
		defer cancel()
		err := v.dryRun(dctx, client, t, ns)
		if err == nil {
			v.remember(key, v.clock.Now().Add(v.ttl))
		}
		return nil, err
	})
	select {
	case r := <-ch:
		switch {
		case ran.Load():
			return verdictDryRun, r.Err
		case r.Err == nil && !r.Shared:
			return verdictCached, nil
		}
		return verdictShared, r.Err
	case <-ctx.Done():
		return verdictShared, ctx.Err()
	}
}

// dryRun asks the API server, timing it.
func (v *validations) dryRun(ctx context.Context, client kubernetes.Interface, t *task.Task, ns string) error {
	start := time.Now()
	err := t.ValidateOnServer(ctx, client, ns)
	if v.observe != nil {
		v.observe(time.Since(start))
	}
	return err
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
