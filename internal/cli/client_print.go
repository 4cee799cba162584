package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/kubetask/kubetask/pkg/api"
)

// Output formats of the client commands (-o).
const (
	outputTable = ""
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

func checkOutput(o string, allowed ...string) error {
	if slices.Contains(allowed, o) {
		return nil
	}
	var names []string
	for _, a := range allowed {
		if a != "" {
			names = append(names, a)
		}
	}
	return fmt.Errorf("-o must be %s, got %q", strings.Join(names, " or "), o)
}

// printObject writes v as indented JSON or as YAML.
func printObject(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the output: %w", err)
	}
	if format == outputYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encoding the output: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// age is kubectl's rendering of the time since t ("5m", "3d4h"); "<unknown>"
// for the zero time.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

func state(phase, reason string) string {
	if reason == "" || reason == phase {
		return phase
	}
	return phase + "/" + reason
}

func exitCode(c *int32) string {
	if c == nil {
		return "-"
	}
	return strconv.Itoa(int(*c))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func labelText(l map[string]string) string {
	var terms []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		terms = append(terms, k+"="+l[k])
	}
	return strings.Join(terms, ",")
}

// oneLine shortens a message to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-3]) + "..."
}

// taskTable prints tasks as a table like kubectl get's: ID, NAMESPACE, NAME,
// STATE, REASON, ATTEMPTS, AGE; wide adds EXIT, LABELS and MESSAGE.
type taskTable struct {
	tw     *tabwriter.Writer
	wide   bool
	now    func() time.Time
	header bool
}

func newTaskTable(w io.Writer, wide bool, now func() time.Time) *taskTable {
	return &taskTable{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0), wide: wide, now: now}
}

func (t *taskTable) writeHeader() {
	if t.header {
		return
	}
	t.header = true
	cols := "ID\tNAMESPACE\tNAME\tSTATE\tREASON\tATTEMPTS\tAGE"
	if t.wide {
		cols += "\tCLUSTER\tEXIT\tLABELS\tMESSAGE"
	}
	fmt.Fprintln(t.tw, cols)
}

// row is one line of the table.
type row struct {
	id, namespace, name, phase, reason string
	attempts                           int
	created                            time.Time
	exit                               *int32
	labels                             map[string]string
	message                            string
	cluster                            string // the current attempt's
}

func rowOf(tk *api.Task) row {
	return row{tk.ID, tk.Namespace, tk.Name, tk.Phase, tk.Reason, tk.Attempt + 1, tk.CreatedAt, tk.ExitCode, tk.Labels, tk.Message, tk.Cluster}
}

func (t *taskTable) add(r row) {
	t.writeHeader()
	fmt.Fprintf(t.tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s", r.id, orDash(r.namespace), orDash(r.name), orDash(r.phase), orDash(r.reason), r.attempts, age(t.now(), r.created))
	if t.wide {
		fmt.Fprintf(t.tw, "\t%s\t%s\t%s\t%s", orDash(r.cluster), exitCode(r.exit), orDash(labelText(r.labels)), oneLine(r.message, 80))
	}
	fmt.Fprintln(t.tw)
}

// flush writes the rows added so far (the columns align within a flush).
func (t *taskTable) flush() error { return t.tw.Flush() }

// printTask writes the human summary of a task (kubetask get): its state,
// why, the result, every attempt with its pod and times, and for a Pending
// task its pod's recent events. Times are shown in now's location.
func printTask(w io.Writer, tk *api.Task, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	field := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	when := func(t time.Time) string {
		return fmt.Sprintf("%s (%s ago)", t.In(now.Location()).Format(time.RFC3339), age(now, t))
	}
	field("ID", tk.ID)
	field("Namespace", tk.Namespace)
	field("Name", tk.Name)
	if tk.Cluster != "" {
		field("Cluster", tk.Cluster)
	}
	if len(tk.Labels) > 0 {
		field("Labels", labelText(tk.Labels))
	}
	if tk.Origin != "" {
		field("Rerun of", tk.Origin)
	}
	st := state(tk.Phase, tk.Reason)
	switch {
	case tk.Terminal:
		st += " (final)"
	case tk.CancelledAt != nil:
		st += " (cancelling)"
	}
	field("State", st)
	if tk.Message != "" {
		field("Message", tk.Message)
	}
	if tk.ExitCode != nil {
		field("Exit code", exitCode(tk.ExitCode))
	}
	if r := tk.ResultBytes(); r != nil {
		field("Result", resultText(tk))
	}
	field("Created", when(tk.CreatedAt))
	if !tk.UpdatedAt.IsZero() {
		field("Updated", when(tk.UpdatedAt))
	}
	if tk.CancelledAt != nil {
		field("Cancelled", when(*tk.CancelledAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(tk.Attempts) > 0 {
		fmt.Fprintln(w, "Attempts:")
		at := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		clusters := slices.ContainsFunc(tk.Attempts, func(a api.Attempt) bool { return a.Cluster != "" })
		if clusters {
			fmt.Fprintln(at, "  ATTEMPT\tCLUSTER\tPOD\tSTATE\tEXIT\tFINISHED\tMESSAGE")
		} else {
			fmt.Fprintln(at, "  ATTEMPT\tPOD\tSTATE\tEXIT\tFINISHED\tMESSAGE")
		}
		for _, a := range tk.Attempts {
			finished := "-"
			if a.FinishedAt != nil {
				finished = age(now, *a.FinishedAt) + " ago"
			}
			st := state(a.Phase, a.Reason)
			if a.Retryable {
				st += " (retried)"
			}
			fmt.Fprintf(at, "  %d\t", a.Attempt)
			if clusters {
				fmt.Fprintf(at, "%s\t", orDash(a.Cluster))
			}
			fmt.Fprintf(at, "%s\t%s\t%s\t%s\t%s\n", orDash(a.Pod), orDash(st), exitCode(a.ExitCode), finished, oneLine(a.Message, 100))
		}
		if err := at.Flush(); err != nil {
			return err
		}
	}
	if tk.Phase == "Pending" && !tk.Terminal {
		if len(tk.Events) == 0 {
			fmt.Fprintf(w, "Pending: %s; no pod events yet\n", orDash(tk.Reason))
			return nil
		}
		fmt.Fprintf(w, "Pending: %s; recent events of the pod:\n", orDash(tk.Reason))
		et := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(et, "  LAST SEEN\tTYPE\tREASON\tCOUNT\tMESSAGE")
		for _, e := range tk.Events {
			fmt.Fprintf(et, "  %s ago\t%s\t%s\t%d\t%s\n", age(now, e.LastSeen), e.Type, e.Reason, max(e.Count, 1), oneLine(e.Message, 120))
		}
		return et.Flush()
	}
	return nil
}

// resultText renders a task's result on one line: as is when it is short
// text, else its size (-o json shows it whole).
func resultText(tk *api.Task) string {
	r := tk.ResultBytes()
	if tk.ResultBase64 != nil {
		return fmt.Sprintf("%d bytes, not UTF-8 (-o json shows it, base64)", len(r))
	}
	text := strings.TrimRight(tk.Result, "\n")
	if len(text) > 200 || strings.Contains(text, "\n") {
		return fmt.Sprintf("%d bytes (-o json shows it)", len(r))
	}
	return text
}

// shellWord is s as one word of a POSIX shell command line: as it is when it
// holds only characters no shell treats specially, else in single quotes
// (a task ID may hold spaces, '$', quotes...), so that a printed command can
// be pasted.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:+,@%=/") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
