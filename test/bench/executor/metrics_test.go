package executor

import (
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// families parses a Prometheus text exposition; nil if it does not parse.
func families(text string) map[string]*dto.MetricFamily {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil
	}
	return fams
}

// value is a counter's, gauge's or untyped sample's value; 0 for other types.
func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// labels is m's labels by name.
func labels(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// sumSeries sums the samples of metric name in a Prometheus text exposition.
func sumSeries(text, name string) float64 {
	sum := 0.0
	if f := families(text)[name]; f != nil {
		for _, m := range f.GetMetric() {
			sum += value(m)
		}
	}
	return sum
}

// requestsByVerb sums apiserver_request_total in a text exposition by
// "VERB resource[/subresource]".
func requestsByVerb(text string) map[string]float64 {
	by := map[string]float64{}
	f := families(text)["apiserver_request_total"]
	for _, m := range f.GetMetric() {
		l := labels(m)
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		by[key] += value(m)
	}
	return by
}
