package run

import (
	"debug/elf"
	"testing"
)

// TestBinaryIsStatic: the kubetask binary the tests run is built as `make
// build` builds it, without cgo: no program interpreter, no shared
// library, so no libc mapped into each `kubetask run` (1.3 MiB of its
// peak RSS, docs/benchmarks.md).
func TestBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(kubetaskBin(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a program interpreter: it is dynamically linked")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil {
		t.Fatal(err)
	} else if len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
}
