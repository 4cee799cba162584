package store

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
)

// sameUse reports whether a version-checked write of a record with nonce
// may replace the stored record whose nonce is stored: the stored record is
// the same use of the ID, or one from before nonces (stored empty), which a
// write may give one (the executor adopting its pod). A copy of an earlier
// record of the ID, deleted by retention, is never written over a later
// one that reached the copy's version.
func sameUse(stored, nonce string) bool { return stored == "" || stored == nonce }

// anotherUse is the ErrConflict of a write from version expected with nonce
// onto a stored record at that version whose nonce stored is another
// (!sameUse).
func anotherUse(expected int64, stored, nonce string) error {
	return fmt.Errorf("version %d: the stored record is another use of its ID (nonce %q, the write's %q): %w",
		expected, stored, nonce, ErrConflict)
}

// updateRefused tells why an Update of rec from version expected was not
// applied to the record stored at version stored with nonce storedNonce:
// ErrConflict when the version differs or the stored record is another use
// of the ID, else ErrFenced, the one condition left. A stored record at a
// given version with a given nonce never changes (every write raises the
// version; a record deleted and created again has another nonce), so a
// record read after the write failed tells the reason, in a transaction or
// not.
func updateRefused(rec Record, expected, stored int64, storedNonce string) error {
	switch {
	case stored != expected:
		return fmt.Errorf("version %d, stored %d: %w", expected, stored, ErrConflict)
	case !sameUse(storedNonce, rec.Nonce):
		return anotherUse(expected, storedNonce, rec.Nonce)
	default:
		return fmt.Errorf("epoch %d of %s: %w", rec.Epoch, rec.Executor, ErrFenced)
	}
}

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
