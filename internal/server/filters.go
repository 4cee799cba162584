package server

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubetask/kubetask/pkg/store"
)

// phases are the task phases a filter may name.
var phases = []string{"Pending", "Running", "Succeeded", "Failed"}

// filterFields are the filters lists and watches share.
type filterFields struct {
	Namespace, Phase, Reason, NamePrefix, Labels string
}

// parse checks the filters into opts, calling bad for each bad one.
func (f filterFields) parse(opts *store.PageOptions, bad func(param, value, msg string)) {
	if f.Namespace != "" {
		if msgs := validation.IsDNS1123Label(f.Namespace); len(msgs) > 0 {
			bad("namespace", f.Namespace, "must be a namespace name: "+strings.Join(msgs, "; "))
		}
	}
	opts.Namespace = f.Namespace
	if f.Phase != "" && !slices.Contains(phases, f.Phase) {
		bad("phase", f.Phase, "must be one of "+strings.Join(phases, ", "))
	}
	opts.Phase = f.Phase
	if f.Reason != "" && !isWord(f.Reason) {
		bad("reason", f.Reason, "must be a reason such as Unschedulable or ExitCode (letters only, see docs/states.md)")
	}
	opts.Reason = f.Reason
	if len(f.NamePrefix) > validation.DNS1123SubdomainMaxLength {
		bad("namePrefix", f.NamePrefix, fmt.Sprintf("must be at most %d characters", validation.DNS1123SubdomainMaxLength))
	}
	opts.NamePrefix = f.NamePrefix
	if f.Labels != "" {
		sel, msg := parseLabels(f.Labels)
		if msg != "" {
			bad("labels", f.Labels, msg)
		}
		opts.Labels = sel
	}
}

// MaxLabelTerms is the most key=value terms a labels filter may have: each
// is a condition of the store's query (an EXISTS over the labels past the
// first), and SQLite refuses a query of too many.
const MaxLabelTerms = 20

// parseLabels parses an equality selector "a=b,c=d" ("==" also means
// equality). Anything else (!=, in, notin, a bare key) is refused with a
// message, since the stores match labels by equality only.
func parseLabels(s string) (map[string]string, string) {
	out := map[string]string{}
	terms := strings.Split(s, ",")
	if len(terms) > MaxLabelTerms {
		return nil, fmt.Sprintf("has %d terms: at most %d (filter on fewer labels, or give the tasks a label that says what the terms do)", len(terms), MaxLabelTerms)
	}
	for _, term := range terms {
		term = strings.TrimSpace(term)
		k, v, ok := strings.Cut(term, "=")
		v = strings.TrimPrefix(v, "=")
		k = strings.TrimSpace(k)
		v = strings.TrimSpace(v)
		switch {
		case term == "":
			return nil, "has an empty term: write key=value pairs separated by commas"
		case !ok || strings.HasSuffix(k, "!") || strings.ContainsAny(v, "=!()"):
			return nil, fmt.Sprintf("term %q: only equality is supported: write key=value pairs separated by commas", term)
		}
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			return nil, fmt.Sprintf("term %q: key %q: %s", term, k, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return nil, fmt.Sprintf("term %q: value %q: %s", term, v, strings.Join(msgs, "; "))
		}
		if prev, dup := out[k]; dup && prev != v {
			return nil, fmt.Sprintf("key %q is given twice with different values: no task matches", k)
		}
		out[k] = v
	}
	return out, ""
}

func isWord(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') {
			return false
		}
	}
	return true
}

// matches reports whether a task with these attributes passes the filters
// of opts (the ones a watch applies to events: namespace, phase, reason,
// name prefix and labels).
func matches(opts *store.PageOptions, ns, name, phase, reason string, labels map[string]string) bool {
	if opts.Namespace != "" && ns != opts.Namespace {
		return false
	}
	if opts.Phase != "" && phase != opts.Phase {
		return false
	}
	if opts.Reason != "" && reason != opts.Reason {
		return false
	}
	if !strings.HasPrefix(name, opts.NamePrefix) {
		return false
	}
	for k, v := range opts.Labels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
