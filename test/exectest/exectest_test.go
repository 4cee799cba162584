package exectest

import (
	"testing"

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
