package simulation

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubetask/kubetask/pkg/store"
)

type actorKey struct{}

// withActor marks ctx's calls as actor's steps.
func withActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

func actorOf(ctx context.Context, def string) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok {
		return a
	}
	return def
}

// simStore is a process's view of the shared store: every call is a step
// (the request), and its answer a second one (reads too: a caller may be
// descheduled after the store read its record and before it looks at it),
// which the world may delay or fail. It writes the records' milestones into
// the history.
type simStore struct {
	inner store.Store
	steps *steps
	hist  *History
	actor string
	seen  *seenRecords
	// feed, when set, is told of the records created and cancelled
	// (store.Changes).
	feed *feed
}

// seenRecords is what the history already holds of each record.
type seenRecords struct {
	writes    int // records written so far (under History.mu): oldestFinished's cache key
	attempts  map[string]int
	discarded map[string]bool // by task name and attempt
	podUID    map[string]string
	terminal  map[string]bool
	cancelled map[string]bool
}

func newSeen() *seenRecords {
	return &seenRecords{attempts: map[string]int{}, discarded: map[string]bool{}, podUID: map[string]string{}, terminal: map[string]bool{}, cancelled: map[string]bool{}}
}

var _ store.Store = (*simStore)(nil)

func (s *simStore) before(ctx context.Context, what string) error {
	a := actorOf(ctx, s.actor)
	if err := s.steps.wait(ctx, a, a+" store> "+what); err != nil {
		if errors.Is(err, errInjected) {
			return fmt.Errorf("simulated: %w", store.ErrUnavailable)
		}
		return err
	}
	return nil
}

// after is the answer's step: the call was applied (a write) or read (a
// read); its caller learns the result only once the world releases it.
func (s *simStore) after(ctx context.Context, what string) error {
	a := actorOf(ctx, s.actor)
	if err := s.steps.wait(ctx, a, a+" store< "+what); err != nil {
		if errors.Is(err, errInjected) || errors.Is(err, errShutdown) {
			return fmt.Errorf("simulated: the answer was lost: %w", store.ErrUnavailable)
		}
		// ctx ended while the answer was on its way: a write was applied.
		return fmt.Errorf("simulated: the answer was lost (%w): %w", err, store.ErrUnavailable)
	}
	return nil
}

func (s *simStore) Create(ctx context.Context, rec store.Record) (store.Record, bool, error) {
	if err := s.before(ctx, "create "+rec.ID); err != nil {
		return store.Record{}, false, err
	}
	out, created, err := s.inner.Create(context.Background(), rec)
	if err == nil {
		if created {
			s.hist.register(out.ID, out.Nonce)
		}
		s.note(out)
		if created && s.feed != nil {
			s.feed.publish(store.Change{Executor: out.Executor, ID: out.ID})
		}
	}
	if aerr := s.after(ctx, "create "+rec.ID); aerr != nil {
		return store.Record{}, false, aerr
	}
	return out, created, err
}

func (s *simStore) Get(ctx context.Context, id string) (store.Record, error) {
	if err := s.before(ctx, "get "+id); err != nil {
		return store.Record{}, err
	}
	rec, err := s.inner.Get(context.Background(), id)
	if aerr := s.after(ctx, "get "+id); aerr != nil {
		return store.Record{}, aerr
	}
	return rec, err
}

func (s *simStore) Update(ctx context.Context, rec store.Record) (store.Record, error) {
	if err := s.before(ctx, "update "+rec.ID); err != nil {
		return store.Record{}, err
	}
	out, err := s.inner.Update(context.Background(), rec)
	if err == nil {
		s.note(out)
	}
	if aerr := s.after(ctx, "update "+rec.ID); aerr != nil {
		return store.Record{}, aerr
	}
	return out, err
}

func (s *simStore) BeginTerm(ctx context.Context, instance string) (int64, error) {
	if err := s.before(ctx, "beginterm "+instance); err != nil {
		return 0, err
	}
	e, err := s.inner.BeginTerm(context.Background(), instance)
	if err == nil {
		s.hist.add(Event{Kind: KProcess, Note: fmt.Sprintf("%s began term %d of %s", actorOf(ctx, s.actor), e, instance)})
	}
	if aerr := s.after(ctx, "beginterm "+instance); aerr != nil {
		return 0, aerr
	}
	return e, err
}

func (s *simStore) Epoch(ctx context.Context, instance string) (int64, error) {
	if err := s.before(ctx, "epoch "+instance); err != nil {
		return 0, err
	}
	e, err := s.inner.Epoch(context.Background(), instance)
	if aerr := s.after(ctx, "epoch "+instance); aerr != nil {
		return 0, aerr
	}
	return e, err
}

func (s *simStore) List(ctx context.Context, opts store.ListOptions) ([]store.Record, error) {
	if err := s.before(ctx, "list "+opts.Executor); err != nil {
		return nil, err
	}
	recs, err := s.inner.List(context.Background(), opts)
	if aerr := s.after(ctx, "list "+opts.Executor); aerr != nil {
		return nil, aerr
	}
	return recs, err
}

func (s *simStore) Close() error { return nil }

// note writes what rec, just stored, adds to the history.
func (s *simStore) note(rec store.Record) {
	s.hist.mu.Lock()
	seen := s.seen
	seen.writes++
	s.hist.mu.Unlock()
	name := s.hist.name(rec.ID, rec.Nonce)
	if rec.PodCreated && rec.PodUID != "" && seen.podUID[name] != fmt.Sprint(rec.Attempt, rec.PodUID) {
		seen.podUID[name] = fmt.Sprint(rec.Attempt, rec.PodUID)
		s.hist.add(Event{Kind: KRecord, Task: name, Attempt: rec.Attempt, UID: rec.PodUID, Note: fmt.Sprintf("epoch %d", rec.PodEpoch)})
	}
	for i := seen.attempts[name]; i < len(rec.Attempts); i++ {
		a := rec.Attempts[i]
		s.hist.add(Event{Kind: KOutcome, Task: name, Attempt: a.Attempt, UID: a.PodUID, Phase: a.Phase, Reason: a.Reason, Code: a.ExitCode})
	}
	seen.attempts[name] = len(rec.Attempts)
	for _, a := range rec.Attempts {
		if k := fmt.Sprint(name, "/", a.Attempt); a.Discarded != nil && !seen.discarded[k] {
			seen.discarded[k] = true
			s.hist.add(Event{Kind: KDiscarded, Task: name, Attempt: a.Attempt, UID: a.PodUID, Code: a.Discarded.ExitCode, Reason: a.Discarded.Reason})
		}
	}
	if !rec.CancelledAt.IsZero() && !seen.cancelled[name] {
		seen.cancelled[name] = true
		s.hist.add(Event{Kind: KCancelled, Task: name, Attempt: rec.Attempt})
		if s.feed != nil {
			s.feed.publish(store.Change{Executor: rec.Executor, ID: rec.ID})
		}
	}
	if rec.Terminal && !seen.terminal[name] {
		seen.terminal[name] = true
		s.hist.add(Event{Kind: KFinal, Task: name, Attempt: rec.Attempt, Phase: rec.Phase, Reason: rec.Reason, Code: rec.ExitCode})
	}
}
