// Package task defines kubetask's task format and turns tasks into pods.
//
// A task is a Kubernetes-style document (apiVersion kubetask.dev/v1alpha1, kind Task)
// around a core/v1 PodTemplateSpec, or a plain kind: Pod manifest. Load decodes one
// strictly (unknown or duplicate fields are errors), applies defaults and validates it,
// pod spec included, with the API server's own validation code, so that a task kubetask
// accepts is a pod the API server accepts. BuildPod turns a valid task into the pod of
// one attempt: a deterministic name, kubetask's labels, annotations and finalizer, and
// for file results a shared volume plus a result-holder container.
//
// Every label, annotation and finalizer key kubetask puts on pods is defined here and
// nowhere else. See docs/task-format.md.
package task
