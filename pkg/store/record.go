package store

import (
	"bytes"
	"maps"
	"slices"
)

// DeepCopy returns a copy of r that shares no memory with r: Labels, Task,
// Result, ExitCode, Attempts (with each attempt's ExitCode) and the actors'
// Groups are copied,
// and nil stays nil while an empty, non-nil map or slice stays empty and
// non-nil.
func (r Record) DeepCopy() Record {
	out := r
	out.Labels = maps.Clone(r.Labels)
	out.Task = bytes.Clone(r.Task)
	out.Result = bytes.Clone(r.Result)
	out.ExitCode = cloneInt32(r.ExitCode)
	out.SubmittedBy.Groups = slices.Clone(r.SubmittedBy.Groups)
	out.CancelledBy.Groups = slices.Clone(r.CancelledBy.Groups)
	if r.Attempts != nil {
		out.Attempts = make([]AttemptOutcome, len(r.Attempts))
		for i, a := range r.Attempts {
			a.ExitCode = cloneInt32(a.ExitCode)
			out.Attempts[i] = a
		}
	}
	return out
}

func cloneInt32(p *int32) *int32 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
