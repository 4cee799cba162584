// Package podlogtest is a fake kubelet for tests of log readers: a
// container's log as CRI records, served as the kubelet serves them
// (k8s.io/cri-client/pkg/logs ReadLogs), either as bytes (Serve) or through a
// fake API server that client-go talks to over HTTP (Kubelet), with container
// restarts, log rotation, broken streams and pod deletion.
package podlogtest

import (
	"bytes"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Record is one CRI log record: a line, or a piece of one (Partial).
type Record struct {
	Time    time.Time
	Partial bool
	Text    []byte
}

// T0 is a convenient time for the first record of a test log.
var T0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Split cuts what a container wrote into records like containerd does: one
// per line, lines over maxRecord bytes split into partial records, an
// unterminated last line a partial record. Record i is stamped at(i).
func Split(out []byte, maxRecord int, at func(i int) time.Time) []Record {
	var recs []Record
	add := func(partial bool, text []byte) {
		recs = append(recs, Record{Time: at(len(recs)), Partial: partial, Text: text})
	}
	for len(out) > 0 {
		i := bytes.IndexByte(out, '\n')
		switch {
		case i >= 0 && i <= maxRecord:
			add(false, out[:i])
			out = out[i+1:]
		case len(out) > maxRecord:
			add(true, out[:maxRecord])
			out = out[maxRecord:]
		default:
			add(true, out)
			out = nil
		}
	}
	return recs
}

// Every returns a stamping function for Split: records come in groups of
// group records with the same stamp, group g at start + g*step.
func Every(start time.Time, step time.Duration, group int) func(int) time.Time {
	return func(i int) time.Time { return start.Add(time.Duration(i/group) * step) }
}

// Bytes is what the container wrote to produce recs.
func Bytes(recs []Record) []byte {
	var b bytes.Buffer
	for _, r := range recs {
		b.Write(r.Text)
		if !r.Partial {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// timeFormat is the kubelet's timestamp format (timestamps=true).
const timeFormat = "2006-01-02T15:04:05.000000000Z07:00"

// Serve is the kubelet's ReadLogs with timestamps: records before since are
// skipped one by one (since has whole seconds, as sinceTime on the wire), and
// a record gets the timestamp prefix when the record before it (skipped or
// not) ended a line; the first record always does.
func Serve(recs []Record, since *metav1.Time) []byte {
	b, _ := serve(nil, recs, sinceOf(since), true, true)
	return b
}

func sinceOf(since *metav1.Time) time.Time {
	if since == nil {
		return time.Time{}
	}
	return time.Unix(since.Unix(), 0)
}

// serve appends recs as served from `from` to b; newLine says whether the
// record before recs ended a line. It returns whether the last record did.
func serve(b []byte, recs []Record, from time.Time, newLine, timestamps bool) ([]byte, bool) {
	for _, r := range recs {
		if !r.Time.Before(from) {
			if newLine && timestamps {
				b = r.Time.AppendFormat(b, timeFormat)
				b = append(b, ' ')
			}
			b = append(b, r.Text...)
			if !r.Partial {
				b = append(b, '\n')
			}
		}
		// As the original fake: an empty partial record counts as a line end.
		newLine = !r.Partial || len(r.Text) == 0
	}
	return b, newLine
}
