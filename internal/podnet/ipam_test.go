package podnet

import (
	"errors"
	"net/netip"
	"testing"
)

func TestIPAM(t *testing.T) {
	tests := map[string]struct {
		prefix  string
		ops     []string // "a" allocates, "r<addr>" releases
		want    []string // addresses the allocations return, in order ("!" for exhausted)
		wantErr bool
	}{
		"first addresses after the gateway":   {prefix: "10.244.3.0/24", ops: []string{"a", "a", "a"}, want: []string{"10.244.3.2", "10.244.3.3", "10.244.3.4"}},
		"a prefix not masked is masked":       {prefix: "10.244.3.77/24", ops: []string{"a"}, want: []string{"10.244.3.2"}},
		"a /30 has one pod address":           {prefix: "10.0.0.0/30", ops: []string{"a", "a"}, want: []string{"10.0.0.2", "!"}},
		"released address not reused at once": {prefix: "10.0.0.0/29", ops: []string{"a", "a", "r10.0.0.2", "a"}, want: []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"}},
		"wraps round to released addresses":   {prefix: "10.0.0.0/29", ops: []string{"a", "a", "a", "a", "a", "a", "r10.0.0.3", "a", "a"}, want: []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "!", "10.0.0.3", "!"}},
		"never the broadcast address":         {prefix: "192.168.7.0/30", ops: []string{"a", "a"}, want: []string{"192.168.7.2", "!"}},
		"a /31 is refused":                    {prefix: "10.0.0.0/31", wantErr: true},
		"IPv6 is refused":                     {prefix: "fd00::/64", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			m, err := newIPAM(netip.MustParsePrefix(tt.prefix))
			if (err != nil) != tt.wantErr {
				t.Fatalf("newIPAM(%s) error %v, want error %v", tt.prefix, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			var got []string
			for _, op := range tt.ops {
				if op != "a" {
					m.release(netip.MustParseAddr(op[1:]))
					continue
				}
				a, err := m.allocate()
				switch {
				case errors.Is(err, errExhausted):
					got = append(got, "!")
				case err != nil:
					t.Fatalf("allocate: %v", err)
				default:
					got = append(got, a.String())
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestGatewayAndBroadcast(t *testing.T) {
	for _, tt := range []struct{ prefix, gw, bc string }{
		{"10.244.3.0/24", "10.244.3.1", "10.244.3.255"},
		{"10.244.0.0/16", "10.244.0.1", "10.244.255.255"},
		{"10.0.0.8/29", "10.0.0.9", "10.0.0.15"},
	} {
		p := netip.MustParsePrefix(tt.prefix)
		if g := gateway(p).String(); g != tt.gw {
			t.Errorf("gateway(%s) = %s, want %s", tt.prefix, g, tt.gw)
		}
		if b := broadcast(p).String(); b != tt.bc {
			t.Errorf("broadcast(%s) = %s, want %s", tt.prefix, b, tt.bc)
		}
	}
}
