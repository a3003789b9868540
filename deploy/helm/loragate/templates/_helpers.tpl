{{- define "loragate.engineUrls" -}}
[{{- range $i, $_ := until (int .Values.engine.replicas) -}}{{- if $i }}, {{ end -}}"http://{{ $.Release.Name }}-engine-{{ $i }}.{{ $.Release.Name }}-engine:{{ $.Values.engine.port }}"{{- end -}}]
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
{{- end -}}
