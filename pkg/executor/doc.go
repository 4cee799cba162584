// Package executor runs many tasks as pods and reports every state change of
// every task, with the pod watcher failure that started kubetask designed out.
//
// Guarantees:
//   - Pods are watched with one pod cache per namespace, built from client-go's
//     parts as an informer is (a Reflector, a RealFIFO, an Indexer; one
//     LIST+WATCH filtered by kubetask's labels). The caches keep of each pod
//     only what the executor reads (about 0.8 KB per pod with the index, for
//     a two-container pod of 25 KB; CachedPod lists the fields), and every
//     decision, also one on a fresh read, is taken on that view. The
//     Reflector relists on 410 Expired, apiserver restarts and dropped
//     connections, after a back-off of 100 ms doubling to at most 2 s (jitter
//     included; Config.WatchBackoff), which starts again from 100 ms once a
//     list-and-watch stayed up for 10 s. There is no hand-written watch loop
//     and no error that stops the executor.
//   - A pod cache that failed to LIST or WATCH since its last successful LIST
//     or WATCH request is blind: kubetask_pod_cache_blind{namespace} is 1
//     meanwhile, and Healthy fails once it has been blind for LivenessTimeout.
//   - Reconciliation is level-based and keyed by task ID (a workqueue): each
//     pass derives the task's state from the pod as it is now (podstate), so a
//     relist loses nothing, and a task whose pod was deleted is noticed.
//   - Every task pod carries kubetask's finalizer. An attempt's terminal
//     outcome is written to the Store before the finalizer is removed, so a
//     pod deleted by someone else, or garbage-collected, cannot take its exit
//     code with it — also while the executor is down.
//   - Each attempt's outcome is recorded exactly once (a compare-and-swap on
//     the record guards it), also across executor restarts and crashes; the
//     Store is the source of truth and OnEvent a notification of its changes,
//     delivered in order per task.
//   - A finalizer is never left behind: pods whose task is finished, unknown
//     or cancelled are released.
package executor
