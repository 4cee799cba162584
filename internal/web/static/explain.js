// The outcome of a task in words: what its phase and reason mean (the
// reasons of docs/states.md), and what to do about it.

const REASONS = {
  Submitted: ['kubetask accepted the task and is about to create its pod.', ''],
  WaitingForSlot: ['The task waits for a parallelism slot: the message names the limit that holds it, its namespace\'s own or the service\'s.',
    'It starts once a slot is its; namespaces with waiting tasks take free slots in turn.'],
  WaitingForPreviousPod: ['A container of the previous attempt\'s pod still runs; the next attempt starts once it stopped.', ''],
  Creating: ['kubetask is creating the pod.', ''],
  CreateFailed: ['The API server refused the pod\'s creation for a passing reason (a quota, a webhook, 429); kubetask tries again with a backoff.',
    'The task fails with ScheduleTimeout if this lasts past timeouts.schedule.'],
  RetryBackoff: ['The last attempt failed with a failure that is retried; the next attempt starts after the backoff.', 'Look at the failed attempt below to see why it failed.'],
  Scheduling: ['The pod waits for the scheduler to place it on a node.', ''],
  Unschedulable: ['No node can run the pod: the scheduler found none that fits its resources, node selector, affinity or tolerations.',
    'Check the scheduler\'s events below; lower the requests or fix the selectors. The task fails with ScheduleTimeout if this lasts past timeouts.schedule.'],
  Initializing: ['An init container or a native sidecar of the pod is still starting.', ''],
  Starting: ['The pod is on a node; its containers are being created and their images pulled.', ''],
  ImagePullFailed: ['An image the main container needs could not be pulled.',
    'Check the image name and tag, and that the node may pull from its registry (imagePullSecrets).'],
  ConfigError: ['The container could not be created: something its configuration refers to is missing or wrong (a ConfigMap, a Secret, a volume, a command).',
    'Create what is missing, or fix the pod spec, and rerun the task.'],
  Running: ['The main container runs.', ''],
  Restarting: ['The main container failed and the kubelet restarts it (restartPolicy OnFailure).', ''],
  Stopping: ['Someone else stops the pod (a deletion, an eviction) while the main container runs; kubetask waits until no container runs before it decides.', ''],
  Completed: ['The main container exited with code 0.', ''],
  ExitCode: ['The main container exited with a non-zero code: the task\'s own program failed.', 'Read the end of its log below.'],
  OOMKilled: ['The main container used more memory than its limit and was killed.', 'Raise resources.limits.memory, or make the program use less memory.'],
  InitFailed: ['An init container failed.', 'Read the init container\'s log (add it to spec.logs.containers to keep it).'],
  InvalidImage: ['The image name is not valid.', 'Fix the image reference in the task.'],
  ScheduleTimeout: ['The pod was not placed on a node within timeouts.schedule.', 'No node fits it: check its requests, node selector and tolerations, or the cluster\'s capacity.'],
  StartupTimeout: ['The main container did not start within timeouts.startup after the pod was scheduled.', 'Image pulls, init containers or volume mounts took too long.'],
  RunTimeout: ['The main container ran longer than timeouts.run and was stopped.', 'Raise timeouts.run, or find out why the program took so long.'],
  DeadlineExceeded: ['The pod\'s activeDeadlineSeconds passed before the main container finished.', ''],
  Evicted: ['The pod was evicted (a drain, node pressure, a node shutdown or a taint).', 'An infrastructure failure: kubetask retries it unless retries are used up.'],
  Preempted: ['The scheduler preempted the pod for one of higher priority.', 'An infrastructure failure: kubetask retries it unless retries are used up.'],
  NodeLost: ['The pod\'s node stopped reporting, or the pod was garbage-collected.', 'An infrastructure failure: kubetask retries it unless retries are used up.'],
  DeletedExternally: ['The pod was deleted by someone else before the main container finished.', 'An infrastructure failure: kubetask retries it unless retries are used up.'],
  Cancelled: ['The task was cancelled before its main container finished.', 'Rerun it to run it again.'],
  PodFailed: ['The pod failed before the main container finished (a kubelet admission rejection, for example).', ''],
  ResultFailed: ['The main container exited with code 0 but its result could not be read.', 'Check that the program writes its result where spec.result says, within result.maxBytes.'],
  ClusterLost: ['The attempt\'s cluster was declared lost while its pod was there; the pod may still run unseen.', 'kubetask runs the next attempt on another cluster.'],
  ClusterUnreachable: ['The attempt\'s cluster does not answer: the attempt keeps its last known state until it does.', 'An operator may declare the cluster lost (kubetask clusters lose) to run the attempt elsewhere, at least once.'],
};

// explain returns {headline, detail, hint} for a task (or an attempt).
export function explain(t) {
  const [detail, hint] = REASONS[t.reason] || ['', ''];
  const exit = t.exitCode != null ? ` (exit code ${t.exitCode})` : '';
  let headline;
  switch (t.phase) {
    case 'Pending':
      headline = t.reason === 'RetryBackoff' ? 'Waiting to retry' : `Pending: ${words(t.reason) || 'waiting'}`;
      break;
    case 'Running':
      headline = t.reason === 'Running' ? 'Running' : `Running: ${words(t.reason)}`;
      break;
    case 'Succeeded':
      headline = 'Succeeded' + exit;
      break;
    case 'Failed':
      headline = `Failed: ${words(t.reason) || 'unknown reason'}${exit}`;
      break;
    default:
      headline = t.phase || 'Unknown';
  }
  return {headline, detail, hint};
}

// words turns a reason into words: DeletedExternally -> deleted externally.
export function words(reason) {
  if (!reason) return '';
  if (reason === 'OOMKilled') return 'out of memory (OOMKilled)';
  if (reason === 'ExitCode') return 'the program failed';
  return reason.replace(/([a-z])([A-Z])/g, '$1 $2').toLowerCase();
}
