package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// pageQuery is PageOptions checked and normalised, shared by the stores'
// Page: the limit bounded, the time bounds in Unix nanoseconds, the
// continue token decoded and checked against the filters.
type pageQuery struct {
	PageOptions
	// limit is the page size, within 1..MaxPageSize.
	limit int
	// after, when set, is the last key of the previous page: this page holds
	// the records that sort after it (older, or as old with a smaller ID).
	after *pageKey
	// createdFrom and createdTo bound CreatedAt in Unix nanoseconds:
	// createdFrom <= created_at < createdTo, each only when set.
	createdFrom, createdTo *int64
	// filters identifies the filters, so a token works only with its own.
	filters string
	// none is set when Namespace is not one of Namespaces: nothing matches.
	none bool
}

// maxNamespaceBranches is the most namespaces (PageOptions.Namespaces) the
// SQL stores read as one ordered range each, merged; beyond it the
// namespaces are one condition on the range of the filters' index.
const maxNamespaceBranches = 64

// pageKey is a record's position in page order.
type pageKey struct {
	CreatedAt int64  `json:"t"`
	ID        string `json:"i"`
}

// pageToken is what a continue token encodes (as base64url JSON).
type pageToken struct {
	Version int     `json:"v"`
	After   pageKey `json:"a"`
	Filters string  `json:"f"`
}

const pageTokenVersion = 1

// query checks and normalises o.
func (o PageOptions) query() (pageQuery, error) {
	q := pageQuery{PageOptions: o}
	if len(q.Labels) == 0 {
		q.Labels = nil
	} else {
		q.Labels = maps.Clone(q.Labels)
	}
	if len(o.Namespaces) > 0 {
		q.Namespaces = slices.Compact(slices.Sorted(slices.Values(o.Namespaces)))
		switch {
		case q.Namespace != "":
			q.none = !slices.Contains(q.Namespaces, q.Namespace)
			q.Namespaces = nil
		case len(q.Namespaces) == 1:
			q.Namespace, q.Namespaces = q.Namespaces[0], nil
		}
	} else {
		q.Namespaces = nil
	}
	switch {
	case o.Limit <= 0:
		q.limit = DefaultPageSize
	case o.Limit > MaxPageSize:
		q.limit = MaxPageSize
	default:
		q.limit = o.Limit
	}
	if !o.CreatedAfter.IsZero() {
		n := clampUnixNano(o.CreatedAfter)
		q.createdFrom = &n
	}
	if !o.CreatedBefore.IsZero() {
		n := clampUnixNano(o.CreatedBefore)
		q.createdTo = &n
	}
	q.filters = q.filterHash()
	if o.Continue != "" {
		raw, err := base64.RawURLEncoding.DecodeString(o.Continue)
		if err != nil {
			return pageQuery{}, fmt.Errorf("%w: not base64url", ErrBadContinue)
		}
		var tok pageToken
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&tok); err != nil || tok.Version != pageTokenVersion || tok.After.ID == "" {
			return pageQuery{}, fmt.Errorf("%w: not a token of this store", ErrBadContinue)
		}
		if tok.Filters != q.filters {
			return pageQuery{}, fmt.Errorf("%w: issued for other filters", ErrBadContinue)
		}
		q.after = &tok.After
	}
	return q, nil
}

// filterHash is a short digest of the filters (not the limit, which may
// change from page to page).
func (q pageQuery) filterHash() string {
	canon, err := json.Marshal(struct {
		Namespace, Phase, Reason, NamePrefix string
		Labels                               map[string]string // encoded with sorted keys
		From, To                             *int64
		Terminal                             *bool
		Namespaces                           []string `json:",omitempty"` // sorted; omitted when empty, so older tokens stay valid
		None                                 bool     `json:",omitempty"`
		Cluster                              string   `json:",omitempty"` // omitted when empty, so older tokens stay valid
	}{q.Namespace, q.Phase, q.Reason, q.NamePrefix, q.Labels, q.createdFrom, q.createdTo, q.Terminal, q.Namespaces, q.none, q.Cluster})
	if err != nil { // strings, ints and bools always encode
		panic(fmt.Sprintf("page filters encoding: %v", err))
	}
	sum := sha256.Sum256(canon)
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

// token returns the continue token of a page that ends with last.
func (q pageQuery) token(last Record) string {
	b, err := json.Marshal(pageToken{
		Version: pageTokenVersion,
		After:   pageKey{CreatedAt: last.CreatedAt.UnixNano(), ID: last.ID},
		Filters: q.filters,
	})
	if err != nil {
		panic(fmt.Sprintf("continue token encoding: %v", err))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// page builds the Page from up to limit+1 records in page order: the extra
// one only says that another page follows.
func (q pageQuery) page(recs []Record) Page {
	if len(recs) <= q.limit {
		return Page{Records: recs}
	}
	recs = recs[:q.limit]
	return Page{Records: recs, Continue: q.token(recs[len(recs)-1])}
}

// sortedLabelKeys returns the label filter's keys in order.
func (q pageQuery) sortedLabelKeys() []string {
	return slices.Sorted(maps.Keys(q.Labels))
}

// matches reports whether rec passes the filters and lies after the
// continue position (the memory store's Page; SQLite's evaluates the same
// conditions in SQL).
func (q pageQuery) matches(rec Record) bool {
	created := rec.CreatedAt.UnixNano()
	switch {
	case q.none,
		q.Namespace != "" && rec.Namespace != q.Namespace,
		q.Cluster != "" && rec.Cluster != q.Cluster,
		len(q.Namespaces) > 0 && !slices.Contains(q.Namespaces, rec.Namespace),
		q.Phase != "" && rec.Phase != q.Phase,
		q.Reason != "" && rec.Reason != q.Reason,
		q.NamePrefix != "" && !strings.HasPrefix(rec.Name, q.NamePrefix),
		q.Terminal != nil && rec.Terminal != *q.Terminal,
		q.createdFrom != nil && created < *q.createdFrom,
		q.createdTo != nil && created >= *q.createdTo,
		q.after != nil && comparePageKeys(pageKey{created, rec.ID}, *q.after) <= 0:
		return false
	}
	for k, v := range q.Labels {
		if got, ok := rec.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// comparePageKeys orders keys as pages list them: a key that comes later
// (older, or as old with a smaller ID) is greater.
func comparePageKeys(a, b pageKey) int {
	switch {
	case a.CreatedAt != b.CreatedAt:
		if a.CreatedAt > b.CreatedAt {
			return -1
		}
		return 1
	default:
		return -strings.Compare(a.ID, b.ID)
	}
}

// prefixEnd returns the smallest string greater than every string that
// starts with prefix, and false when there is none (prefix is all 0xff
// bytes): the exclusive upper bound of a range scan for the prefix, in
// byte order (SQLite's BINARY collation).
func prefixEnd(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// clampUnixNano returns t in Unix nanoseconds, clamped to the int64 range.
func clampUnixNano(t time.Time) int64 {
	switch {
	case t.Before(minUnixNano):
		return math.MinInt64
	case t.After(maxUnixNano):
		return math.MaxInt64
	default:
		return t.UnixNano()
	}
}
