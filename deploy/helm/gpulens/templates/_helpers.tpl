{{- define "gpulens.labels" -}}
app.kubernetes.io/name: gpulens
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpulens.selector" -}}
app.kubernetes.io/name: gpulens
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
