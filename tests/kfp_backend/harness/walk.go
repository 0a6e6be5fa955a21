package main

// The workflow's DAG, run the way Argo's controller runs it, for the template kinds the KFP compiler emits: a DAG
// template runs its tasks in dependency order, skipping a task whose `when` is false; a container template that is
// a driver runs the real driver with its substituted arguments; the executor's container template gets the
// driver's pod spec patch merged on (Argo's util.ApplyPodSpecPatch, called by workflow/controller/workflowpod.go
// createWorkflowPod at the Argo release the KFP release pins), and its launcher's part is done in publishOutputs.
// Parameters are substituted as Argo's `{{...}}` simple tags are (workflow/common/util.go substituteParams):
// workflow.parameters, inputs.parameters, tasks.NAME.outputs.parameters and the workflow's own variables.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/kubeflow/pipelines/api/v2alpha1/go/pipelinespec"
	"github.com/kubeflow/pipelines/backend/src/common/util"
	"github.com/kubeflow/pipelines/backend/src/v2/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	apiv1 "k8s.io/api/core/v1"
)

type walker struct {
	wf                 *util.Workflow
	mlmd               *metadata.Client
	mlmdHost, mlmdPort string
	outputs            map[string]map[string]any
	pipelineRoot       string
	pipeline           string
	results            []taskResult
	templates          map[string]*wfTemplate
	// per container execution: the task it runs and its component, for the launcher's part
	launched map[string]launched
}

type launched struct {
	task          string
	executorInput *pipelinespec.ExecutorInput
	result        int // index in results
}

// The time the compiled driver arguments get for {{workflow.creationTimestamp}}.
const creationTime = "2026-01-01T00:00:00Z"

var tag = regexp.MustCompile(`\{\{\s*([^{}]+?)\s*\}\}`)

func substitute(text string, scope map[string]string) (string, error) {
	var missing []string
	out := tag.ReplaceAllStringFunc(text, func(m string) string {
		name := strings.TrimSpace(m[2 : len(m)-2])
		if value, ok := scope[name]; ok {
			return value
		}
		if strings.HasPrefix(name, "$") { // KFP's own placeholders pass through Argo to the driver and launcher
			return m
		}
		missing = append(missing, name)
		return m
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("unresolved %s", strings.Join(missing, ", "))
	}
	return out, nil
}

func (w *walker) runWorkflow() error {
	w.templates = map[string]*wfTemplate{}
	w.launched = map[string]launched{}
	for i := range w.wf.Spec.Templates {
		w.templates[w.wf.Spec.Templates[i].Name] = &w.wf.Spec.Templates[i]
	}
	_, err := w.runTemplate(w.wf.Spec.Entrypoint, w.globalScope(), nil)
	return err
}

func (w *walker) globalScope() map[string]string {
	scope := map[string]string{"workflow.name": "run-workflow", "workflow.namespace": "kubeflow",
		"workflow.uid": "RUN_ID", "workflow.creationTimestamp": creationTime}
	for _, p := range w.wf.Spec.Arguments.Parameters {
		if p.Value != nil {
			scope["workflow.parameters."+p.Name] = p.Value.String()
		}
	}
	return scope
}

func (w *walker) runTemplate(name string, global map[string]string, args []wfParameter) (map[string]string, error) {
	t, ok := w.templates[name]
	if !ok {
		return nil, fmt.Errorf("no template %q in the workflow", name)
	}
	scope := map[string]string{}
	for k, v := range global {
		scope[k] = v
	}
	given := map[string]string{}
	for _, p := range args {
		if p.Value != nil {
			given[p.Name] = p.Value.String()
		}
	}
	for _, p := range t.Inputs.Parameters {
		switch {
		case given[p.Name] != "" || hasKey(given, p.Name):
			scope["inputs.parameters."+p.Name] = given[p.Name]
		case p.Value != nil:
			scope["inputs.parameters."+p.Name] = p.Value.String()
		case p.Default != nil:
			scope["inputs.parameters."+p.Name] = p.Default.String()
		default:
			return nil, fmt.Errorf("template %s: input %s has no value", name, p.Name)
		}
	}
	for _, p := range t.Outputs.Parameters { // Argo's {{outputs.parameters.NAME.path}}
		if p.ValueFrom != nil && p.ValueFrom.Path != "" {
			scope["outputs.parameters."+p.Name+".path"] = p.ValueFrom.Path
		}
	}
	switch {
	case t.DAG != nil:
		return w.runDAG(t, scope, global)
	case t.Container != nil && t.PodSpecPatch != "":
		return w.runExecutor(t, scope)
	case t.Container != nil:
		return w.runDriver(t, scope)
	}
	return nil, fmt.Errorf("template %s: a kind this walk does not run", name)
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

var dependsName = regexp.MustCompile(`[A-Za-z0-9][A-Za-z0-9-]*(\.[A-Za-z]+)?`)

func dependencies(task wfDAGTask) []string {
	names := append([]string{}, task.Dependencies...)
	for _, m := range dependsName.FindAllString(task.Depends, -1) {
		names = append(names, strings.SplitN(m, ".", 2)[0])
	}
	return names
}

// evalWhen evaluates the `when` forms the KFP compiler writes: "A != B" and "A == B" on substituted values
// (argocompiler container.go:433, dag.go:463-465).
func evalWhen(expr string) (bool, error) {
	for _, op := range []string{"!=", "=="} {
		if parts := strings.SplitN(expr, op, 2); len(parts) == 2 {
			equal := strings.TrimSpace(parts[0]) == strings.TrimSpace(parts[1])
			return equal == (op == "=="), nil
		}
	}
	return false, fmt.Errorf("when %q: a form this walk does not evaluate", expr)
}

func (w *walker) runDAG(t *wfTemplate, scope, global map[string]string) (map[string]string, error) {
	done := map[string]bool{}
	for len(done) < len(t.DAG.Tasks) {
		progressed := false
		for _, task := range t.DAG.Tasks {
			if done[task.Name] {
				continue
			}
			ready := true
			for _, dep := range dependencies(task) {
				if !done[dep] {
					ready = false
				}
			}
			if !ready {
				continue
			}
			done[task.Name], progressed = true, true
			if err := w.runDAGTask(task, scope, global); err != nil {
				return nil, fmt.Errorf("%s/%s: %w", t.Name, task.Name, err)
			}
		}
		if !progressed {
			return nil, fmt.Errorf("template %s: tasks wait on each other", t.Name)
		}
	}
	outputs := map[string]string{}
	for _, p := range t.Outputs.Parameters {
		if p.ValueFrom != nil && p.ValueFrom.Parameter != "" {
			value, err := substitute(p.ValueFrom.Parameter, scope)
			if err == nil {
				outputs[p.Name] = value
			}
		}
	}
	return outputs, nil
}

func (w *walker) runDAGTask(task wfDAGTask, scope, global map[string]string) error {
	if task.When != "" {
		when, err := substitute(task.When, scope)
		if err != nil { // an output of a task that did not run: Argo skips this one too
			return nil
		}
		run, err := evalWhen(when)
		if err != nil {
			return err
		}
		if !run {
			return nil
		}
	}
	var args []wfParameter
	for _, p := range task.Arguments.Parameters {
		if p.Value == nil {
			continue
		}
		value, err := substitute(p.Value.String(), scope)
		if err != nil {
			return fmt.Errorf("argument %s: %w", p.Name, err)
		}
		args = append(args, wfParameter{Name: p.Name, Value: wfAnyStringPtr(value)})
	}
	outputs, err := w.runTemplate(task.Template, global, args)
	if err != nil {
		return err
	}
	for name, value := range outputs {
		scope["tasks."+task.Name+".outputs.parameters."+name] = value
	}
	return nil
}

func substituteAll(values []string, scope map[string]string) ([]string, error) {
	out := make([]string, len(values))
	for i, v := range values {
		s, err := substitute(v, scope)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

func (w *walker) runDriver(t *wfTemplate, scope map[string]string) (map[string]string, error) {
	args, err := substituteAll(t.Container.Args, scope)
	if err != nil {
		return nil, fmt.Errorf("driver %s: %w", t.Name, err)
	}
	f, err := parseDriverFlags(args)
	if err != nil {
		return nil, err
	}
	if f.driverType == "ROOT_DAG" {
		w.pipeline = f.pipelineName
	}
	execution, _, err := callDriver(context.Background(), f, w.mlmdHost, w.mlmdPort)
	if f.driverType == "CONTAINER" {
		result := taskResult{Task: f.taskName}
		if err != nil {
			result.Error = err.Error()
		}
		if execution != nil {
			result.Condition, result.Cached = execution.Condition, execution.Cached
			if execution.ExecutorInput != nil {
				data, _ := protojson.Marshal(execution.ExecutorInput)
				result.ExecutorInput = data
			}
			if execution.ID != 0 {
				w.launched[fmt.Sprint(execution.ID)] = launched{task: f.taskName,
					executorInput: execution.ExecutorInput, result: len(w.results)}
			}
		}
		if execution != nil && execution.Condition != nil && !*execution.Condition {
			result.Skipped = "its trigger condition is false"
		}
		w.results = append(w.results, result)
		if err != nil {
			return map[string]string{}, nil // the task fails on the cluster; the result says why
		}
	} else if err != nil {
		return nil, err
	}
	files := driverOutputFiles(execution, f.driverType)
	outputs := map[string]string{}
	for _, p := range t.Outputs.Parameters {
		if p.ValueFrom == nil {
			continue
		}
		for flagName, path := range f.paths {
			if *path != "" && *path == p.ValueFrom.Path {
				if value, ok := files[flagName]; ok {
					outputs[p.Name] = value
				} else if p.ValueFrom.Default != nil {
					outputs[p.Name] = p.ValueFrom.Default.String()
				}
			}
		}
	}
	return outputs, nil
}

// runExecutor makes the pod Argo makes for the executor template: its main container (workflowpod.go names it
// "main") and the template's pod-level fields, with the substituted podSpecPatch applied by Argo's own
// ApplyPodSpecPatch; labels and annotations are the template's metadata over the workflow's podMetadata.
func (w *walker) runExecutor(t *wfTemplate, scope map[string]string) (map[string]string, error) {
	main := *t.Container.DeepCopy()
	main.Name = "main"
	pod := apiv1.PodSpec{Containers: []apiv1.Container{main}, Volumes: t.Volumes, NodeSelector: t.NodeSelector,
		Tolerations: t.Tolerations, Affinity: t.Affinity, SecurityContext: t.SecurityContext}
	for _, init := range t.InitContainers {
		pod.InitContainers = append(pod.InitContainers, init.Container)
	}
	patch, err := substitute(t.PodSpecPatch, scope)
	if err != nil {
		return nil, fmt.Errorf("executor %s podSpecPatch: %w", t.Name, err)
	}
	merged, err := applyPodSpecPatch(pod, patch)
	if err != nil {
		return nil, fmt.Errorf("executor %s: %w", t.Name, err)
	}
	// The launcher's command line, which the driver's patch writes, names the execution it publishes to.
	executionID := ""
	launcher := append(append([]string{}, merged.Containers[0].Command...), merged.Containers[0].Args...)
	for i, arg := range launcher {
		if arg == "--execution_id" && i+1 < len(launcher) {
			executionID = launcher[i+1]
		}
	}
	run, ok := w.launched[executionID]
	if !ok {
		return nil, fmt.Errorf("executor %s: no driver execution %q", t.Name, executionID)
	}
	result := &w.results[run.result]
	result.Pod, result.TemplatePod = mustJSON(merged), mustJSON(pod)
	labels, annotations := map[string]string{}, map[string]string{}
	if w.wf.Spec.PodMetadata != nil {
		for k, v := range w.wf.Spec.PodMetadata.Labels {
			labels[k] = v
		}
		for k, v := range w.wf.Spec.PodMetadata.Annotations {
			annotations[k] = v
		}
	}
	// Argo substitutes the whole template, map keys included (the compiler puts kfp-kubernetes pod metadata
	// keys in as input parameters: argocompiler container.go getPodMetadataParameters).
	for _, m := range []struct{ from, to map[string]string }{{t.Metadata.Labels, labels},
		{t.Metadata.Annotations, annotations}} {
		for k, v := range m.from {
			key, err := substitute(k, scope)
			if err != nil {
				return nil, fmt.Errorf("executor %s metadata: %w", t.Name, err)
			}
			if m.to[key], err = substitute(v, scope); err != nil {
				return nil, fmt.Errorf("executor %s metadata: %w", t.Name, err)
			}
		}
	}
	result.Labels, result.Annotations = labels, annotations
	if err := w.publishOutputs(context.Background(), parseID(executionID), run); err != nil {
		return nil, fmt.Errorf("publish %s outputs: %w", run.task, err)
	}
	return map[string]string{}, nil
}

func parseID(s string) int64 {
	var id int64
	fmt.Sscan(s, &id)
	return id
}

func mustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}
