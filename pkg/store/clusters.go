package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
)

// The types below are the store's part of running tasks on several
// clusters (docs/multicluster.md): each cluster's row (its state, since
// when and why, its labels and mode), and the guarded move of a task that
// has no pod from one executor instance (hence cluster) to another.

// ClusterState is a cluster's state, as kept in its row. Placement reads
// it: tasks are placed only on a Ready cluster.
type ClusterState string

const (
	// ClusterReady is a cluster that answers; tasks are placed on it.
	ClusterReady ClusterState = "Ready"
	// ClusterUnreachable is a cluster that does not answer (its API server
	// is down, it is cut off, its credentials are refused, it was removed
	// from the configuration). Its running attempts stay (quiet is not
	// lost); nothing new is placed on it and its placed tasks without a
	// pod move.
	ClusterUnreachable ClusterState = "Unreachable"
	// ClusterDraining is a cluster an operator drains: nothing new is
	// placed on it, its running attempts finish there.
	ClusterDraining ClusterState = "Draining"
	// ClusterLost is a cluster declared lost: its unfinished attempts end
	// (reason ClusterLost) and run again elsewhere.
	ClusterLost ClusterState = "Lost"
	// ClusterReturning is an unreachable or lost cluster that answers
	// again: its pods of lost attempts are being stopped and recorded.
	// Nothing is placed on it until it is Ready.
	ClusterReturning ClusterState = "Returning"
)

// ClusterStates are the states a cluster's row may hold.
var ClusterStates = []ClusterState{ClusterReady, ClusterUnreachable, ClusterDraining, ClusterLost, ClusterReturning}

// ClusterMode says which processes run a cluster's executor instances.
type ClusterMode string

const (
	// ClusterPush is the mode of a cluster whose instances the service's
	// replicas run, each with a client of the cluster (the default).
	ClusterPush ClusterMode = "push"
	// ClusterAgent is the mode of a cluster whose instances an agent in the
	// cluster runs (kubetask serve --agent); the replicas never do.
	ClusterAgent ClusterMode = "agent"
)

// MaxClusterNameLength is the longest cluster name.
const MaxClusterNameLength = 40

// clusterName is what a cluster name is: lower-case letters, digits and
// '-', starting and ending with a letter or digit, at most 40 characters
// (it is part of executor instance names and Kubernetes object names).
var clusterName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$`)

// ErrInvalidCluster wraps a cluster row, or a cluster name, that the store
// refuses: the error names the field and says what it may hold. Nothing is
// written.
var ErrInvalidCluster = errors.New("invalid cluster")

// ErrClaimed is returned by Move when the stored task is finished or its
// current attempt has a pod (PodCreated): the attempt belongs to the
// cluster its pod is in, so the task stays where it is. Nothing is written.
var ErrClaimed = errors.New("the task's current attempt has a pod, or the task is finished: it cannot move")

// kindError is an error in words of its own that is one of the sentinels
// (errors.Is(err, kind) holds): a cluster row not found is ErrNotFound
// without saying "task record".
type kindError struct {
	text string
	kind error
}

func (e *kindError) Error() string { return e.text }
func (e *kindError) Unwrap() error { return e.kind }

var (
	errNoCluster      = &kindError{"no such cluster", ErrNotFound}
	errClusterExists  = &kindError{"the cluster exists already", ErrConflict}
	errClusterChanged = &kindError{"the cluster changed concurrently", ErrConflict}
)

// ValidateClusterName returns nil for a valid cluster name (1 to 40
// characters: lower-case letters, digits and '-', starting and ending with
// a letter or digit), else an error that wraps ErrInvalidCluster and says
// what a name may be.
func ValidateClusterName(name string) error {
	if !clusterName.MatchString(name) {
		return fmt.Errorf("%w: name %q: want 1 to %d characters of a-z, 0-9 and '-', starting and ending with a letter or digit",
			ErrInvalidCluster, name, MaxClusterNameLength)
	}
	return nil
}

// Cluster is a cluster's row in the store, which every replica and agent of
// a group shares: the names, modes and states they all agree on.
type Cluster struct {
	// Name is the cluster's name (ValidateClusterName).
	Name string
	// State is one of ClusterStates.
	State ClusterState
	// Since is when the cluster entered State. A write whose Since is zero
	// stores the write's UpdatedAt (the state is entered by this write).
	Since time.Time
	// Reason (one word, such as CredentialsRefused) and Message (for
	// people) say why the cluster is in State; empty when Ready.
	Reason, Message string
	// Labels are the cluster's labels (region=eu, gpu=a100), for the
	// tasks' cluster selectors. nil and empty stay distinct.
	Labels map[string]string
	// Mode is ClusterPush or ClusterAgent; a write with an empty Mode
	// stores ClusterPush.
	Mode ClusterMode
	// Version increases with every write, from 1; PutCluster requires the
	// caller's copy to carry the stored one (0 to create the row).
	Version int64
	// UpdatedAt is set by the store from its clock at every write; the
	// caller's value is ignored.
	UpdatedAt time.Time
}

// DeepCopy returns a copy of c that shares no memory with c (Labels are
// copied; nil stays nil and empty stays empty).
func (c Cluster) DeepCopy() Cluster {
	c.Labels = maps.Clone(c.Labels)
	return c
}

// Clusters is implemented by the stores that keep clusters (memory, SQLite,
// PostgreSQL): the clusters' rows, and the move of a task between executor
// instances. Like Store, its implementations are safe for concurrent use,
// every write is a compare-and-swap on a version, and once a write has
// returned nil it is durable (for durable stores) and visible to every
// later read, in this process or another sharing the store.
type Clusters interface {
	// PutCluster writes c's row and returns it as stored, with Version
	// c.Version+1 and UpdatedAt from the store's clock (Since too when
	// c.Since is zero; Mode ClusterPush when empty). Version 0 creates the
	// row: ErrConflict if one of that name exists. Any other Version
	// updates the row only if it is the stored version: ErrConflict if the
	// row changed since, ErrNotFound if there is none. A row whose Name,
	// State, Mode, Version (negative) or Since (beyond the years 1678 to
	// 2262) is not valid is refused with ErrInvalidCluster, which names
	// the field and says what it may hold.
	PutCluster(ctx context.Context, c Cluster) (Cluster, error)
	// GetCluster returns the row of name, or ErrNotFound.
	GetCluster(ctx context.Context, name string) (Cluster, error)
	// ListClusters returns every row, ordered by name.
	ListClusters(ctx context.Context) ([]Cluster, error)
	// Move writes rec with Executor and Cluster set to executor and
	// cluster, as Update writes it, only if, in one atomic step:
	//   - the stored record's version is rec.Version and it is the same use
	//     of the ID: its nonce is rec.Nonce, or it has none (else
	//     ErrConflict; ErrNotFound if there is none);
	//   - the stored record is not Terminal and its current attempt has no
	//     pod, PodCreated false (else ErrClaimed);
	//   - when rec.Epoch is not 0 (a fenced move), rec.Epoch is the current
	//     term epoch of executor, the instance the record will name, exactly
	//     as Update fences (else ErrFenced). Epoch is stored as rec carries
	//     it: 0, an unfenced write, unless the caller set it.
	// The refusals are told in that order, and a refused move writes
	// nothing. It returns the stored record with the new version. rec
	// itself must not be Terminal nor have PodCreated set (ErrClaimed), and
	// cluster must be "" or a valid cluster name (ErrInvalidCluster); the
	// store does not require a row of that cluster.
	//
	// After a move, a creation of the old instance still on its way finds,
	// at its claim (an Update from the version it read), a record whose
	// version moved: ErrConflict, so its pod is never the attempt's.
	Move(ctx context.Context, rec Record, executor, cluster string) (Record, error)
}

var (
	_ Clusters = (*memory)(nil)
	_ Clusters = (*sqliteStore)(nil)
	_ Clusters = (*postgresStore)(nil)
)

// storable checks c and returns it as a store writes it at now: Mode
// defaulted, Since set when zero, UpdatedAt now, Labels its own.
func (c Cluster) storable(now time.Time) (Cluster, error) {
	if err := ValidateClusterName(c.Name); err != nil {
		return Cluster{}, err
	}
	if !slices.Contains(ClusterStates, c.State) {
		states := make([]string, len(ClusterStates))
		for i, st := range ClusterStates {
			states[i] = string(st)
		}
		return Cluster{}, fmt.Errorf("%w %s: state %q: want one of %s", ErrInvalidCluster, c.Name, c.State, strings.Join(states, ", "))
	}
	switch c.Mode {
	case "":
		c.Mode = ClusterPush
	case ClusterPush, ClusterAgent:
	default:
		return Cluster{}, fmt.Errorf("%w %s: mode %q: want %s or %s (empty: %[4]s)", ErrInvalidCluster, c.Name, c.Mode, ClusterPush, ClusterAgent)
	}
	if c.Version < 0 {
		return Cluster{}, fmt.Errorf("%w %s: version %d: want 0 to create the row, or the stored version", ErrInvalidCluster, c.Name, c.Version)
	}
	if c.Since.IsZero() {
		c.Since = now
	}
	if !inUnixNanoRange(c.Since) {
		return Cluster{}, fmt.Errorf("%w %s: since %v: out of the storable range (years 1678 to 2262)", ErrInvalidCluster, c.Name, c.Since)
	}
	c.UpdatedAt = now
	return c.DeepCopy(), nil
}

// clusterWriteRefused tells why a PutCluster of c was not applied to a row
// stored at version stored (found: whether there is one).
func clusterWriteRefused(c Cluster, stored int64, found bool) error {
	switch {
	case c.Version == 0 && found:
		return fmt.Errorf("version 0 (create), stored %d: %w", stored, errClusterExists)
	case !found:
		return fmt.Errorf("version %d: %w", c.Version, errNoCluster)
	default:
		return fmt.Errorf("version %d, stored %d: %w", c.Version, stored, errClusterChanged)
	}
}

// moving returns rec as Move writes it (on executor, in cluster), or why
// it may not be written at all.
func moving(rec Record, executor, cluster string) (Record, error) {
	if cluster != "" {
		if err := ValidateClusterName(cluster); err != nil {
			return Record{}, fmt.Errorf("task record %s move: cluster: %w", rec.ID, err)
		}
	}
	if rec.Terminal || rec.PodCreated {
		return Record{}, fmt.Errorf("task record %s move: the record to write %s: %w", rec.ID, claimedWhy(rec.Terminal), ErrClaimed)
	}
	rec = rec.DeepCopy()
	rec.Executor, rec.Cluster = executor, cluster
	return rec, nil
}

// claimedWhy says why a record cannot move: it is finished, or its
// attempt has a pod.
func claimedWhy(terminal bool) string {
	if terminal {
		return "is finished"
	}
	return "has its current attempt's pod"
}

// moveRefused tells why a move of rec from version expected was not
// applied to the record stored at version stored with nonce storedNonce
// (terminal, podCreated): ErrConflict when the version differs or the
// stored record is another use of the ID, else ErrClaimed when it is
// finished or has a pod, else ErrFenced, the one condition left. A stored
// record at a given version with a given nonce never changes (every write
// raises the version; a record deleted and created again has another
// nonce), so a record read after the move failed tells the reason exactly,
// in a transaction or not.
func moveRefused(rec Record, expected, stored int64, storedNonce string, terminal, podCreated bool) error {
	switch {
	case stored != expected:
		return fmt.Errorf("version %d, stored %d: %w", expected, stored, ErrConflict)
	case !sameUse(storedNonce, rec.Nonce):
		return anotherUse(expected, storedNonce, rec.Nonce)
	case terminal || podCreated:
		return fmt.Errorf("the stored record %s: %w", claimedWhy(terminal), ErrClaimed)
	default:
		return fmt.Errorf("epoch %d of %s: %w", rec.Epoch, rec.Executor, ErrFenced)
	}
}

func (m *memory) PutCluster(ctx context.Context, c Cluster) (Cluster, error) {
	if err := ctx.Err(); err != nil {
		return Cluster{}, fmt.Errorf("cluster %s write: %w", c.Name, err)
	}
	c, err := c.storable(m.clock.Now().Round(0))
	if err != nil {
		return Cluster{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Cluster{}, errClosed
	}
	cur, found := m.clusters[c.Name]
	if found != (c.Version != 0) || found && cur.Version != c.Version {
		return Cluster{}, fmt.Errorf("cluster %s write: %w", c.Name, clusterWriteRefused(c, cur.Version, found))
	}
	c.Version++
	m.clusters[c.Name] = c.DeepCopy()
	return c, nil
}

func (m *memory) GetCluster(ctx context.Context, name string) (Cluster, error) {
	if err := ctx.Err(); err != nil {
		return Cluster{}, fmt.Errorf("cluster %s: %w", name, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return Cluster{}, errClosed
	}
	c, ok := m.clusters[name]
	if !ok {
		return Cluster{}, fmt.Errorf("cluster %s: %w", name, errNoCluster)
	}
	return c.DeepCopy(), nil
}

func (m *memory) ListClusters(ctx context.Context) ([]Cluster, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cluster list: %w", err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	var out []Cluster
	for _, c := range m.clusters {
		out = append(out, c.DeepCopy())
	}
	slices.SortFunc(out, func(a, b Cluster) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (m *memory) Move(ctx context.Context, rec Record, executor, cluster string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("task record %s move: %w", rec.ID, err)
	}
	rec, err := moving(rec, executor, cluster)
	if err != nil {
		return Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Record{}, errClosed
	}
	cur, ok := m.recs[rec.ID]
	if !ok {
		return Record{}, fmt.Errorf("task record %s move: %w", rec.ID, ErrNotFound)
	}
	fenced := rec.Epoch != 0 && m.epochs[rec.Executor] != rec.Epoch
	if cur.Version != rec.Version || !sameUse(cur.Nonce, rec.Nonce) || cur.Terminal || cur.PodCreated || fenced {
		return Record{}, fmt.Errorf("task record %s move to %s (cluster %q): %w", rec.ID, executor, cluster,
			moveRefused(rec, rec.Version, cur.Version, cur.Nonce, cur.Terminal, cur.PodCreated))
	}
	rec.Version = cur.Version + 1
	rec.CreatedAt = cur.CreatedAt
	rec.UpdatedAt = m.clock.Now().Round(0)
	m.recs[rec.ID] = rec
	return rec.DeepCopy(), nil
}
