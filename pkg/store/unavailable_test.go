package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestPostgresUnavailable: which PostgreSQL failures say "cannot be reached
// now, try again later" (the server answers 503) and which are verdicts on
// the call.
func TestPostgresUnavailable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"connection refused":             {refused, true},
		"connection refused, wrapped":    {fmt.Errorf("task record x: %w", refused), true},
		"administrator shutdown (57P01)": {&pgconn.PgError{Code: "57P01"}, true},
		"crash shutdown (57P02)":         {&pgconn.PgError{Code: "57P02"}, true},
		"starting up (57P03)":            {&pgconn.PgError{Code: "57P03"}, true},
		"connection failure (08006)":     {&pgconn.PgError{Code: "08006"}, true},
		"too many connections (53300)":   {&pgconn.PgError{Code: "53300"}, true},
		"connection cut":                 {io.ErrUnexpectedEOF, true},
		"unique violation (23505)":       {&pgconn.PgError{Code: "23505"}, false},
		"serialization failure (40001)":  {&pgconn.PgError{Code: "40001"}, false},
		"statement timeout (57014)":      {&pgconn.PgError{Code: "57014"}, false},
		"the caller's context ended":     {context.Canceled, false},
		"the caller's deadline":          {fmt.Errorf("acquire: %w", context.DeadlineExceeded), false},
		"not found":                      {ErrNotFound, false},
		"conflict":                       {ErrConflict, false},
		"an error of the store's own":    {errors.New("archive corrupt"), false},
		"a closed store":                 {errClosed, false},
	} {
		t.Run(name, func(t *testing.T) {
			err := unavailable(tc.err)
			if got := errors.Is(err, ErrUnavailable); got != tc.want {
				t.Fatalf("unavailable(%v) is ErrUnavailable: %v, want %v", tc.err, got, tc.want)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("unavailable(%v) = %v lost the error", tc.err, err)
			}
		})
	}
}
