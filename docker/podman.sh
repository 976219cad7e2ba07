# Sourced by the scripts that run podman. Podman's global flags come from QVI_PODMAN_FLAGS; the
# default suits a root podman without systemd (a CI runner, a container): runc, cgroupfs.
# shellcheck shell=bash
read -r -a QVI_PODMAN <<< "podman ${QVI_PODMAN_FLAGS---runtime=runc --cgroup-manager=cgroupfs}"
