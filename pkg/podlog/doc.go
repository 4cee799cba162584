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
//     previous instance's log is read (previous=true) before the current one's.
//
// Lines come whole, with a flag saying whether they ended with a newline:
// fragments are held back until their newline arrives, until the container's log
// is known to be complete (then the fragment is the unterminated last line), or
// until Config.MaxLineBytes are held (then the line comes in pieces). Writing
// each Line's Text, and a newline after those with Newline set, reproduces the
// container's output byte for byte, as far as the node keeps it (see below).
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
//   - logs rotated away by the kubelet while the stream was broken (or before it
//     was opened);
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
