package podlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// The resume cursor, version 1:
//
//	byte     version (1)
//	byte     flags: 1 = a line was begun (the fields below follow),
//	               2 = the line after the counted ones is delivered in part
//	varint   Unix seconds of the last line's timestamp
//	uvarint  its nanoseconds (< 1e9)
//	uvarint  complete lines with exactly that timestamp delivered
//	uvarint  bytes delivered of the line in part (only with flag 2)
//
// Encodings are canonical: a cursor is accepted only if it is exactly what
// Cursor would return for the position it decodes to.
const cursorVersion = 1

const (
	flagBegun = 1 << iota
	flagOpen
)

// ErrBadCursor is returned (wrapped) by New when Config.Resume is not a
// cursor that this version of the package wrote: another version's, another
// program's or damaged bytes. Resuming from it is impossible; retrying does
// not help.
var ErrBadCursor = errors.New("podlog: bad resume cursor")

// appendPosition appends the cursor of what was delivered: the position
// without the held bytes of the open line.
func (c *cursor) appendPosition(b []byte) []byte {
	b = append(b, cursorVersion)
	if c.last.IsZero() {
		return append(b, 0)
	}
	flags := byte(flagBegun)
	if c.open {
		flags |= flagOpen
	}
	b = append(b, flags)
	b = binary.AppendVarint(b, c.last.Unix())
	b = binary.AppendUvarint(b, uint64(c.last.Nanosecond())) // #nosec G115 -- in [0, 1e9)
	b = binary.AppendUvarint(b, uint64(max(c.atLast, 0)))    // #nosec G115 -- non-negative
	if c.open {
		b = binary.AppendUvarint(b, uint64(max(c.offset-len(c.held), 0))) // #nosec G115 -- non-negative
	}
	return b
}

// decodePosition sets the cursor's position from b (empty: the beginning).
func (c *cursor) decodePosition(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadCursor, fmt.Sprintf(format, args...))
	}
	if b[0] != cursorVersion {
		return bad("version %d, want %d", b[0], cursorVersion)
	}
	if len(b) < 2 {
		return bad("truncated")
	}
	flags, rest := b[1], b[2:]
	if flags&^(flagBegun|flagOpen) != 0 || flags == flagOpen {
		return bad("flags %#x", flags)
	}
	var d cursor
	if flags&flagBegun != 0 {
		sec, n := binary.Varint(rest)
		if n <= 0 {
			return bad("timestamp seconds")
		}
		rest = rest[n:]
		var nums [3]uint64
		count := 2
		if flags&flagOpen != 0 {
			count = 3
		}
		for i := range count {
			v, n := binary.Uvarint(rest)
			if n <= 0 || v > math.MaxInt {
				return bad("field %d", i+3)
			}
			nums[i] = v
			rest = rest[n:]
		}
		if nums[0] >= 1e9 {
			return bad("nanoseconds %d", nums[0])
		}
		d.last = time.Unix(sec, int64(nums[0])).UTC() //nolint:gosec // below 1e9, checked above
		if y := d.last.Year(); y < 1970 || y > 9999 {
			return bad("timestamp %d s out of range", sec)
		}
		d.atLast, d.open, d.offset = int(nums[1]), flags&flagOpen != 0, int(nums[2]) //nolint:gosec // at most MaxInt, checked above
		if !d.open && d.atLast == 0 {
			// The position is set when a line begins: it is open or counted.
			return bad("no line at its timestamp")
		}
	}
	if len(rest) > 0 {
		return bad("%d trailing bytes", len(rest))
	}
	if !bytes.Equal(d.appendPosition(nil), b) {
		return bad("not canonical")
	}
	c.last, c.atLast, c.open, c.offset = d.last, d.atLast, d.open, d.offset
	return nil
}
