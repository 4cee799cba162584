// Package task defines kubetask's task format and turns tasks into pods.
//
// A task is a Kubernetes-style document (apiVersion kubetask.dev/v1alpha1, kind Task)
// around a core/v1 PodTemplateSpec, or a plain kind: Pod manifest. Load decodes one
// strictly (unknown or duplicate fields and mistyped values are errors), applies
// defaults and validates it without a cluster (Validate: the task's fields and, in the
// pod template, what people get wrong, with the API server's rules), reporting every
// problem at once in an *InvalidError. ValidateOnServer asks a real API server, by
// server-side dry run, about the rest of the pod. BuildPod turns a valid task into the pod of
// one attempt: a deterministic name, kubetask's labels, annotations and finalizer, and
// for file results a shared volume plus a result-holder container.
//
// Every label, annotation and finalizer key kubetask puts on pods is defined here and
// nowhere else. See docs/task-format.md.
package task
