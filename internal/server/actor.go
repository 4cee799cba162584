package server

import (
	"slices"

	"github.com/kubetask/kubetask/pkg/api"
	"github.com/kubetask/kubetask/pkg/store"
)

// apiActor is a recorded actor as the API reports it; nil when unknown.
func apiActor(a store.Actor) *api.Actor {
	if a.IsZero() {
		return nil
	}
	return &api.Actor{Auth: a.Auth, User: a.User, UID: a.UID, Groups: slices.Clone(a.Groups)}
}

// actorOf is who a caller is, as the task records keep it: the token's
// subject (token mode), the TokenReview's user, UID and groups (kubernetes
// mode), or "anonymous" (no authentication).
func actorOf(c Caller) store.Actor {
	switch c := c.(type) {
	case *tokenCaller:
		return store.Actor{Auth: "token", User: c.subject}
	case *kubeCaller:
		return store.Actor{Auth: "kubernetes", User: c.user.Username, UID: c.user.UID, Groups: slices.Clone(c.user.Groups)}
	case anonymous:
		return store.Actor{Auth: "none", User: c.Subject()}
	case nil:
		return store.Actor{}
	}
	return store.Actor{User: c.Subject()}
}
