package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubetask/kubetask/pkg/store"
)

// Task is one task as the store holds it: its record and its archived logs.
type Task struct {
	Record store.Record
	Logs   []Log
}

// Log is one archived container log: its key, its info and its last bytes
// (up to TailBytes), which show a marker line when the archive ended it.
type Log struct {
	Key  store.LogKey
	Info store.LogInfo
	Tail string
}

// TailBytes is how much of each log's end ReadStore reads.
const TailBytes = 512

// ReadStore reads every record of st and, when st keeps logs (store.Logs),
// each record's archived logs with their last TailBytes.
func ReadStore(ctx context.Context, st store.Store) ([]Task, error) {
	recs, err := st.List(ctx, store.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the store's records: %w", err)
	}
	logs, _ := st.(store.Logs)
	out := make([]Task, 0, len(recs))
	for _, rec := range recs {
		t := Task{Record: rec}
		if logs != nil {
			keys, err := logs.LogKeys(ctx, rec.ID)
			if err != nil {
				return nil, fmt.Errorf("listing the logs of %s: %w", rec.ID, err)
			}
			for _, k := range keys {
				_, info, err := logs.ReadLog(ctx, k, 0, 0)
				if err != nil && !errors.Is(err, store.ErrNotFound) {
					return nil, fmt.Errorf("reading log %v: %w", k, err)
				}
				from := max(info.Size-TailBytes, 0)
				tail, _, err := logs.ReadLog(ctx, k, from, TailBytes)
				if err != nil && !errors.Is(err, store.ErrNotFound) {
					return nil, fmt.Errorf("reading log %v: %w", k, err)
				}
				t.Logs = append(t.Logs, Log{Key: k, Info: info, Tail: string(tail)})
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// SaveInput writes what Check read besides the audit log (the tasks, the
// namespaces and the pods left) to dir/input.json, so that a run can be
// judged again (LoadInput) with the audit log kept beside it.
func SaveInput(dir string, in Input) error {
	data, err := json.Marshal(savedInput{Tasks: in.Tasks, Namespaces: in.Namespaces, Left: in.Left})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "input.json"), data, 0o600)
}

// LoadInput reads dir/input.json and dir/audit.log back into an Input.
func LoadInput(dir string) (Input, error) {
	data, err := os.ReadFile(filepath.Join(dir, "input.json")) //nolint:gosec // a run directory of the developer's own choosing
	if err != nil {
		return Input{}, err
	}
	var s savedInput
	if err := json.Unmarshal(data, &s); err != nil {
		return Input{}, fmt.Errorf("decoding %s: %w", filepath.Join(dir, "input.json"), err)
	}
	f, err := os.Open(filepath.Join(dir, "audit.log")) //nolint:gosec // a run directory of the developer's own choosing
	if err != nil {
		return Input{}, err
	}
	defer f.Close()
	a, err := ReadAudit(f)
	if err != nil {
		return Input{}, err
	}
	return Input{Audit: a, Tasks: s.Tasks, Namespaces: s.Namespaces, Left: s.Left}, nil
}

type savedInput struct {
	Tasks      []Task       `json:"tasks"`
	Namespaces []string     `json:"namespaces"`
	Left       []corev1.Pod `json:"left"`
}
