// Package podlog follows the log of one container of a pod through the
// Kubernetes API, as `kubectl logs -f` would if it never gave up.
//
// # Guarantees
//
// A Follower delivers every byte the container wrote to its log stream (stdout
// and stderr as the kubelet merges them) exactly once and in order, across:
//
//   - broken streams (dropped connections, kubelet errors) and streams the API
//     server closes cleanly in the middle of a line;
//   - API server restarts, which break every stream at once;
//   - container restarts, also while a stream is broken: the rest of the
//     previous instance's log is read (previous=true) before the current one's
//     (not for a container whose spec says it is never restarted:
//     Progress.NeverRestarts).
//
// Lines come whole, with a flag saying whether they ended with a newline:
// fragments are held back until their newline arrives, until the container's log
// is known to be complete (then the fragment is the unterminated last line), or
// until Config.MaxLineBytes are held (then the line comes in pieces). With
// Config.PartialLines, the bytes of a line in progress come as soon as the
// follower has read all it received, so none waits for its newline. Writing
// each Line's Text, and a newline after those with Newline set, reproduces the
// container's output byte for byte, as far as the node keeps it (see below).
//
// # Resume
//
// Follower.Cursor returns the position right after the last byte delivered:
// a versioned encoding (a leading version byte) of the timestamp of the last
// line begun, how many whole lines with exactly that timestamp were
// delivered, and how many bytes of the line in progress were. A follower
// stopped at any point (between any two OnLine calls, or when Run returned)
// and a new follower created with that Cursor as Config.Resume deliver
// together exactly the bytes one uninterrupted follower would: across broken
// streams, and across container restarts before or after the stop (the
// resumed follower reads the rest of the previous instance first, whatever
// its Progress says about restarts, unless it says the container is never
// restarted). The same holds for a chain of followers,
// each resumed from the last. Taking the Cursor inside OnLine gives the
// position of the end of that Line, so a caller that stores bytes in chunks
// stores each chunk with the Cursor taken after its last Line.
//
// Lines held back by the stopped follower (waiting for their newline) were not
// delivered and are not in its Cursor: the resumed follower reads them again.
// A Cursor is opaque; New rejects one that this version did not write (another
// version byte, damaged bytes, any encoding Cursor would not produce) with
// ErrBadCursor, never with a panic.
//
// # How
//
// Streams are read with timestamps=true; a broken stream is reopened with
// sinceTime set to the timestamp of the last line delivered. sinceTime has
// one-second resolution, so the new stream repeats that second: the follower
// drops what it already delivered by counting lines per timestamp and bytes
// within the line it was reading. A follower stops when a stream opened after
// the container terminated for good ended cleanly without anything new.
//
// # Limits
//
// The follower cannot return what the node no longer has:
//
//   - logs rotated away by the kubelet while the stream was broken, before it
//     was opened, or between a stop and a resume. The follower goes on with the
//     oldest line the node still has after its position; nothing marks the
//     gap. Resuming is exact when the rotation kept the cursor's line (the line
//     in progress, or else the last line delivered) from its start. When the
//     rotation split that very line (possible only for a line longer than the
//     runtime's record, 16 KiB with containerd), the node serves the part it
//     kept as a line of its own, and the follower delivers it: the bytes it had
//     already delivered of that line come again, or the bytes in between are
//     lost. When lines with the cursor's exact timestamp (same nanosecond) were
//     rotated away, the follower also skips, after its position, as many lines
//     with that timestamp as the rotation removed.
//     When the container has terminated and the node has nothing from the
//     cursor on, Run ends once ten streams in a row confirmed it;
//   - a pod deleted while the stream was broken (Run returns ErrPodGone);
//   - instances older than the previous one: the kubelet keeps the logs of the
//     current and the previous instance only, so a container that restarted twice
//     while the stream was broken loses the tail of the older instance;
//   - what the runtime changed when it wrote the log: containerd drops the CR of
//     a CRLF line ending, and a runtime that records an unterminated last line as
//     a full (F) record makes the kubelet serve it with a newline.
//
// Lines written in the same nanosecond keep their order in the log file, so
// counting them is exact; two logs (instances) never share a timestamp.
package podlog
