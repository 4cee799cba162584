package history

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// FenceEvents counts what a replica's log says the fence refused
// (docs/executor.md, "The fence"). They are kubetask's own words, so they are
// never evidence for an invariant; the chaos suite reads them only to tell
// whether a fault exercised the fence at all: a SIGSTOP after which nothing
// was refused proved nothing about it, as a storm without a 410 Expired
// proves nothing about relists (test/bench/storm).
type FenceEvents struct {
	// RefusedCreations are creations whose claim check found a newer term
	// of the instance: never sent, and the term ended.
	RefusedCreations int
	// FencedWrites are store writes refused as fenced: the term ended.
	FencedWrites int
	// Discarded counts discards of pods created behind the fence's gate
	// that their record did not take, never having run (the creator and a
	// later sync may each log one for the same pod).
	Discarded int
}

// Total is the number of refusals.
func (f FenceEvents) Total() int { return f.RefusedCreations + f.FencedWrites + f.Discarded }

func (f FenceEvents) String() string {
	return fmt.Sprintf("%d creations refused for a newer term, %d store writes fenced, %d gated pods discarded", f.RefusedCreations, f.FencedWrites, f.Discarded)
}

// The messages of pkg/executor that FenceEvents counts, by the start of the
// logged msg (slog's text form: msg="...").
var fenceMessages = []struct {
	prefix string
	count  func(*FenceEvents) *int
}{
	{"a creation's claim check found a newer term", func(f *FenceEvents) *int { return &f.RefusedCreations }},
	{"a store write was fenced", func(f *FenceEvents) *int { return &f.FencedWrites }},
	{"discarding a pod its record does not take", func(f *FenceEvents) *int { return &f.Discarded }},
	{"discarding a pod its task's record does not take", func(f *FenceEvents) *int { return &f.Discarded }},
	{"discarding a pod an earlier term created and never ran", func(f *FenceEvents) *int { return &f.Discarded }},
}

// ReadFenceEvents counts the fence's refusals in a replica's log (the text
// lines `kubetask serve` writes); it fails only on a read error.
func ReadFenceEvents(r io.Reader) (FenceEvents, error) {
	var f FenceEvents
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, ` msg="`)
		if i < 0 {
			continue
		}
		msg := line[i+len(` msg="`):]
		for _, m := range fenceMessages {
			if strings.HasPrefix(msg, m.prefix) {
				*m.count(&f)++
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return f, fmt.Errorf("reading a replica's log: %w", err)
	}
	return f, nil
}

// Fenced returns the pods created from from to to (receipts, inclusive) by
// one of executors (any when none is given) with the fence's gate that were
// never bound: creations the fence kept from running.
func (a *Audit) Fenced(from, to time.Time, executors ...string) []*Pod {
	var out []*Pod
	for _, p := range a.Order {
		if !p.Gated || p.Ran() || p.Created.Before(from) || p.Created.After(to) {
			continue
		}
		if len(executors) > 0 && !slices.Contains(executors, p.Executor) {
			continue
		}
		out = append(out, p)
	}
	return out
}
