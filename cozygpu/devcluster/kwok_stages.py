"""What kwok does with the simulated nodes and their pods (its Stage configuration).

kwok ships no behaviour of its own: every transition is a Stage, matched by
selectors over the object and applied as a patch. The local plane needs three,
written for what cozygpu's tests and demo rely on and nothing more (simulated
VMs run until deleted, so no pod ever completes):

- ``cozygpu-node-ready``: a managed Node that is not Ready becomes Ready (the
  conditions a kubelet reports, addresses, node info). Capacity and
  allocatable are left as created (``nodes.SimNode`` writes them). After
  that, liveness is the node Lease, which kwok renews every quarter of
  ``--node-lease-duration-seconds``: a node kwok stops managing goes
  NotReady through the real node-lifecycle controller.
- ``cozygpu-pod-running``: a pod bound to a managed node runs: phase Running,
  Ready, each container running, host and pod IPs.
- ``cozygpu-pod-deleted``: a pod being deleted is removed (there is no
  kubelet to confirm the termination).
"""

from __future__ import annotations

CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  # A config file replaces kwok's defaults wholesale, so the workers are named here.
  nodeLeaseParallelism: 4
  nodePlayStageParallelism: 4
  podPlayStageParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  enableDebuggingHandlers: false
  enableProfilingHandler: false
  enableContentionProfiling: false
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cozygpu-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    patches:
    - subresource: status
      root: status
      template: |
        {{ $now := Now }}
        conditions:
        {{ range NodeConditions }}
        - type: {{ .type | Quote }}
          status: {{ .status | Quote }}
          reason: {{ .reason | Quote }}
          message: {{ .message | Quote }}
          lastHeartbeatTime: {{ $now | Quote }}
          lastTransitionTime: {{ $now | Quote }}
        {{ end }}
        addresses:
        - type: InternalIP
          address: {{ NodeIP | Quote }}
        - type: Hostname
          address: {{ .metadata.name | Quote }}
        nodeInfo:
          architecture: amd64
          operatingSystem: linux
          kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
          kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
          containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
          kernelVersion: {{ printf "kwok-%s" Version | Quote }}
          osImage: simulated by kwok for cozygpu
          machineID: ""
          systemUUID: ""
          bootID: ""
        phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cozygpu-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: ['Pending']
  next:
    patches:
    - subresource: status
      root: status
      template: |
        {{ $now := Now }}
        phase: Running
        startTime: {{ $now | Quote }}
        conditions:
        - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
        - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
        - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
        containerStatuses:
        {{ range .spec.containers }}
        - name: {{ .name | Quote }}
          image: {{ .image | Quote }}
          ready: true
          started: true
          restartCount: 0
          state:
            running:
              startedAt: {{ $now | Quote }}
        {{ end }}
        {{ with NodeIPsWith .spec.nodeName }}
        hostIP: {{ index . 0 | Quote }}
        {{ end }}
        {{ $uid := or .metadata.uid "" }}{{ $name := or .metadata.name "" }}{{ $ns := or .metadata.namespace "" }}
        {{ with PodIPsWith .spec.nodeName false $uid $name $ns }}
        podIP: {{ index . 0 | Quote }}
        podIPs:
        {{ range . }}
        - ip: {{ . | Quote }}
        {{ end }}
        {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cozygpu-pod-deleted
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
  next:
    delete: true
"""
