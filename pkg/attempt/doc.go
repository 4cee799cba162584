// Package attempt holds the operations kubetask performs on the pod of one
// task attempt once podstate has decided what the pod means: reading the
// task's result, stopping containers that would otherwise run forever,
// releasing kubetask's finalizer and deleting the pod per the cleanup policy.
//
// Both the single-task runner and the executor use it, so that "what happens
// to a finished pod" is written once. Every operation is idempotent and
// tolerates a pod that is already gone.
package attempt
