package executor

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// ephemeralLock is the instance Lease of an executor with
// Config.EphemeralLease, as client-go leaderelection's lock: the Lease
// exists only while a process holds it.
//
//   - Its first Get creates the Lease with this process as holder. When
//     that works, the instance was free: Get answers NotFound, and the
//     Create leaderelection then makes is answered by the Lease just
//     created, so a free instance is taken in one request. When the Lease
//     exists, Get reads it and leaderelection goes on as with a LeaseLock
//     (it waits until the Lease is released or expired, then updates it).
//   - A renewal that comes less than fresh after this process's own last
//     write of the Lease (leaderelection renews at once after it took the
//     Lease) is answered by that write, without a request: the Lease was
//     written at most fresh before the time leaderelection then counts its
//     renewal from, so a holder that can renew no more stops acting at most
//     fresh later than it would have (see ephemeralFresh).
//   - release, called once leaderelection stopped, deletes the Lease if
//     this process was the last to write it (a precondition on its
//     resourceVersion): one request, and no Lease left behind. Without the
//     right to delete Leases it writes a released record instead, as
//     leaderelection does.
type ephemeralLock struct {
	client   coordinationv1client.LeasesGetter
	meta     metav1.ObjectMeta
	identity string
	duration time.Duration
	fresh    time.Duration // a renewal this soon after the last write is that write
	clock    clock.PassiveClock
	// renewClock times renewals against writes: leaderelection's clock,
	// the real one.
	renewClock clock.PassiveClock

	mu      sync.Mutex
	tried   bool                  // the first Get happened
	created bool                  // the first Get created the Lease; Create is answered by it
	lease   *coordinationv1.Lease // as last read or written
	written time.Time             // when the request of this process's last write of the Lease was sent
}

// ephemeralFresh is how soon after its last write of the Lease an
// ephemeral lock answers a renewal by that write: half a RetryPeriod, and
// no more than leaderelection's own margin. A holder that can renew no
// more stops acting RetryPeriod + RenewDeadline after its last renewal;
// counting that renewal from up to fresh after the real write, it stops by
// write + fresh + RetryPeriod + RenewDeadline, still within the
// LeaseDuration after the write that another process waits before it takes
// the Lease. Zero (every renewal is sent) when there is no margin.
func ephemeralFresh(leaseDuration, renewDeadline, retryPeriod time.Duration) time.Duration {
	return max(min(retryPeriod/2, leaseDuration-renewDeadline-retryPeriod), 0)
}

var _ resourcelock.Interface = (*ephemeralLock)(nil)

// Get implements resourcelock.Interface.
func (l *ephemeralLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.tried {
		l.tried = true
		sent := l.renewClock.Now()
		now := metav1.NewTime(l.clock.Now())
		rec := resourcelock.LeaderElectionRecord{HolderIdentity: l.identity, LeaseDurationSeconds: int(l.duration / time.Second),
			AcquireTime: now, RenewTime: now}
		lease, err := l.client.Leases(l.meta.Namespace).Create(ctx,
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.meta.Namespace, Name: l.meta.Name}, Spec: resourcelock.LeaderElectionRecordToLeaseSpec(&rec)},
			metav1.CreateOptions{})
		switch {
		case err == nil:
			l.lease, l.created, l.written = lease, true, sent
			return nil, nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), l.meta.Name)
		case !apierrors.IsAlreadyExists(err):
			return nil, nil, err
		}
	}
	lease, err := l.client.Leases(l.meta.Namespace).Get(ctx, l.meta.Name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	l.lease = lease
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&lease.Spec)
	raw, err := json.Marshal(*rec)
	if err != nil {
		return nil, nil, err
	}
	return rec, raw, nil
}

// Create implements resourcelock.Interface.
func (l *ephemeralLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.created && ler.HolderIdentity == l.identity {
		l.created = false
		return nil
	}
	l.created = false
	sent := l.renewClock.Now()
	lease, err := l.client.Leases(l.meta.Namespace).Create(ctx,
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.meta.Namespace, Name: l.meta.Name}, Spec: resourcelock.LeaderElectionRecordToLeaseSpec(&ler)},
		metav1.CreateOptions{})
	if err != nil {
		return err
	}
	l.lease, l.written = lease, sent
	return nil
}

// Update implements resourcelock.Interface.
func (l *ephemeralLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lease == nil {
		return errors.New("lease not initialized, call get or create first")
	}
	if l.renewsOwnWrite(ler) {
		return nil
	}
	next := l.lease.DeepCopy()
	next.Spec = resourcelock.LeaderElectionRecordToLeaseSpec(&ler)
	sent := l.renewClock.Now()
	lease, err := l.client.Leases(l.meta.Namespace).Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	l.lease, l.written = lease, sent
	return nil
}

// renewsOwnWrite reports whether ler only renews the Lease as this process
// wrote it less than fresh ago: the same holder, this process.
func (l *ephemeralLock) renewsOwnWrite(ler resourcelock.LeaderElectionRecord) bool {
	held := l.lease.Spec.HolderIdentity
	return l.fresh > 0 && !l.written.IsZero() && ler.HolderIdentity == l.identity &&
		held != nil && *held == l.identity && l.renewClock.Since(l.written) < l.fresh
}

// release deletes the Lease if this process holds it as it last wrote it.
func (l *ephemeralLock) release(log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lease := l.lease
	if lease == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != l.identity {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.duration)
	defer cancel()
	err := l.client.Leases(l.meta.Namespace).Delete(ctx, l.meta.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion}})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		l.lease = nil
	case apierrors.IsConflict(err):
		// Written since by another process: it holds it now.
		l.lease = nil
	case apierrors.IsForbidden(err):
		// No right to delete Leases: released as leaderelection releases
		// them, so the next process need not wait for the expiry.
		next := lease.DeepCopy()
		now := metav1.NewMicroTime(l.clock.Now())
		next.Spec.HolderIdentity, next.Spec.LeaseDurationSeconds = ptr.To(""), ptr.To[int32](1)
		next.Spec.AcquireTime, next.Spec.RenewTime = &now, &now
		if _, err := l.client.Leases(l.meta.Namespace).Update(ctx, next, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			log.Warn("could not release the instance lease; the next process takes it once it expired", "err", err)
		}
		l.lease = nil
	default:
		log.Warn("could not delete the instance lease; the next process takes it once it expired", "err", err)
	}
}

// RecordEvent implements resourcelock.Interface: no events.
func (l *ephemeralLock) RecordEvent(string) {}

// Describe implements resourcelock.Interface.
func (l *ephemeralLock) Describe() string { return l.meta.Namespace + "/" + l.meta.Name }

// Identity implements resourcelock.Interface.
func (l *ephemeralLock) Identity() string { return l.identity }
