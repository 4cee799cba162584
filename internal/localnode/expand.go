package localnode

import "unicode/utf8"

// expandVars replaces $(NAME) references in s with vars[NAME], exactly as the kubelet
// expands env values, command and args: "$$" is an escaped "$", a reference to an
// undefined variable and an unterminated "$(" stay as written, and a "$" before any
// other character is kept with it.
func expandVars(s string, vars map[string]string) string {
	var out []byte
	done := 0 // s[:done] has been handled
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			continue
		}
		out = append(out, s[done:i]...)
		r, size := utf8.DecodeRuneInString(s[i+1:])
		switch r {
		case '$':
			out = append(out, '$')
			i += size
		case '(':
			end := -1
			for j := i + 2; j < len(s); j++ {
				if s[j] == ')' {
					end = j
					break
				}
			}
			if end < 0 {
				// Unterminated: keep "$(" and go on scanning after it.
				out = append(out, "$("...)
				i++
				break
			}
			name := s[i+2 : end]
			if v, ok := vars[name]; ok {
				out = append(out, v...)
			} else {
				out = append(out, s[i:end+1]...)
			}
			i = end
		default:
			// The kubelet copies the decoded rune, so an invalid UTF-8 byte after "$"
			// becomes U+FFFD.
			out = append(out, '$')
			out = utf8.AppendRune(out, r)
			i += size
		}
		done = i + 1
	}
	return string(append(out, s[done:]...))
}

// expandAll expands $(VAR) references in each of args.
func expandAll(args []string, vars map[string]string) []string {
	var out []string
	for _, a := range args {
		out = append(out, expandVars(a, vars))
	}
	return out
}
