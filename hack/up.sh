#!/usr/bin/env bash
# The main job on a fresh machine: build the control plane once (cached), start
# the full local plane on loopback (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) with the CRDs, then the demo: simulated GPU nodes
# (kwok keeps them Ready) read by the real agent, two controller replicas behind
# a loopback balancer their webhooks are registered at, the KubeVirt stand-in,
# tenants with budgets, and the story (an order bound, one refused, a VM
# started, stopped and its GPU kept, a start refused, a raw GPU pod and a raw
# VMI refused by the chart's policies, a hold moved off a cordoned node), then
# the catalog. A Prometheus on loopback evaluates the chart's rules over both
# replicas' metrics (its URL and two queries are printed at the start).
# Run it again to tell the story again; `cozygpu cluster stop` ends it all.
source "$(dirname "$0")/env.sh"
DIR=${COZYGPU_CLUSTER_DIR:-.cozygpu/cluster}
if cozygpu cluster status --dir "$DIR" >/dev/null 2>&1; then
  echo "a control plane is already running in $DIR (cozygpu cluster stop --dir $DIR to start afresh)"
else
  cozygpu cluster stop --dir "$DIR" >/dev/null 2>&1 || true   # clear a stale state file
  cozygpu cluster start --dir "$DIR" --prometheus "$@"
fi
exec cozygpu cluster demo --dir "$DIR"
