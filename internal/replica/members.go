package replica

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coordlisters "k8s.io/client-go/listers/coordination/v1"

	"github.com/kubetask/kubetask/pkg/executor"
)

// LabelGroup labels the membership Leases of a replica group.
const LabelGroup = "kubetask.io/replica-group"

// MemberLeaseName is the name of identity's membership Lease.
func MemberLeaseName(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return "kubetask-member-" + hex.EncodeToString(sum[:])[:16]
}

// observation is when this process saw a member's renew time change.
type observation struct {
	renew string
	at    time.Time
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
		renew := ""
		if l.Spec.RenewTime != nil {
			renew = l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
		}
		o, ok := observed[l.Name]
		if !ok || o.renew != renew {
			o = observation{renew: renew, at: now}
			observed[l.Name] = o
		}
		d := time.Duration(0)
		if l.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		if holder == "" || seen[holder] || now.Sub(o.at) >= d {
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
				Name: MemberLeaseName(r.cfg.Identity), Namespace: r.cfg.Namespace,
				Labels: map[string]string{LabelGroup: r.cfg.Group},
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

func (r *Replica) listMembers(lister coordlisters.LeaseLister) []*coordinationv1.Lease {
	ls, _ := lister.Leases(r.cfg.Namespace).List(labels.SelectorFromSet(labels.Set{LabelGroup: r.cfg.Group}))
	return ls
}

// expiredShards returns the shard Leases held by a replica that is not a
// live member and that, as this process observed them, have not been
// renewed for their duration: their holder is gone.
func (r *Replica) expiredShards(lister coordlisters.LeaseLister, observed map[string]observation, live []string, now time.Time) map[int]*coordinationv1.Lease {
	out := map[int]*coordinationv1.Lease{}
	current := map[string]bool{}
	for k := range r.cfg.Shards {
		name := executor.LeaseName(ShardID(r.cfg.Group, k))
		l, err := lister.Leases(r.cfg.Namespace).Get(name)
		if err != nil {
			continue
		}
		current[name] = true
		renew := ""
		if l.Spec.RenewTime != nil {
			renew = l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
		}
		o, ok := observed[name]
		if !ok || o.renew != renew {
			o = observation{renew: renew, at: now}
			observed[name] = o
		}
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		d := time.Duration(0)
		if l.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		if holder != "" && holder != r.cfg.Identity && !slices.Contains(live, holder) && now.Sub(o.at) >= d {
			out[k] = l
		}
	}
	for name := range observed {
		if !current[name] {
			delete(observed, name)
		}
	}
	return out
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
