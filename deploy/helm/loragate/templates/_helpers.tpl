{{- define "loragate.engineUrls" -}}
{{- if .Values.inferenceExtension.enabled -}}
[{{ .Values.inferenceExtension.gatewayUrl | quote }}]
{{- else -}}
{{- $count := .Values.engine.replicas -}}
{{- if .Values.engine.autoscaling.enabled }}{{ $count = .Values.engine.autoscaling.maxReplicas }}{{ end -}}
[{{- range $i, $_ := until (int $count) -}}{{- if $i }}, {{ end -}}"http://{{ $.Release.Name }}-engine-{{ $i }}.{{ $.Release.Name }}-engine:{{ $.Values.engine.port }}"{{- end -}}]
{{- end -}}
{{- end -}}

{{- define "loragate.secretEnv" -}}
- name: LORAGATE_KEY_PEPPER
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: key-pepper}}
- name: LORAGATE_SALT_SECRET
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: salt-secret}}
- name: LORAGATE_ENGINE_ADMIN_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: engine-admin-token}}
- name: LORAGATE_METRICS_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: metrics-token}}
{{ include "loragate.databaseEnv" . }}
{{- end -}}

{{/* The password comes from the secret; Kubernetes expands $(DATABASE_PASSWORD) in the URL,
     which must come after it. Not a LORAGATE_ name: the settings never see it alone. */}}
{{- define "loragate.databaseEnv" -}}
- name: DATABASE_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ .Values.existingSecret }}, key: {{ .Values.database.passwordKey }}, optional: true}}
- name: LORAGATE_DATABASE_URL
  value: {{ .Values.database.url | quote }}
{{- end -}}

{{- define "loragate.engineLabels" -}}
app.kubernetes.io/name: loragate-engine
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}


{{/* Where engines fetch adapters: the gateway Service (any replica serves any adapter). */}}
{{- define "loragate.adapterSource" -}}
http://{{ .Release.Name }}-gateway:80
{{- end -}}
