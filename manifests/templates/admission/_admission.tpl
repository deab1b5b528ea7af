{{- /*
The webhook serving certificate, decided once per render and shared by the
Secret (controller/webhook-certificate.yaml) and the caBundle of the webhook
configurations (admission/webhooks.yaml): kept from the Secret already in the
cluster (lookup), else generated. The result is memoised in .Values so both
templates see the same pair. Returns JSON {crt, key, ca}, base64 each; ca is
empty when the platform issues the Secret and the cluster has none yet.
*/ -}}
{{- define "cozygpu.webhookCert" -}}
{{- if not (hasKey .Values "__cozygpuWebhookCert") -}}
{{- $name := .Values.controller.webhookCertSecret -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- $pair := dict "crt" "" "key" "" "ca" (.Values.controller.webhookCABundle | default "") -}}
{{- if and $existing $existing.data -}}
{{- $pair = dict "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key") "ca" (index $existing.data "ca.crt" | default $pair.ca) -}}
{{- else if .Values.controller.generateWebhookCert -}}
{{- $service := printf "cozygpu-controller-webhook.%s.svc" .Release.Namespace -}}
{{- $ca := genCA "cozygpu-webhook-ca" 3650 -}}
{{- $cert := genSignedCert $service nil (list $service (printf "cozygpu-controller-webhook.%s" .Release.Namespace) "cozygpu-controller-webhook") 3650 $ca -}}
{{- $pair = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($ca.Cert | b64enc) -}}
{{- end -}}
{{- $_ := set .Values "__cozygpuWebhookCert" $pair -}}
{{- end -}}
{{- toJson (get .Values "__cozygpuWebhookCert") -}}
{{- end -}}

{{- /*
--bind-wait must leave room under the webhooks' timeoutSeconds (at most 30,
the API server's limit) for the checks, the writes and their undo: the same
rule as the controller's flag validation (cozygpu/runtime/flags.py), so a
bad pair fails at render time, not at the controller's start.
*/ -}}
{{- define "cozygpu.webhookTimeout" -}}
{{- $c := .Values.controller -}}
{{- $timeout := int $c.webhookTimeoutSeconds -}}
{{- if or (lt $timeout 1) (gt $timeout 30) -}}
{{- fail (printf "controller.webhookTimeoutSeconds=%v: must be 1 to 30 (the API server's limit)" $c.webhookTimeoutSeconds) -}}
{{- end -}}
{{- $wait := toString $c.bindWait -}}
{{- if not (regexMatch "^[0-9]+s$" $wait) -}}
{{- fail (printf "controller.bindWait=%s: write it in whole seconds, like 10s" $wait) -}}
{{- end -}}
{{- if gt (add (int (trimSuffix "s" $wait)) 3) $timeout -}}
{{- fail (printf "controller.bindWait=%s must leave 3s under controller.webhookTimeoutSeconds=%d for the checks, the writes and their undo" $wait $timeout) -}}
{{- end -}}
{{- $timeout -}}
{{- end -}}

{{- /*
The device-refs contract (SPEC 1.4, R-DEP): what a VM template carries so the
VMI webhook selects and reads it. Input: a list of references, each a dict
{"device": NAME} or {"template": NAME, "class": CLASS, "count": N}. The label
selects the VMI (and its launcher pod) for the mutating webhooks; the
annotation is the JSON list cozygpu.admission.refs.parse_refs reads.
*/ -}}
{{- define "cozygpu.deviceRefs.labels" -}}
gpu.cozystack.io/device-refs: "true"
{{- end -}}

{{- define "cozygpu.deviceRefs.annotations" -}}
{{- $refs := list -}}
{{- range . -}}
{{- if hasKey . "device" -}}
{{- $refs = append $refs (dict "device" .device) -}}
{{- else -}}
{{- $refs = append $refs (dict "template" .template "class" .class "count" (int .count)) -}}
{{- end -}}
{{- end -}}
gpu.cozystack.io/device-refs: {{ toJson $refs | quote }}
{{- end -}}
