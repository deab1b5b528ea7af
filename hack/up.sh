#!/usr/bin/env bash
# The main job on a fresh machine: build the control plane once (cached), start
# etcd + kube-apiserver on loopback with the CRDs installed, and say how to use it.
source "$(dirname "$0")/env.sh"
exec cozygpu cluster start "$@"
