package cli

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTunesGC(t *testing.T) {
	tests := map[string]struct {
		gogc    string
		tune    bool
		wantErr bool
	}{
		"unset: serve tunes it":         {"", true, false},
		"a number stands":               {"150", false, false},
		"off stands":                    {"off", false, false},
		"negative stands (off)":         {"-1", false, false},
		"OFF: the runtime would ignore": {"OFF", false, true},
		"not a number":                  {"fast", false, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tune, err := tunesGC(tc.gogc)
			if (err != nil) != tc.wantErr {
				t.Fatalf("tunesGC(%q) error %v, want error %v", tc.gogc, err, tc.wantErr)
			}
			if tune != tc.tune {
				t.Errorf("tunesGC(%q) = %v, want %v", tc.gogc, tune, tc.tune)
			}
		})
	}
}

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	tests := map[string]struct {
		live uint64
		want int
	}{
		"not known yet":                         {0, ServeGCPercent},
		"small heap":                            {20 * mib, ServeGCPercent},
		"64 MiB: 256 MiB of garbage":            {64 * mib, ServeGCPercent},
		"128 MiB: still 256 MiB of garbage":     {128 * mib, 200},
		"200 MiB":                               {200 * mib, 128},
		"256 MiB: the runtime's default":        {256 * mib, 100},
		"a large heap never goes below default": {4096 * mib, 100},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := gcPercentFor(tc.live); got != tc.want {
				t.Errorf("gcPercentFor(%d MiB) = %d, want %d", tc.live/mib, got, tc.want)
			}
		})
	}
}

// TestCPUProfile: serve's hidden --cpu-profile writes a profile, and names the flag when the file cannot be created.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f) // a profile is a gzipped protocol buffer
	if err != nil {
		t.Fatalf("the profile is not one: %v", err)
	}
	if b, err := io.ReadAll(z); err != nil || len(b) == 0 {
		t.Errorf("the profile is empty or broken: %d bytes, %v", len(b), err)
	}
	if _, err := startCPUProfile(filepath.Join(t.TempDir(), "missing", "cpu.pprof")); err == nil || !strings.Contains(err.Error(), "--cpu-profile") {
		t.Errorf("err %v, want one naming --cpu-profile", err)
	}
}
