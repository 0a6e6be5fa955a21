//go:build !kfp2_15 && !kfp2_16

package main

// What KFP 2.17.0's backend/src/v2/cmd/driver/main.go sets on driver.Options beyond what every release sets.

import (
	"fmt"
	"strconv"

	"github.com/kubeflow/pipelines/backend/src/v2/common/plugins"
	_ "github.com/kubeflow/pipelines/backend/src/v2/common/plugins/all"
	"github.com/kubeflow/pipelines/backend/src/v2/driver"
)

const release = "2.17.0"

// releaseOptions: the Options literal's other fields (main.go:408-433). The plugin dispatcher is main.go's
// (plugins.GetPluginDispatcher with plugins/all, main.go:47 and :383-386): no plugin is enabled on a default
// install, so it is the no-op one.
func releaseOptions(options *driver.Options, f *driverFlags) error {
	dispatcher, err := plugins.GetPluginDispatcher()
	if err != nil {
		return err
	}
	options.PluginDispatcher = dispatcher
	options.MLPipelineServerAddress = f.mlPipelineAddress
	options.MLPipelineServerPort = f.mlPipelinePort
	options.PipelineJobCreateTimeUTC = f.createTime
	options.PipelineJobScheduleTimeUTC = f.createTime // main.go:265-300: no workflowEpoch label on a one-off run
	return nil
}

// containerOptions: the admin defaults of the CONTAINER case (main.go:434-468).
func containerOptions(options *driver.Options, f *driverFlags) error {
	if f.defaultRunAsUser >= 0 {
		options.DefaultRunAsUser = &f.defaultRunAsUser
	}
	if f.defaultRunAsGroup >= 0 {
		options.DefaultRunAsGroup = &f.defaultRunAsGroup
	}
	if f.defaultRunAsNonRoot != "" {
		if v, err := strconv.ParseBool(f.defaultRunAsNonRoot); err == nil {
			options.DefaultRunAsNonRoot = &v
		}
	}
	if f.defaultHostUsers != "" {
		v, err := strconv.ParseBool(f.defaultHostUsers)
		if err != nil {
			return fmt.Errorf("invalid --default_host_users value %q: %w", f.defaultHostUsers, err)
		}
		options.DefaultHostUsers = &v
	}
	return nil
}
