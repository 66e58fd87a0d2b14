// Package crds only names the API types controller-gen reads, so that go.mod pins their
// module and `go build`/`controller-gen` find them with -mod=readonly.
package crds

import _ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
