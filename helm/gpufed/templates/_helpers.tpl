{{- define "gpufed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpufed.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpufed.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ include "gpufed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* selector labels: call with (dict "ctx" $ "component" "name") */}}
{{- define "gpufed.selector" -}}
app.kubernetes.io/name: {{ include "gpufed.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpufed.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpufed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpufed.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpufed.controllerURL" -}}
http://{{ include "gpufed.fullname" . }}-controller.{{ .Release.Namespace }}.svc:{{ .Values.controller.port }}
{{- end -}}

{{/*
An init container (once) or a sidecar (loop) copying files the controller serves, each
already checked by promtool/amtool, into /config; a changed file triggers a reload.
call with (dict "ctx" $ "name" "sync" "files" (list ...) "loop" true "reload" "http://...")
*/}}
{{- define "gpufed.configSync" -}}
- name: {{ .name }}
  image: {{ .ctx.Values.images.busybox }}
  command: ["sh", "/scripts/config-sync.sh"]
  env:
    - name: GPUFED_URL
      value: {{ include "gpufed.controllerURL" .ctx | quote }}
    - name: FILES
      value: {{ join " " .files | quote }}
    - name: LOOP_SECONDS
      value: {{ if .loop }}{{ .ctx.Values.children.syncInterval | quote }}{{ else }}"0"{{ end }}
    - name: RELOAD_URL
      value: {{ .reload | default "" | quote }}
    {{- with .env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumeMounts:
    - {name: config, mountPath: /config}
    - {name: scripts, mountPath: /scripts, readOnly: true}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 32Mi}
{{- end -}}

{{/* Thanos Receive hashrings: every receive pod by its stable DNS name; ketama, as gpufed
renders it (Thanos' default, hashmod, moves most series when an ingestor joins) */}}
{{- define "gpufed.hashrings" -}}
{{- $receive := printf "%s-thanos-receive" (include "gpufed.fullname" .) -}}
{{- $endpoints := list -}}
{{- range $i := until (int .Values.thanos.receive.replicas) -}}
{{- $endpoints = append $endpoints (printf "%s-%d.%s.%s.svc:10901" $receive $i $receive $.Release.Namespace) -}}
{{- end -}}
{{- list (dict "hashring" "default" "algorithm" "ketama" "endpoints" $endpoints) | toPrettyJson -}}
{{- end -}}
