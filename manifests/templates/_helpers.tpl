{{/* Common names and labels. */}}
{{- define "cozygpu.name" -}}cozygpu{{- end -}}

{{- define "cozygpu.labels" -}}
app.kubernetes.io/name: cozygpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "cozygpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
