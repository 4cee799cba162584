package cli

import "testing"

func TestServeGCPercent(t *testing.T) {
	tests := map[string]struct {
		gogc    string
		percent int
		ok      bool
		wantErr bool
	}{
		"unset: serve's default":        {"", ServeGCPercent, true, false},
		"a number stands":               {"150", 0, false, false},
		"off stands":                    {"off", 0, false, false},
		"OFF: the runtime would ignore": {"OFF", 0, false, true},
		"negative stands (off)":         {"-1", 0, false, false},
		"not a number":                  {"fast", 0, false, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, ok, err := serveGCPercent(tc.gogc)
			if (err != nil) != tc.wantErr {
				t.Fatalf("serveGCPercent(%q) error %v, want error %v", tc.gogc, err, tc.wantErr)
			}
			if p != tc.percent || ok != tc.ok {
				t.Errorf("serveGCPercent(%q) = %d, %v; want %d, %v", tc.gogc, p, ok, tc.percent, tc.ok)
			}
		})
	}
}
