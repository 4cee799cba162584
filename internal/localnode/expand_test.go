package localnode

import "testing"

// TestExpandVars follows the kubelet's expansion rules (its expand_test.go cases).
func TestExpandVars(t *testing.T) {
	vars := map[string]string{"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": "", "": "empty name"}
	cases := map[string]struct{ in, want string }{
		"whole string":                      {"$(VAR_A)", "A"},
		"start":                             {"$(VAR_A)-suffix", "A-suffix"},
		"end":                               {"prefix-$(VAR_A)", "prefix-A"},
		"several":                           {"$(VAR_A)$(VAR_B)-$(VAR_C)", "AB-C"},
		"empty value":                       {"x$(VAR_EMPTY)y", "xy"},
		"undefined stays":                   {"$(VAR_DOES_NOT_EXIST)", "$(VAR_DOES_NOT_EXIST)"},
		"values are not expanded again":     {"$(VAR_REF)", "$(VAR_A)"},
		"escaped":                           {"$$(VAR_A)", "$(VAR_A)"},
		"escaped dollar alone":              {"$$", "$"},
		"two escapes":                       {"$$$$(VAR_A)", "$$(VAR_A)"},
		"escape then reference":             {"$$$(VAR_A)", "$A"},
		"trailing dollar":                   {"VAR_A$", "VAR_A$"},
		"dollar alone":                      {"$", "$"},
		"dollar before another character":   {"$VAR_A", "$VAR_A"},
		"dollar before a space":             {"a $ b", "a $ b"},
		"unterminated":                      {"$(VAR_A", "$(VAR_A"},
		"unterminated then a reference":     {"$(VAR_A$(VAR_B", "$(VAR_A$(VAR_B"},
		"the name runs to the first closer": {"$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"},
		"empty name":                        {"$()", "empty name"},
		"closer alone":                      {"VAR_A)", "VAR_A)"},
		"nested parentheses":                {"$((VAR_A))", "$((VAR_A))"},
		"multi-byte rune after dollar":      {"$é$(VAR_A)", "$éA"},
		"invalid UTF-8 after dollar":        {"$\xff", "$\uFFFD"},
		"no references":                     {"plain text", "plain text"},
		"empty":                             {"", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := expandVars(tc.in, vars); got != tc.want {
				t.Errorf("expandVars(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
