package localnode

import (
	"fmt"
	"strings"

	"github.com/distribution/reference"
)

// Reserved image names let tests provoke the kubelet's image errors. Images are
// never pulled: any other (valid) image name is accepted and ignored.
const (
	// PullErrorImagePrefix: an image starting with it never pulls. Its container waits
	// with reason ErrImagePull at each attempt and ImagePullBackOff in between
	// (back-off 10s doubling to 5m), as the kubelet reports a failing pull.
	PullErrorImagePrefix = "kubetask.invalid/pull-error/"
	// InvalidNameImage (or any name starting with it, or any name that is not a valid
	// image reference, such as one with upper-case letters) gives InvalidImageName.
	InvalidNameImage = "kubetask.invalid/invalid-name"
)

type imageProblem int

const (
	imageOK imageProblem = iota
	imagePullError
	imageInvalidName
)

func checkImage(image string) (imageProblem, string) {
	switch {
	case strings.HasPrefix(image, PullErrorImagePrefix):
		return imagePullError, fmt.Sprintf("Failed to pull image %q: kubetask local node: images under %s never pull (reserved for tests)", image, PullErrorImagePrefix)
	case strings.HasPrefix(image, InvalidNameImage):
		return imageInvalidName, fmt.Sprintf("Failed to apply default image tag %q: couldn't parse image name %q: reserved invalid image name", image, image)
	}
	if _, err := reference.ParseNormalizedNamed(image); err != nil {
		return imageInvalidName, fmt.Sprintf("Failed to apply default image tag %q: couldn't parse image name %q: %v", image, image, err)
	}
	return imageOK, ""
}
