package podnet

import (
	"net/netip"
	"strings"
	"testing"
)

func TestPickSubnet(t *testing.T) {
	p := netip.MustParsePrefix
	tests := map[string]struct {
		pool    string
		bits    int
		start   uint32
		taken   []netip.Prefix
		want    string
		wantErr string
	}{
		"first when nothing is taken":     {pool: "10.244.0.0/16", bits: 24, want: "10.244.0.0/24"},
		"start picks the subnet":          {pool: "10.244.0.0/16", bits: 24, start: 7, want: "10.244.7.0/24"},
		"start wraps round the pool":      {pool: "10.244.0.0/16", bits: 24, start: 256 + 3, want: "10.244.3.0/24"},
		"skips a subnet another node has": {pool: "10.244.0.0/16", bits: 24, start: 7, taken: []netip.Prefix{p("10.244.7.1/24")}, want: "10.244.8.0/24"},
		"skips one a host address is in":  {pool: "10.244.0.0/16", bits: 24, taken: []netip.Prefix{p("10.244.0.9/32")}, want: "10.244.1.0/24"},
		"skips what a wider route covers": {pool: "10.244.0.0/22", bits: 24, taken: []netip.Prefix{p("10.244.0.0/23")}, want: "10.244.2.0/24"},
		"wraps to the start of the pool":  {pool: "10.244.0.0/23", bits: 24, start: 1, taken: []netip.Prefix{p("10.244.1.0/24")}, want: "10.244.0.0/24"},
		"unrelated routes do not matter":  {pool: "10.244.0.0/16", bits: 24, taken: []netip.Prefix{p("192.0.2.0/24"), p("10.0.0.0/24")}, want: "10.244.0.0/24"},
		"a full pool is an error":         {pool: "10.244.0.0/23", bits: 24, taken: []netip.Prefix{p("10.244.0.0/16")}, wantErr: "no free /24 left"},
		"subnet larger than the pool":     {pool: "10.244.0.0/24", bits: 16, wantErr: "cannot split"},
		"IPv6 pool":                       {pool: "fd00::/48", bits: 64, wantErr: "cannot split"},
		"too small a subnet":              {pool: "10.244.0.0/16", bits: 31, wantErr: "cannot split"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := pickSubnet(p(tt.pool), tt.bits, tt.start, tt.taken)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("pickSubnet = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got.String() != tt.want {
				t.Fatalf("pickSubnet = %v, %v; want %s", got, err, tt.want)
			}
		})
	}
}

func TestNamesFitLinux(t *testing.T) {
	for _, n := range []string{BridgeName("/very/long/" + strings.Repeat("x", 200)), vethName("0b5e4a43-7d1c-4b8e-9d55-0f1e2a3b4c5d")} {
		if len(n) > 15 {
			t.Errorf("interface name %q is longer than 15 bytes", n)
		}
	}
	if BridgeName("/a") == BridgeName("/b") {
		t.Error("two node directories give the same bridge name")
	}
	if dir := "/a"; BridgeName(dir) != BridgeName(dir+"") {
		t.Error("the bridge name of a directory changes")
	}
}
