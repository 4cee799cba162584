package serve

import (
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubetask/kubetask/internal/localcluster/clustertest"
)

// percentile returns the q-quantile (0 <= q <= 1) of xs by the nearest-rank
// method, 0 for no values. xs is not modified.
func percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := min(max(int(math.Ceil(q*float64(len(s)))), 1), len(s))
	return s[rank-1]
}

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i
	}
	tests := map[string]struct {
		xs   []time.Duration
		q    float64
		want time.Duration
	}{
		"empty":                   {nil, 0.5, 0},
		"one value":               {ms(7), 0.99, 7 * time.Millisecond},
		"median of an odd count":  {ms(3, 1, 2), 0.5, 2 * time.Millisecond},
		"median of an even count": {ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		"p99 of 1..100":           {ms(hundred...), 0.99, 99 * time.Millisecond},
		"p0 is the minimum":       {ms(5, 9, 1), 0, 1 * time.Millisecond},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := percentile(tc.xs, tc.q); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.xs, tc.q, got, tc.want)
			}
		})
	}
}

// concurrently calls do(i) for every i in [0, n) from clients goroutines,
// each taking the next i when its call returns. It returns each call's
// latency (by i), the span from the first call's start to the last one's
// end, and the errors.
func concurrently(n, clients int, do func(i int) error) (lat []time.Duration, span time.Duration, errs []error) {
	lat = make([]time.Duration, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for i := range next {
				t0 := time.Now()
				err := do(i)
				lat[i] = time.Since(t0)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return lat, time.Since(start), errs
}

// atRate calls do(i) for every i in [0, n) at rate calls per second, evenly
// spaced, each on a goroutine of its own: an open loop, in which no call
// waits for another. A call's latency counts from its scheduled start, so a
// driver that falls behind its schedule shows in the latencies rather than
// lowering the offered rate; late is the latest start against its schedule.
// It returns when every call has returned.
func atRate(n int, rate float64, do func(i int) error) sent {
	lat := make([]time.Duration, n)
	period := time.Duration(float64(time.Second) / rate)
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		end  time.Time
		late time.Duration
		errs []error
	)
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * period)
		time.Sleep(time.Until(at)) // the schedule, not a wait for a condition
		late = max(late, time.Since(at))
		wg.Go(func() {
			err := do(i)
			now := time.Now()
			lat[i] = now.Sub(at)
			mu.Lock()
			defer mu.Unlock()
			if now.After(end) {
				end = now
			}
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	return sent{latencies: lat, span: end.Sub(start), late: late, errs: errs}
}

// TestAtRateIsAnOpenLoop checks that atRate calls every i once, on schedule,
// without waiting for earlier calls: each call but the last returns only
// once the next one has started, which a closed loop of one client never
// does.
func TestAtRateIsAnOpenLoop(t *testing.T) {
	const n, rate = 20, 1000.0
	started := make([]chan struct{}, n)
	for i := range started {
		started[i] = make(chan struct{})
	}
	var calls [n]int
	var mu sync.Mutex
	begin := time.Now()
	at := make([]time.Time, n)
	out := atRate(n, rate, func(i int) error {
		mu.Lock()
		calls[i]++
		at[i] = time.Now()
		mu.Unlock()
		close(started[i])
		if i == n-1 {
			return nil
		}
		select {
		case <-started[i+1]:
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("call %d: call %d did not start while it ran", i, i+1)
		}
	})
	if len(out.errs) > 0 {
		t.Fatal(out.errs)
	}
	period := time.Duration(float64(time.Second) / rate)
	for i := range n {
		if calls[i] != 1 {
			t.Errorf("call %d made %d times, want 1", i, calls[i])
		}
		if early := begin.Add(time.Duration(i) * period).Sub(at[i]); early > 0 {
			t.Errorf("call %d started %v before its schedule", i, early)
		}
		if out.latencies[i] <= 0 {
			t.Errorf("call %d: latency %v", i, out.latencies[i])
		}
	}
	if least := time.Duration(n-1) * period; out.span < least {
		t.Errorf("span %v, want at least %v at %g/s", out.span, least, rate)
	}
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times
// (100 on every Linux this runs on).
const clockTicks = 100

// cpuTime reads a process's user + system CPU time from /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime (fields 14 and 15)
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// cpuMeter measures the CPU time the cluster's components, this process and
// the service (when there is one) use between start and report.
type cpuMeter struct {
	pids   map[string]int
	before map[string]time.Duration
}

func newCPUMeter(s *service) *cpuMeter {
	m := &cpuMeter{pids: map[string]int{"benchmark process": os.Getpid()}, before: map[string]time.Duration{}}
	if s != nil {
		m.pids["kubetask serve"] = s.cmd.Process.Pid
	}
	for _, p := range clustertest.Cluster().Processes() {
		m.pids[p.Name] = p.PID
	}
	return m.start()
}

// newClustersCPUMeter measures the services, this process and the
// processes of the clusters envs (each named by its namespace's cluster:
// "1 kube-apiserver", "2 kube-apiserver" ...).
func newClustersCPUMeter(svcs []*service, envs ...*clustertest.Env) *cpuMeter {
	m := &cpuMeter{pids: map[string]int{"benchmark process": os.Getpid()}, before: map[string]time.Duration{}}
	for i, s := range svcs {
		m.pids[fmt.Sprintf("kubetask serve %d", i+1)] = s.cmd.Process.Pid
	}
	for i, env := range envs {
		for _, p := range env.Cluster.Processes() {
			m.pids[fmt.Sprintf("%d %s", i+1, p.Name)] = p.PID
		}
	}
	return m.start()
}

// start reads what each process has used so far.
func (m *cpuMeter) start() *cpuMeter {
	for name, pid := range m.pids {
		if d, err := cpuTime(pid); err == nil {
			m.before[name] = d
		}
	}
	return m
}

// add measures process pid too, from now on.
func (m *cpuMeter) add(name string, pid int) {
	m.pids[name] = pid
	if d, err := cpuTime(pid); err == nil {
		m.before[name] = d
	}
}

// of returns the CPU time of the process named name since the meter
// started measuring it; 0 when there is none or it is gone.
func (m *cpuMeter) of(name string) time.Duration {
	pid, ok := m.pids[name]
	if !ok {
		return 0
	}
	d, err := cpuTime(pid)
	if err != nil {
		return 0
	}
	return d - m.before[name]
}

// report returns each process's CPU time since the meter started, most
// first, and the total.
func (m *cpuMeter) report() (string, time.Duration) {
	type use struct {
		name string
		d    time.Duration
	}
	var uses []use
	var total time.Duration
	for name, pid := range m.pids {
		d, err := cpuTime(pid)
		if err != nil {
			continue
		}
		d -= m.before[name]
		uses = append(uses, use{name, d})
		total += d
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].d > uses[j].d })
	var b strings.Builder
	for i, u := range uses {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.1f s", u.name, u.d.Seconds())
	}
	fmt.Fprintf(&b, "; total %.1f s; load average %s", total.Seconds(), loadAvg())
	return b.String(), total
}

// loadAvg is the machine's 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
