package placement

import (
	"time"

	"github.com/kubetask/kubetask/pkg/store"
)

// Seen is what the service sees of a cluster at a moment, to decide its
// row's state (Next).
type Seen struct {
	// State is the row's state now.
	State store.ClusterState
	// Answers is whether the cluster's instance holds its Lease and its
	// pod caches are synced (executor Ready).
	Answers bool
	// QuietSince is when the instance was first seen not answering, since
	// it last answered; zero while it answers.
	QuietSince time.Time
	// Stranded is how many tasks the instance still shows pods of that are
	// placed elsewhere (executor Stranded): pods of lost attempts its
	// passes stop and release.
	Stranded int
	// Refused is, for a quiet cluster, why its API server refused the
	// service's credentials (401 or 403) when asked; "" when it did not.
	Refused string
}

// Reasons a cluster's row gives for the states Next decides.
const (
	ReasonNotAnswering = "NotAnswering"
	// ReasonCredentialsRefused: not answering, and its API server refuses
	// the service's credentials (Seen.Refused).
	ReasonCredentialsRefused = "CredentialsRefused"
	ReasonReturning          = "Returning"
	// ReasonNotConfigured: the store has a row of the cluster, the
	// service's configuration does not name it (the service's own
	// marking, not Next's): Unreachable until configured again or
	// declared lost.
	ReasonNotConfigured = "NotConfigured"
)

// Next decides a cluster's row state from what is seen of it now
// (docs/multicluster.md, "An attempt's states across clusters"): a Ready
// cluster whose instance has not answered for unreachableAfter becomes
// Unreachable, and Ready again once it answers; a Lost cluster that
// answers becomes Returning, and Returning becomes Ready once its instance
// shows no pod of a task placed elsewhere (its lost attempts' pods are
// stopped and released). Draining is the operator's, and stays. change is
// false when the state stays; reason and message say why the new one.
func Next(s Seen, now time.Time, unreachableAfter time.Duration) (state store.ClusterState, reason, message string, change bool) {
	switch s.State {
	case store.ClusterReady:
		if !s.Answers && !s.QuietSince.IsZero() && now.Sub(s.QuietSince) >= unreachableAfter {
			reason, why := ReasonNotAnswering, ""
			if s.Refused != "" {
				reason, why = ReasonCredentialsRefused, "its API server refuses the service's credentials ("+s.Refused+"), and "
			}
			return store.ClusterUnreachable, reason,
				why + "its executor instance has not held its Lease with synced pod caches since " + s.QuietSince.UTC().Format(time.RFC3339) + ": no new placement; its running attempts keep their state", true
		}
	case store.ClusterUnreachable:
		if s.Answers {
			return store.ClusterReady, "", "", true
		}
	case store.ClusterLost:
		if s.Answers {
			return store.ClusterReturning, ReasonReturning, "a lost cluster answers again: its lost attempts' pods are stopped and released before any placement", true
		}
	case store.ClusterReturning:
		if s.Answers && s.Stranded == 0 {
			return store.ClusterReady, "", "", true
		}
	}
	return s.State, "", "", false
}
