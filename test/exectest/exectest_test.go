package exectest

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"k"})
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "y", Help: "y"}, []string{"k"})
	reg.MustRegister(c, g)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	g.WithLabelValues("a").Set(7)
	g.WithLabelValues("b").Set(1)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"x_total", nil, 5},
		{"x_total", []string{"k", "b"}, 3},
		{"y", nil, 8},
		{"y", []string{"k", "a"}, 7},
		{"missing_total", nil, 0},
	} {
		if got := MetricSum(reg, tc.name, tc.labels...); got != tc.want {
			t.Errorf("MetricSum(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

func TestMostAtOnce(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(1000+s), 0) }
	for name, tc := range map[string]struct {
		runs []MainRun
		want int
	}{
		"none":                                 {nil, 0},
		"one after another":                    {[]MainRun{{Start: at(0), Finish: at(2)}, {Start: at(3), Finish: at(5)}}, 1},
		"started in the second the other ends": {[]MainRun{{Start: at(0), Finish: at(2)}, {Start: at(2), Finish: at(4)}}, 1},
		"overlapping":                          {[]MainRun{{Start: at(0), Finish: at(3)}, {Start: at(2), Finish: at(4)}}, 2},
		"one never seen finished runs on":      {[]MainRun{{Start: at(0)}, {Start: at(9), Finish: at(10)}}, 2},
		"never seen started: not counted":      {[]MainRun{{}, {Start: at(1), Finish: at(2)}}, 1},
	} {
		if got := MostAtOnce(tc.runs); got != tc.want {
			t.Errorf("%s: MostAtOnce = %d, want %d", name, got, tc.want)
		}
	}
}
