// Command printversion prints version.Get() as JSON: TestStampedBuild builds
// it with -ldflags -X as make build does.
package main

import (
	"encoding/json"
	"os"

	"github.com/kubetask/kubetask/internal/version"
)

func main() {
	_ = json.NewEncoder(os.Stdout).Encode(version.Get())
}
