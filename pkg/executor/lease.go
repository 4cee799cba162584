package executor

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// ErrLeaseLost reports that the executor could not renew its instance
// Lease: another process may now run the same InstanceID, so this one stops
// acting on pods at once until it holds the Lease again.
var ErrLeaseLost = errors.New("lost the instance lease")

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// LeaseName is the name of the Lease that an executor with instance ID id
// holds while it runs: "kubetask-" and the ID made DNS-safe, with a hash of
// the exact ID so that IDs differing only in case or punctuation differ.
func LeaseName(id string) string {
	sum := sha256.Sum256([]byte(id))
	safe := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(id), "-"), "-")
	if len(safe) > 40 {
		safe = strings.TrimRight(safe[:40], "-")
	}
	return "kubetask-" + safe + "-" + hex.EncodeToString(sum[:])[:8]
}

// holdLease runs fn while this process holds the instance Lease and returns
// fn's error, nil when ctx ended, or ErrLeaseLost.
func (e *Executor) holdLease(ctx context.Context, fn func(context.Context) error) error {
	e.holderOnce.Do(func() {
		e.holder = e.cfg.LeaseHolder
		if e.holder == "" {
			host, _ := os.Hostname()
			b := make([]byte, 4)
			_, _ = rand.Read(b)
			e.holder = fmt.Sprintf("%s_%d_%s", host, os.Getpid(), hex.EncodeToString(b))
		}
	})
	// One identity for the process's life: a Lease it could not renew
	// (the API server restarting) and that nobody took meanwhile is its
	// own again at once, not after a whole lease duration as a stranger's.
	holder := e.holder
	name := LeaseName(e.cfg.InstanceID)
	log := e.cfg.Logger.With("executor", e.cfg.InstanceID, "lease", e.cfg.LeaseNamespace+"/"+name)
	lock := &watchedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.LeaseNamespace, Name: name},
		Client:     e.leaseClient().CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: holder},
	}}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu     sync.Mutex
		result error
		done   = make(chan struct{})
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.cfg.LeaseDuration,
		RenewDeadline:   e.cfg.RenewDeadline,
		RetryPeriod:     e.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            e.cfg.InstanceID,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				log.Info("holding the instance lease")
				err := fn(lctx)
				if err == nil && ctx.Err() == nil {
					// lctx ended and Start's did not: the Lease could not be
					// renewed. Said here too, for OnStoppedLeading may come
					// after fn returned, and then cannot tell a loss from an end.
					err = ErrLeaseLost
					log.Error("lost the instance lease: could not renew it within RenewDeadline")
				}
				mu.Lock()
				if result == nil {
					result = err
				}
				mu.Unlock()
				close(done)
				cancel()
			},
			OnStoppedLeading: func() {
				mu.Lock()
				lost := ctx.Err() == nil && result == nil && !finished(done)
				if lost {
					result = ErrLeaseLost
				}
				mu.Unlock()
				if lost {
					log.Error("lost the instance lease: could not renew it within RenewDeadline")
				}
				cancel()
			},
			OnNewLeader: func(identity string) {
				if identity != holder {
					log.Warn("another process holds this executor's instance lease; waiting for it to end or expire", "holder", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("instance lease: %w", err)
	}
	le.Run(runCtx)
	if lock.acquired.Load() {
		// Run started OnStartedLeading once it held the lease: wait for fn.
		<-done
	}
	mu.Lock()
	defer mu.Unlock()
	return result
}

// watchedLock records whether this process ever wrote the lease as its
// holder: leaderelection starts OnStartedLeading right after, so Start knows
// whether it must wait for it to return.
type watchedLock struct {
	resourcelock.Interface
	acquired atomic.Bool
}

func (l *watchedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, ler)
	if err == nil && ler.HolderIdentity == l.Identity() {
		l.acquired.Store(true)
	}
	return err
}

func (l *watchedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, ler)
	if err == nil && ler.HolderIdentity == l.Identity() {
		l.acquired.Store(true)
	}
	return err
}

func finished(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func (e *Executor) leaseClient() kubernetes.Interface {
	if e.cfg.LeaseClient != nil {
		return e.cfg.LeaseClient
	}
	return e.client
}
