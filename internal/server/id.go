package server

import (
	"crypto/rand"
	"encoding/binary"
	"sync"

	"k8s.io/utils/clock"
)

// crockford is Crockford's base32 alphabet in lowercase: its characters sort
// in ASCII order, so encoded IDs sort like the numbers they encode.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// IDPrefix starts every ID the server makes: a letter, so that the ID is a
// valid label value and never looks like a number.
const IDPrefix = "t"

// idSource makes task IDs that sort by creation time: the prefix and a
// lowercase ULID (48 bits of milliseconds, 80 random bits), 27 characters.
// IDs made in the same millisecond increase by one in their random part, so
// one process's IDs strictly increase.
type idSource struct {
	clock clock.PassiveClock

	mu     sync.Mutex
	lastMs uint64
	hi     uint16 // the random part's top 16 bits
	lo     uint64 // and its low 64 bits
}

func newIDSource(clk clock.PassiveClock) *idSource { return &idSource{clock: clk} }

func (s *idSource) next() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms := uint64(max(s.clock.Now().UnixMilli(), 0))
	if ms <= s.lastMs {
		// Same millisecond (or a clock that stepped back): count on from
		// the last ID so that IDs keep increasing.
		ms = s.lastMs
		s.lo++
		if s.lo == 0 {
			s.hi++
		}
	} else {
		var b [10]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic("reading random bytes: " + err.Error()) // crypto/rand never fails on supported platforms
		}
		// Leave headroom so that counting on within a millisecond does not
		// wrap the random part.
		s.hi = binary.BigEndian.Uint16(b[:2]) >> 1
		s.lo = binary.BigEndian.Uint64(b[2:])
	}
	s.lastMs = ms
	var raw [16]byte
	var msb [8]byte
	binary.BigEndian.PutUint64(msb[:], ms)
	copy(raw[:6], msb[2:]) // the low 48 bits, as in a UUIDv7
	binary.BigEndian.PutUint16(raw[6:8], s.hi)
	binary.BigEndian.PutUint64(raw[8:], s.lo)
	return IDPrefix + encodeULID(raw)
}

// encodeULID writes 128 bits as 26 base32 characters (the first holds 3 bits).
func encodeULID(b [16]byte) string {
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}
