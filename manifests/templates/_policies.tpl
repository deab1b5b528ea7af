{{/*
Helpers of the admission policies (templates/policies/, SPEC §5).

The keys below mirror cozygpu/keys.py; tests/chart pins each rendering to
the Python constant, so the two cannot drift apart.
*/}}
{{- define "cozygpu.key.deviceRefs" -}}gpu.cozystack.io/device-refs{{- end -}}
{{- define "cozygpu.key.templateDevice" -}}gpu.cozystack.io/template-device{{- end -}}
{{- define "cozygpu.key.deviceFinalizer" -}}gpu.cozystack.io/device-protection{{- end -}}
{{- define "cozygpu.key.classFinalizer" -}}gpu.cozystack.io/class-protection{{- end -}}
{{- define "cozygpu.key.usageMonitor" -}}gpu.cozystack.io/usage-monitor{{- end -}}
{{- define "cozygpu.key.nodeNameExtra" -}}authentication.kubernetes.io/node-name{{- end -}}
{{- define "cozygpu.settingsName" -}}cozygpu-settings{{- end -}}

{{/* Service-account user names the policies compare with request.userInfo.username. */}}
{{- define "cozygpu.controllerServiceAccount" -}}{{ .Values.serviceAccounts.controller }}{{- end -}}
{{- define "cozygpu.agentServiceAccount" -}}{{ .Values.serviceAccounts.agent }}{{- end -}}
{{- define "cozygpu.controllerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "cozygpu.controllerServiceAccount" . }}
{{- end -}}
{{- define "cozygpu.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "cozygpu.agentServiceAccount" . }}
{{- end -}}
{{- define "cozygpu.kubevirtControllerUser" -}}
system:serviceaccount:{{ .Values.kubevirt.namespace }}:{{ .Values.kubevirt.controllerServiceAccount }}
{{- end -}}

{{/* Labels of every policy and binding: the chart's, and Cozystack's platform-owned mark. */}}
{{- define "cozygpu.policyLabels" -}}
{{ include "cozygpu.labels" . }}
internal.cozystack.io/managed-by-cozystack: ""
{{- end -}}

{{/*
"true" when the cluster serves ValidatingAdmissionPolicy (every supported
minor does; `helm template` must be told with --api-versions, as Cozystack's
own policy charts are).
*/}}
{{- define "cozygpu.policies.supported" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}true{{- end -}}
{{- end -}}

{{/*
The kinds this chart's own templates create (templates/crds/, rendered on every
install, GPU on or off). Helm applies a release's CustomResourceDefinitions
before its ValidatingAdmissionPolicies (CRDs are early in its install order,
policies are a kind it does not list and so come last, and it finishes each
kind before the next), so a policy matching only these kinds can render in the
same install that creates them.
*/}}
{{- define "cozygpu.policies.shippedKinds" -}}
{{- list "gpu.cozystack.io/v1alpha1/GPUClass" "gpu.cozystack.io/v1alpha1/GPUDevice" "gpu.cozystack.io/v1alpha1/GPUNode" | toJson -}}
{{- end -}}

{{/*
"true" when every kind in .kinds ("group/version/Kind") is served, decided by
the switch .Values.policies.kinds.<.switch>: auto renders when each kind is
either served already (.Capabilities) or created by this chart in the same
release (cozygpu.policies.shippedKinds), true asserts the kinds exist, false
never renders. A policy matching a kind nobody creates can break
kube-controller-manager's policy type checking (the ordering hazard, SPEC §5),
so policies render only behind this. With auto, the GPU-kind policies render
on a first install, together with the CRDs, so there is no window after
`helm install` in which they are missing.
Usage: include "cozygpu.policies.served" (dict "ctx" . "switch" "gpu" "kinds" (list "gpu.cozystack.io/v1alpha1/GPUNode"))
*/}}
{{- define "cozygpu.policies.served" -}}
{{- $setting := toString (index .ctx.Values.policies.kinds .switch) -}}
{{- if eq $setting "true" -}}
true
{{- else if eq $setting "auto" -}}
{{- $shipped := include "cozygpu.policies.shippedKinds" .ctx | fromJsonArray -}}
{{- $served := true -}}
{{- range .kinds -}}
{{- if not (or ($.ctx.Capabilities.APIVersions.Has .) (has . $shipped)) -}}{{- $served = false -}}{{- end -}}
{{- end -}}
{{- if $served -}}true{{- end -}}
{{- else if ne $setting "false" -}}
{{- fail (printf "policies.kinds.%s must be auto, true or false, not %q" .switch $setting) -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the agent's node-restriction policy (R-POL-2) renders. The agent's
RBAC binding renders only then too: an agent must never hold write access to
GPUNodes that no policy narrows to its own node (with policies.kinds.gpu=false
neither renders).
*/}}
{{- define "cozygpu.agentPolicy.renders" -}}
{{- if and .Values.gpu.enabled (include "cozygpu.policies.supported" .) (include "cozygpu.policies.served" (dict "ctx" . "switch" "gpu" "kinds" (list "gpu.cozystack.io/v1alpha1/GPUNode"))) -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the order's finalizer comes from the MutatingAdmissionPolicy
(templates/policies/device-finalizer.yaml) rather than the finalizer webhook:
the cluster serves the v1 policy API (Kubernetes 1.36 and later; `helm
template` must be told with --api-versions) and GPUDevices. Exactly one of
the two renders.
*/}}
{{- define "cozygpu.finalizerPolicy.renders" -}}
{{- if and .Values.gpu.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") (include "cozygpu.policies.served" (dict "ctx" . "switch" "gpu" "kinds" (list "gpu.cozystack.io/v1alpha1/GPUDevice"))) -}}true{{- end -}}
{{- end -}}

{{/* The binding's matchResources for policies that act in tenant namespaces only. */}}
{{- define "cozygpu.tenantMatchResources" -}}
matchResources:
  namespaceSelector:
    {{- toYaml .Values.tenantNamespaceSelector | nindent 4 }}
{{- end -}}

{{/*
CEL: the caller is the platform (SPEC §5): a group or user of
.Values.platformCallers, or the controller's own service account.
*/}}
{{- define "cozygpu.cel.platformCaller" -}}
{{- $users := concat (.Values.platformCallers.users | default list) (list (include "cozygpu.controllerUser" .)) -}}
((has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {{ .Values.platformCallers.groups | default list | toJson }})) || request.userInfo.username in {{ $users | toJson }})
{{- end -}}

{{/*
CEL: the settings ConfigMap (the binding's parameter) says raw GPU names are
allowed. Anything else, a missing key or a value other than allow included,
is treated as forbid: the raw-name policies fail closed.
*/}}
{{- define "cozygpu.cel.rawNamesAllowed" -}}
params.?data.?rawNames.orValue('') == 'allow'
{{- end -}}

{{/*
CEL variables shared by the raw-name policies: the settings and the GPU
resource names. resourceNames is a JSON list of resource names; a name is in
it when its quoted form is: extended resource names hold no character JSON
escapes, so the quoted substring is exact membership.
*/}}
{{- define "cozygpu.cel.settingsVariables" -}}
- name: gpuNames
  expression: "params.?data.?resourceNames.orValue('')"
- name: settingsValid
  expression: >-
    params.?data.?rawNames.orValue('') == 'forbid'
    && variables.gpuNames.startsWith('[') && variables.gpuNames.endsWith(']')
- name: settingsRef
  expression: >-
    params.metadata.namespace + '/' + params.metadata.name
{{- end -}}

{{/* The validation that refuses while the settings ConfigMap is malformed (fail closed). */}}
{{- define "cozygpu.cel.settingsValidation" -}}
- expression: variables.settingsValid
  messageExpression: >-
    'refusing ' + request.operation + ' of ' + request.resource.resource + ' '
    + request.namespace + '/' + request.name
    + ': the GPU settings ConfigMap ' + variables.settingsRef
    + ' is malformed (rawNames must be allow or forbid, resourceNames a JSON list),'
    + ' so raw GPU names cannot be told apart; the controller rewrites it'
  message: "the GPU settings ConfigMap is malformed (rawNames must be allow or forbid, resourceNames a JSON list); raw GPU names cannot be checked, so the write is refused"
  reason: Forbidden
{{- end -}}
