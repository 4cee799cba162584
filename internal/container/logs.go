package container

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// maxLogLine is the longest log record; longer lines are split into partial (P)
// records, as container runtimes do (containerd's max_container_log_line_size).
const maxLogLine = 16 * 1024

// timeFormatOut is the kubelet's format for the timestamps it serves
// (k8s.io/cri-client/pkg/logs: RFC3339Nano with a fixed width), whatever the
// format in the file.
const timeFormatOut = "2006-01-02T15:04:05.000000000Z07:00"

// logWriter appends CRI-format records to a container's log file and wakes readers
// that follow it.
type logWriter struct {
	mu      sync.Mutex
	f       *os.File
	changed chan struct{} // closed (and replaced) on every write and on close
	closed  bool
	copiers sync.WaitGroup
}

func createLog(path string) (*logWriter, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create log directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create log file: %w", err)
	}
	return &logWriter{f: f, changed: make(chan struct{})}, nil
}

// watch returns a channel closed at the next write or close, and whether the log is
// already closed.
func (l *logWriter) watch() (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed, l.closed
}

func (l *logWriter) write(stream string, partial bool, text []byte) {
	tag := "F"
	if partial {
		tag = "P"
	}
	var b bytes.Buffer
	b.Grow(len(text) + 48)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	// Stamped under the lock, so that the file's order is the time order of its
	// records (stdout and stderr are copied concurrently): a reader resuming from
	// a time (sinceTime) then finds every later record after it.
	b.WriteString(time.Now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(stream)
	b.WriteByte(' ')
	b.WriteString(tag)
	b.WriteByte(' ')
	b.Write(text)
	b.WriteByte('\n')
	_, _ = l.f.Write(b.Bytes())
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *logWriter) copyStreams(stdout, stderr *os.File) {
	for _, s := range []struct {
		name string
		f    *os.File
	}{{"stdout", stdout}, {"stderr", stderr}} {
		l.copiers.Add(1)
		go func() {
			defer l.copiers.Done()
			defer s.f.Close()
			l.copy(s.name, s.f)
		}()
	}
}

// copy turns one output stream into records as containerd's CRI plugin does
// (internal/cri/io/logger.go, redirectLogs): a full (F) record per line, without
// its newline and without the CR of a CRLF ending; a line longer than maxLogLine
// in partial (P) records of maxLogLine bytes, then the rest; the unterminated
// last line a partial record, so that it is served without a newline.
func (l *logWriter) copy(stream string, r io.Reader) {
	br := bufio.NewReaderSize(r, 4096)
	var line []byte // what was read of the current line and not written yet
	for {
		chunk, err := br.ReadSlice('\n')
		ended := err == nil
		switch {
		case ended:
			chunk = bytes.TrimSuffix(chunk[:len(chunk)-1], []byte("\r"))
		case errors.Is(err, bufio.ErrBufferFull):
			err = nil
			if n := len(chunk); n > 1 && chunk[n-1] == '\r' {
				// The CR may begin a CRLF: keep it for the next read.
				_ = br.UnreadByte()
				chunk = chunk[:n-1]
			}
		}
		line = append(line, chunk...)
		if len(line) > maxLogLine {
			l.write(stream, true, line[:maxLogLine])
			line = append(line[:0], line[maxLogLine:]...)
		}
		switch {
		case ended:
			l.write(stream, false, line)
			line = line[:0]
		case err != nil:
			if len(line) > 0 {
				l.write(stream, true, line)
			}
			return
		}
	}
}

// drain waits up to timeout for the output pipes to reach EOF, then closes the log.
// Pipes still open after the timeout are abandoned; their copiers end when the
// last writer exits.
func (l *logWriter) drain(timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		l.copiers.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	l.close()
}

func (l *logWriter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	_ = l.f.Close()
	close(l.changed)
}

// LogOptions select what ReadLog writes, with the meaning of the kubelet's
// container log options.
type LogOptions struct {
	// Follow keeps writing new records until the container exits (its log closes)
	// or the context ends.
	Follow bool
	// Timestamps prefixes each line with the time of its first record and a space
	// (fixed-width RFC3339Nano), as the kubelet does.
	Timestamps bool
	// SinceTime skips records written before it, one by one (so a line split
	// into records may begin in the middle, without a timestamp, as with the
	// kubelet). Zero means from the start.
	SinceTime time.Time
	// TailLines, when >= 0, starts at the last TailLines records of the file.
	TailLines int64
	// LimitBytes, when > 0, stops after writing that many bytes.
	LimitBytes int64
}

// ErrLimitReached ends a log read that wrote LogOptions.LimitBytes bytes.
var errLimitReached = errors.New("log byte limit reached")

// ReadLog writes this instance's log to w as the kubelet would serve it: record texts
// (with a newline after each full record), with Timestamps the record's time
// before each line (not before the records that continue one). With Follow it
// returns when the container has exited and its log is complete.
func (p *Process) ReadLog(ctx context.Context, opts LogOptions, w io.Writer) error {
	return readLog(ctx, p.spec.LogPath, p.log, opts, w)
}

// LogPath returns the path of this instance's CRI-format log file.
func (p *Process) LogPath() string { return p.spec.LogPath }

type logRecord struct {
	ts      time.Time
	partial bool
	text    []byte
}

func parseRecord(line []byte) (logRecord, bool) {
	// <time> <stream> <tag> <text>
	line = bytes.TrimSuffix(line, []byte("\n"))
	fields := bytes.SplitN(line, []byte(" "), 4)
	if len(fields) < 3 {
		return logRecord{}, false
	}
	ts, err := time.Parse(time.RFC3339Nano, string(fields[0]))
	if err != nil {
		return logRecord{}, false
	}
	r := logRecord{ts: ts, partial: string(fields[2]) == "P"}
	if len(fields) == 4 {
		r.text = fields[3]
	}
	return r, true
}

type limitWriter struct {
	w    io.Writer
	left int64 // < 0: unlimited
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if l.left < 0 {
		return l.w.Write(b)
	}
	if int64(len(b)) > l.left {
		n, err := l.w.Write(b[:l.left])
		l.left -= int64(n)
		if err == nil {
			err = errLimitReached
		}
		return n, err
	}
	n, err := l.w.Write(b)
	l.left -= int64(n)
	return n, err
}

func readLog(ctx context.Context, path string, lw *logWriter, opts LogOptions, out io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open container log: %w", err)
	}
	defer f.Close()
	w := &limitWriter{w: out, left: -1}
	if opts.LimitBytes > 0 {
		w.left = opts.LimitBytes
	}
	// The kubelet prefixes a record with its timestamp when the record before it
	// (written or skipped by SinceTime) ended a line: one timestamp per line.
	newLine := true
	emit := func(line []byte) error {
		r, ok := parseRecord(line)
		if !ok {
			return nil
		}
		prefix := newLine
		newLine = !r.partial || len(r.text) == 0
		if !opts.SinceTime.IsZero() && r.ts.Before(opts.SinceTime) {
			return nil
		}
		var b bytes.Buffer
		if opts.Timestamps && prefix {
			b.WriteString(r.ts.Format(timeFormatOut))
			b.WriteByte(' ')
		}
		b.Write(r.text)
		if !r.partial {
			b.WriteByte('\n')
		}
		_, err := w.Write(b.Bytes())
		if f, ok := out.(interface{ Flush() }); ok {
			f.Flush()
		}
		return err
	}
	finish := func(err error) error {
		if errors.Is(err, errLimitReached) {
			return nil
		}
		return err
	}

	// The position to start from: the last TailLines complete lines.
	if opts.TailLines >= 0 {
		if err := seekTail(f, opts.TailLines); err != nil {
			return err
		}
	}
	br := bufio.NewReader(f)
	var pending []byte // a record whose newline has not been written yet
	for {
		changed, closed := lw.watch()
		for {
			chunk, err := br.ReadBytes('\n')
			pending = append(pending, chunk...)
			if err == nil {
				if e := emit(pending); e != nil {
					return finish(e)
				}
				pending = pending[:0]
				continue
			}
			if !errors.Is(err, io.EOF) {
				return fmt.Errorf("read container log: %w", err)
			}
			break
		}
		if !opts.Follow || closed {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int64) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat container log: %w", err)
	}
	size := st.Size()
	if n == 0 {
		_, err := f.Seek(size, io.SeekStart)
		return err
	}
	const block = 32 * 1024
	buf := make([]byte, block)
	var newlines int64
	pos := size
	for pos > 0 {
		readFrom := max(pos-block, 0)
		chunk := buf[:pos-readFrom]
		if _, err := f.ReadAt(chunk, readFrom); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read container log: %w", err)
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' {
				continue
			}
			// The newline ending the file does not start a line.
			if readFrom+int64(i) == size-1 {
				continue
			}
			newlines++
			if newlines == n {
				_, err := f.Seek(readFrom+int64(i)+1, io.SeekStart)
				return err
			}
		}
		pos = readFrom
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}
