package replica

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/utils/clock"

	"github.com/kubetask/kubetask/pkg/executor"
)

// LabelGroup labels the membership Leases of a replica group.
const LabelGroup = "kubetask.io/replica-group"

// MemberLeaseName is the name of identity's membership Lease in group. A
// process is a member of several groups when its service runs several
// clusters (a group each): two of them may keep their Leases in one
// namespace of one cluster (two names for one cluster), and each needs its
// own (one Lease for both was relabelled by each group's renewal in turn,
// and each group saw the member come and go).
func MemberLeaseName(group, identity string) string {
	sum := sha256.Sum256([]byte(group + "/" + identity))
	return "kubetask-member-" + hex.EncodeToString(sum[:])[:16]
}

// observation is when this process saw a Lease's renew time change, and
// the Lease's duration as last seen.
type observation struct {
	renew string
	at    time.Time
	d     time.Duration
}

// observations are the renewals this process saw of the group's membership
// Leases and of its shard Leases, noted as the informer delivers them.
type observations struct {
	mu      sync.Mutex
	clock   clock.PassiveClock
	group   string
	shardOf map[string]bool // names of the shard Leases
	members map[string]observation
	shards  map[string]observation
}

func (r *Replica) newObservations() *observations {
	o := &observations{clock: r.cfg.Clock, group: r.cfg.Group, shardOf: map[string]bool{},
		members: map[string]observation{}, shards: map[string]observation{}}
	for k := range r.cfg.Shards {
		o.shardOf[executor.LeaseName(ShardID(r.cfg.Group, k))] = true
	}
	return o
}

// note stamps a renewal of a Lease (an informer's object) with the time it
// reached this process, at once: not when the membership loop gets to it,
// which may be later, and expiry would be judged late by as much. The
// stamp is never before the renewal was written (the informer delivers
// after).
func (o *observations) note(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	var m map[string]observation
	switch {
	case l.Labels[LabelGroup] == o.group:
		m = o.members
	case o.shardOf[l.Name]:
		m = o.shards
	default:
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	observe(m, l, o.clock.Now())
}

// nextExpiry is the earliest time after now at which a Lease observed
// expires, zero if none will. Call with mu held.
func (o *observations) nextExpiry(now time.Time) time.Time {
	var next time.Time
	for _, m := range []map[string]observation{o.members, o.shards} {
		for _, ob := range m {
			if at := ob.at.Add(ob.d); at.After(now) && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
	}
	return next
}

// observe notes l's renew time and duration in observed, stamped now if
// its renew time is new, and returns the observation.
func observe(observed map[string]observation, l *coordinationv1.Lease, now time.Time) observation {
	renew := ""
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	o, ok := observed[l.Name]
	if !ok || o.renew != renew {
		o = observation{renew: renew, at: now}
	}
	o.d = 0
	if l.Spec.LeaseDurationSeconds != nil {
		o.d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	observed[l.Name] = o
	return o
}

// liveMembers returns the identities of the members whose Lease was renewed
// within its duration, as this process observed it: by its own clock, from
// the time the Lease's renew time last changed (as client-go leaderelection
// does), so that clock skew between replicas does not matter. This replica
// counts unless it is leaving. observed is updated.
func liveMembers(leases []*coordinationv1.Lease, observed map[string]observation, self string, leaving bool, now time.Time) []string {
	seen := map[string]bool{}
	var out []string
	if !leaving {
		out = append(out, self)
		seen[self] = true
	}
	current := map[string]bool{}
	for _, l := range leases {
		current[l.Name] = true
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		o := observe(observed, l, now)
		if holder == "" || seen[holder] || now.Sub(o.at) >= o.d {
			continue
		}
		seen[holder] = true
		out = append(out, holder)
	}
	for name := range observed {
		if !current[name] {
			delete(observed, name)
		}
	}
	return out
}

// renewMember creates or renews this replica's membership Lease and returns
// it as stored.
func (r *Replica) renewMember(ctx context.Context, last *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	leases := r.cfg.Client.CoordinationV1().Leases(r.cfg.Namespace)
	now := metav1.NewMicroTime(r.cfg.Clock.Now())
	secs := int32(min(r.cfg.LeaseDuration/time.Second, 3600)) //nolint:gosec // at most 3600
	if last == nil {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: MemberLeaseName(r.cfg.Group, r.cfg.Identity), Namespace: r.cfg.Namespace,
				Labels: map[string]string{LabelGroup: r.cfg.Group}, Annotations: r.memberAnnotations(nil),
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &r.cfg.Identity, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}
		got, err := leases.Create(ctx, l, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			if err != nil {
				return nil, fmt.Errorf("creating membership lease: %w", err)
			}
			return got, nil
		}
		// Left by an earlier process with this identity: take it over.
		if last, err = leases.Get(ctx, l.Name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("reading membership lease: %w", err)
		}
	}
	l := last.DeepCopy()
	l.Labels = map[string]string{LabelGroup: r.cfg.Group}
	l.Annotations = r.memberAnnotations(l.Annotations)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &r.cfg.Identity, &secs, &now
	got, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return r.renewMember(ctx, nil) // re-read, or create again
	}
	if err != nil {
		return nil, fmt.Errorf("renewing membership lease: %w", err)
	}
	return got, nil
}

// memberAnnotations returns a membership Lease's annotations (those of
// old and this replica's shard count and place in the join order).
func (r *Replica) memberAnnotations(old map[string]string) map[string]string {
	self := r.self()
	out := maps.Clone(old)
	if out == nil {
		out = map[string]string{}
	}
	out[AnnotationShards] = strconv.Itoa(self.Shards)
	out[AnnotationJoined] = strconv.FormatInt(self.Joined, 10)
	return out
}

func (r *Replica) listMembers(lister coordlisters.LeaseLister) []*coordinationv1.Lease {
	ls, _ := lister.Leases(r.cfg.Namespace).List(labels.SelectorFromSet(labels.Set{LabelGroup: r.cfg.Group}))
	return ls
}

// expiredShards returns the shard Leases held by a replica that is not a
// live member and that, as this process observed them, have not been
// renewed for their duration: their holder is gone. It also returns the
// shards whose Lease such a holder holds still unexpired (waiting): an
// executor started for one of those now would only wait in leaderelection
// and try again a RetryPeriod or two after the Lease is freed.
func (r *Replica) expiredShards(lister coordlisters.LeaseLister, observed map[string]observation, live []string, now time.Time) (expired map[int]*coordinationv1.Lease, waiting map[int]bool) {
	out, waiting := map[int]*coordinationv1.Lease{}, map[int]bool{}
	current := map[string]bool{}
	for k := range r.cfg.Shards {
		name := executor.LeaseName(ShardID(r.cfg.Group, k))
		l, err := lister.Leases(r.cfg.Namespace).Get(name)
		if err != nil {
			continue
		}
		current[name] = true
		o := observe(observed, l, now)
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		if holder != "" && holder != r.cfg.Identity && !slices.Contains(live, holder) {
			if now.Sub(o.at) >= o.d {
				out[k] = l
			} else {
				waiting[k] = true
			}
		}
	}
	for name := range observed {
		if !current[name] {
			delete(observed, name)
		}
	}
	return out, waiting
}

// freeShard clears the holder of a shard Lease whose holder is gone (see
// expiredShards), by compare-and-swap on the version observed, so that this
// replica's executor takes it at once instead of observing it for another
// lease duration (client-go leaderelection judges expiry from its own first
// observation). A holder that renewed meanwhile makes the update conflict
// and keeps its Lease.
func (r *Replica) freeShard(ctx context.Context, l *coordinationv1.Lease) {
	free := l.DeepCopy()
	free.Spec.HolderIdentity = nil
	one := int32(1)
	free.Spec.LeaseDurationSeconds = &one
	_, err := r.cfg.Client.CoordinationV1().Leases(l.Namespace).Update(ctx, free, metav1.UpdateOptions{})
	switch {
	case err == nil:
		r.log.Info("freed the shard lease of a replica that is gone", "lease", l.Name, "holder", *l.Spec.HolderIdentity)
	case apierrors.IsConflict(err):
	default:
		r.log.Warn("freeing a shard lease", "lease", l.Name, "err", err)
	}
}
