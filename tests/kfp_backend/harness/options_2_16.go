//go:build kfp2_16

package main

// What KFP 2.16.1's backend/src/v2/cmd/driver/main.go sets on driver.Options beyond what every release sets: no
// plugin dispatcher, no hostUsers default, and the pipeline job times are not set (Options has the fields, main.go
// leaves them empty).

import (
	"strconv"

	"github.com/kubeflow/pipelines/backend/src/v2/driver"
)

const release = "2.16.1"

// releaseOptions: the Options literal's other fields (main.go:215-237).
func releaseOptions(options *driver.Options, f *driverFlags) error {
	options.MLPipelineServerAddress = f.mlPipelineAddress
	options.MLPipelineServerPort = f.mlPipelinePort
	return nil
}

// containerOptions: the admin defaults of the CONTAINER case (main.go:246-263).
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
	return nil
}
