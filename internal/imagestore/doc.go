// Package imagestore is the local cluster's store of loaded container images:
// what `kubetask cluster load-image` writes and the local node runs pods from.
//
// Load reads an image archive (the docker-compatible tar of `docker save` and
// `make image`, or an OCI image layout directory), flattens each image's layers
// (go-containerregistry's mutate.Extract applies the whiteouts) into a root
// file system and keeps the image's config beside it. Lookup finds an image by
// the name a pod gives: a tagged name (normalised as the kubelet does:
// `busybox` is `docker.io/library/busybox:latest`), or a digest
// (`name@sha256:...` or `sha256:...`) of its config (the image ID) or, for an
// OCI layout, of its manifest.
//
// Layout of the store directory:
//
//	images/<config digest hex>/rootfs/       the unpacked root file system
//	images/<config digest hex>/config.json   the image's config file
//	refs/<sha256 of the key>.json            {"key": name or digest, "id": config digest}
//
// An image directory appears whole (it is unpacked beside and renamed into
// place), and a ref file is replaced atomically, so a reader never sees half an
// image; loading a name again points it at the new image and leaves the old
// image's files in place (pods may run from them).
package imagestore
