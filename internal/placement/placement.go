// Package placement decides which cluster a task goes to, for a service
// that runs tasks on several clusters (docs/multicluster.md, "Placement"):
// pure functions of what the service knows of its clusters (their rows'
// states and labels, their free slots) and of what the task asks (a
// cluster by name, a selector over cluster labels, or neither). The
// service's placer calls them; they never read or write anything.
//
// Guarantees: a task is placed only on a cluster it allows and only on a
// Ready one (never Unreachable, Draining, Lost or Returning); among those
// with a free slot, the one with the most free slots, ties broken by name,
// so that one state gives one answer. A constraint that no configured
// cluster could ever meet is refused with an error that names the field
// and lists the clusters there are, at submission, rather than left
// waiting for ever.
package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kubetask/kubetask/pkg/podstate"
	"github.com/kubetask/kubetask/pkg/store"
	"github.com/kubetask/kubetask/pkg/task"
)

// Cluster is what placement knows of one cluster at a moment.
type Cluster struct {
	Name   string
	Labels map[string]string
	// State is the cluster row's: only Ready takes new placements.
	State store.ClusterState
	// Free is how many more of the task's pods the cluster's executor
	// instance may start now: its parallelism left, and the task's
	// namespace's limit there.
	Free int
}

// Want is what a task asks of its cluster (its spec.placement): a cluster
// by name, a selector over cluster labels, or neither (any cluster; a nil
// *task.Placement asks the same).
type Want = task.Placement

// ErrNoCluster wraps a Want that no configured cluster could ever meet.
var ErrNoCluster = errors.New("no configured cluster meets the task's placement")

// allowed returns w's selector as a function of a cluster (every cluster
// when w names none), or an error naming the field when the selector is
// not valid.
func allowed(w Want) (func(Cluster) bool, error) {
	if w.Cluster != "" && w.ClusterSelector != nil {
		return nil, fmt.Errorf("spec.placement: cluster and clusterSelector are exclusive: name a cluster, or select clusters by their labels")
	}
	if w.Cluster != "" {
		return func(c Cluster) bool { return c.Name == w.Cluster }, nil
	}
	if w.ClusterSelector == nil {
		return func(Cluster) bool { return true }, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(w.ClusterSelector)
	if err != nil {
		return nil, fmt.Errorf("spec.placement.clusterSelector: %w", err)
	}
	return func(c Cluster) bool { return sel.Matches(labels.Set(c.Labels)) }, nil
}

// Check refuses a Want that no cluster of clusters (every configured one,
// whatever its state) could ever meet: a cluster that is not configured, a
// selector that matches none, a selector that is not valid. The error
// names the field and lists the clusters and their labels; it wraps
// ErrNoCluster when the constraint is valid but unmet.
func Check(w Want, clusters []Cluster) error {
	allows, err := allowed(w)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(clusters, allows) {
		return nil
	}
	field := "spec.placement.clusterSelector"
	if w.Cluster != "" {
		field = fmt.Sprintf("spec.placement.cluster %q", w.Cluster)
	}
	return fmt.Errorf("%w: %s matches none of the clusters: %s", ErrNoCluster, field, describe(clusters))
}

// describe lists clusters by name with their labels, in name order.
func describe(clusters []Cluster) string {
	if len(clusters) == 0 {
		return "none is configured"
	}
	sorted := slices.Clone(clusters)
	slices.SortFunc(sorted, func(a, b Cluster) int { return strings.Compare(a.Name, b.Name) })
	parts := make([]string, len(sorted))
	for i, c := range sorted {
		parts[i] = c.Name
		if len(c.Labels) > 0 {
			parts[i] += " (" + labels.Set(c.Labels).String() + ")"
		}
	}
	return strings.Join(parts, ", ")
}

// Choose returns the cluster to place a task of Want w on now: among the
// clusters w allows that are Ready and have a free slot, the one with the
// most free slots, ties broken by name. ok is false when none has room now
// (the task waits; the placer asks again when a slot frees or a cluster's
// state changes). An invalid Want allows no cluster (Check tells why).
func Choose(w Want, clusters []Cluster) (name string, ok bool) {
	return choose(w, clusters, true)
}

// choose is Choose, or Queue when free is false: the Ready cluster w
// allows with the most Free (more than 0 with free), ties by name.
func choose(w Want, clusters []Cluster, free bool) (name string, ok bool) {
	allows, err := allowed(w)
	if err != nil {
		return "", false
	}
	var best *Cluster
	for i := range clusters {
		c := &clusters[i]
		if c.State != store.ClusterReady || free && c.Free <= 0 || !allows(*c) {
			continue
		}
		if best == nil || c.Free > best.Free || c.Free == best.Free && c.Name < best.Name {
			best = c
		}
	}
	if best == nil {
		return "", false
	}
	return best.Name, true
}

// Queue returns the cluster to place a task of Want w on when Choose finds
// none with a free slot: among the Ready clusters w allows, the one with
// the most Free (the shortest line when Free counts the tasks in line as
// negative), ties broken by name. ok is false when w allows no Ready
// cluster. A service without a placer of its own (one that holds unplaced
// tasks until a slot frees) puts the task in that cluster's line.
func Queue(w Want, clusters []Cluster) (name string, ok bool) {
	return choose(w, clusters, false)
}

// Movable reports whether the placer may move rec to another cluster
// without a declaration of loss (its cluster unreachable or draining): it
// is unfinished, its current attempt has no pod (store Clusters.Move
// refuses one that has, atomically), and no pod of its previous attempt
// may still run on its cluster: none was recorded, or the last outcome
// says its pod stopped, or that attempt was not on this cluster, or was
// declared lost with it. Otherwise the next attempt would start elsewhere
// while the previous one's pod still stops here (its sidecars), which one
// cluster's executor never lets happen (it waits for that pod).
func Movable(rec store.Record) bool {
	if rec.Terminal || rec.PodCreated {
		return false
	}
	if len(rec.Attempts) == 0 {
		return true
	}
	last := rec.Attempts[len(rec.Attempts)-1]
	return last.PodStopped || last.Cluster != rec.Cluster || last.Reason == string(podstate.ReasonClusterLost)
}
