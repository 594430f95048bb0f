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

{{/*
An image reference from {registry, repository, tag, digest}, as kube-prometheus-stack
splits it: global.imageRegistry, when set, replaces every registry (one override for an
air-gapped mirror). A repository whose first part is a host (has a dot or a port, or is
localhost: Docker's rule) is whole already and gets no registry, so the old
`image.repository=registry.example.com/infra/gpufed` keeps working. A plain string (the
images.* form before 0.2, deprecated) is used as it is.
call with (dict "ctx" $ "image" <string or map>)
*/}}
{{- define "gpufed.imageRef" -}}
{{- $img := .image -}}
{{- if kindIs "string" $img -}}
{{- $img -}}
{{- else -}}
{{- $registry := ((.ctx.Values.global | default dict).imageRegistry | default $img.registry) | default "" -}}
{{- $first := first (splitList "/" $img.repository) -}}
{{- $hosted := or (contains "." $first) (contains ":" $first) (eq $first "localhost") -}}
{{- if and $registry (not $hosted) }}{{ $registry }}/{{ end }}{{ $img.repository }}
{{- with $img.tag }}:{{ . }}{{ end }}{{ with $img.digest }}@{{ . }}{{ end }}
{{- end -}}
{{- end -}}

{{/* images.<name>: call with (dict "ctx" $ "name" "prometheus") */}}
{{- define "gpufed.componentImage" -}}
{{- include "gpufed.imageRef" (dict "ctx" .ctx "image" (index .ctx.Values.images .name)) -}}
{{- end -}}

{{/* gpufed's own image (controller, exporter, relay); tag default: the chart's appVersion */}}
{{- define "gpufed.image" -}}
{{- $img := deepCopy .Values.image -}}
{{- $_ := set $img "tag" (.Values.image.tag | default .Chart.AppVersion) -}}
{{- include "gpufed.imageRef" (dict "ctx" . "image" $img) -}}
{{- end -}}

{{- define "gpufed.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpufed.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpufed.controllerURL" -}}
{{ include "gpufed.scheme" . }}://{{ include "gpufed.fullname" . }}-controller.{{ .Release.Namespace }}.svc:{{ .Values.controller.port }}
{{- end -}}

{{/* The scheme of every in-release URL: https once tls.enabled (every server of the release
serves TLS then; docs/tls-install.md) */}}
{{- define "gpufed.scheme" -}}
{{- ternary "https" "http" (.Values.tls.enabled | default false) -}}
{{- end -}}

{{/*
An init container (once) or a sidecar (loop) copying files the controller serves, each
already checked by promtool/amtool, into /config; a changed file triggers a reload.
call with (dict "ctx" $ "name" "sync" "files" (list ...) "loop" true "reload" "http://...")
*/}}
{{- define "gpufed.configSync" -}}
{{- $tls := .ctx.Values.tls.enabled -}}
- name: {{ .name }}
  {{- if $tls }}
  # TLS: the controller and the local server require the client certificate, which busybox's
  # wget cannot present; gpufed's image runs the same steps with Python (http-client.yml)
  image: {{ include "gpufed.image" .ctx }}
  imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
  command: ["python3", "/scripts/config-sync.py"]
  {{- else }}
  image: {{ include "gpufed.componentImage" (dict "ctx" .ctx "name" "busybox") }}
  command: ["sh", "/scripts/config-sync.sh"]
  {{- end }}
  env:
    - name: GPUFED_URL
      value: {{ include "gpufed.controllerURL" .ctx | quote }}
    - name: FILES
      value: {{ join " " .files | quote }}
    - name: LOOP_SECONDS
      value: {{ if .loop }}{{ .ctx.Values.children.syncInterval | quote }}{{ else }}"0"{{ end }}
    - name: RELOAD_URL
      value: {{ ternary (.reload | default "" | replace "http://" "https://") (.reload | default "") $tls | quote }}
    {{- if $tls }}
    - {name: HTTP_CONFIG_FILE, value: {{ include "gpufed.webConfigDir" .ctx }}/http-client.yml}
    {{- end }}
    - name: GPUFED_READ_TOKEN  # read scope: the controller's budget never throttles its own install
      valueFrom:
        secretKeyRef: {name: {{ .ctx.Values.controller.token.existingSecret | default (printf "%s-controller-token" (include "gpufed.fullname" .ctx)) }}, key: GPUFED_READ_TOKEN, optional: true}
    {{- with .env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumeMounts:
    - {name: config, mountPath: /config}
    - {name: scripts, mountPath: /scripts, readOnly: true}
    {{- if $tls }}
    - {name: web-config, mountPath: {{ include "gpufed.webConfigDir" .ctx }}, readOnly: true}
    {{- include "gpufed.tlsMount" .ctx | nindent 4 }}
    {{- end }}
  resources:
    {{- if $tls }}
    requests: {cpu: 10m, memory: 32Mi}
    limits: {memory: 96Mi}   # Python, pydantic and yaml (webconfig.client) loaded
    {{- else }}
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 32Mi}
    {{- end }}
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

{{/* A child StatefulSet's name: one per region (children.yaml and the controller agree) */}}
{{- define "gpufed.childSet" -}}
{{- printf "%s-child-%s" (include "gpufed.fullname" .ctx) .region | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/*
federation.yaml as the controller reads it: .Values.federation plus what the chart knows
(the controller's URL, where the children write, the master and its meta-monitoring,
HAMi's jobs, the Alertmanager pods). A key the user set in .Values.federation wins.
*/}}
{{- define "gpufed.spec" -}}
{{- $fullname := include "gpufed.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $spec := deepCopy .Values.federation -}}
{{- $_ := set $spec "children" (merge (dict "http_sd_url" (include "gpufed.controllerURL" .)) (deepCopy $spec.children)) -}}
{{- $masters := list -}}
{{- range $i := until (int .Values.master.replicas) -}}
{{- $masters = append $masters (printf "%s-master-%d.%s-master.%s.svc:9090" $fullname $i $fullname $ns) -}}
{{- end -}}
{{- $scheme := include "gpufed.scheme" . -}}
{{- if not (hasKey $spec "remote_write") -}}
{{- $writes := list -}}
{{- if .Values.thanos.enabled -}}
{{- $writes = append $writes (dict "name" "thanos-receive" "url" (printf "http://%s-thanos-receive.%s.svc:19291/api/v1/receive" $fullname $ns)) -}}
{{- else if .Values.master.enabled -}}
{{- range $i, $m := $masters -}}
{{- $writes = append $writes (dict "name" (printf "master-%d" $i) "url" (printf "%s://%s/api/v1/write" $scheme $m)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $spec "remote_write" $writes -}}
{{- end -}}
{{- if .Values.hami.enabled -}}
{{- $names := list -}}
{{- range $spec.jobs }}{{ $names = append $names .name }}{{ end -}}
{{- $jobs := $spec.jobs -}}
{{- range $job := list "hami-scheduler" "hami-device-plugin" -}}
{{- if not (has $job $names) -}}
{{- $jobs = append $jobs (dict "name" $job "scrape_interval" $.Values.hami.scrapeInterval "keep_metrics" $.Values.hami.keepMetrics) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $spec "jobs" $jobs -}}
{{- end -}}
{{- with .Values.extraJobs -}}
{{- $names := list -}}
{{- range $spec.jobs }}{{ $names = append $names .name }}{{ end -}}
{{- $jobs := $spec.jobs -}}
{{- range $extra := . -}}
{{- if not (has $extra.name $names) -}}
{{- $job := dict "name" $extra.name "scrape_interval" ($extra.interval | default "30s") -}}
{{- with $extra.keepMetrics }}{{ $_ := set $job "keep_metrics" . }}{{ end -}}
{{- with $extra.scheme }}{{ $_ := set $job "scheme" . }}{{ end -}}
{{- with $extra.metricsPath }}{{ $_ := set $job "metrics_path" . }}{{ end -}}
{{- $jobs = append $jobs $job -}}
{{- end -}}
{{- end -}}
{{- $_ := set $spec "jobs" $jobs -}}
{{- end -}}
{{- if .Values.master.enabled -}}
{{- $byRegion := dict -}}
{{- range $region, $count := .Values.children.perRegion -}}
{{- $set := include "gpufed.childSet" (dict "ctx" $ "region" $region) -}}
{{- $_ := set $byRegion $region (printf "%s://%s-{ordinal}.%s.%s.svc:9090" $scheme $set $set $ns) -}}
{{- end -}}
{{- $monitoring := dict "child_url_by_region" $byRegion "masters" $masters "controllers" (list (printf "%s-controller.%s.svc:%d" $fullname $ns (int .Values.controller.port))) -}}
{{- if .Values.tls.enabled -}}
{{- /* every region with children is in child_url_by_region; the fallback (the spec's default
host) must say https too once the children serve TLS */ -}}
{{- $_ := set $monitoring "child_url" "https://child-{child}:9090" -}}
{{- end -}}
{{- $defaults := dict "replicas" (int .Values.master.replicas) "retention" .Values.master.retention "data_dir" "/prometheus" "monitoring" $monitoring -}}
{{- $_ := set $spec "master" (merge (deepCopy ($spec.master | default dict)) $defaults) -}}
{{- end -}}
{{- if and (hasKey $spec "alerting") .Values.alertmanager.enabled (not (hasKey $spec.alerting "replicas")) -}}
{{- $am := printf "%s-alertmanager" $fullname -}}
{{- $replicas := list -}}
{{- range $i := until (int .Values.alertmanager.replicas) -}}
{{- $replicas = append $replicas (dict "name" (printf "am-%d" $i) "host" (printf "%s-%d.%s.%s.svc" $am $i $am $ns)) -}}
{{- end -}}
{{- $alerting := merge (dict "replicas" $replicas) (deepCopy $spec.alerting) -}}
{{- if and .Values.dingtalk.enabled (not (hasKey $alerting "relay_url")) -}}
{{- $_ := set $alerting "relay_url" (printf "%s://%s-dingtalk.%s.svc:%d" $scheme $fullname $ns (int .Values.dingtalk.port)) -}}
{{- end -}}
{{- $_ := set $spec "alerting" $alerting -}}
{{- end -}}
{{- if and .Values.logs.enabled (hasKey $spec "logs") -}}
{{- $logs := deepCopy ($spec.logs | default dict) -}}
{{- $_ := set $logs "loki" (merge (deepCopy ($logs.loki | default dict)) (dict "host" (printf "%s-loki" $fullname))) -}}
{{- $_ := set $logs "config_dir" ($logs.config_dir | default "/config/logs") -}}
{{- $_ := set $spec "logs" $logs -}}
{{- end -}}
{{- if and .Values.tls.enabled (not (hasKey $spec "tls")) -}}
{{- $m := .Values.tls.mountPath -}}
{{- /* every hop the release serves: the exporters (job gpu, and job node when this chart runs
node-exporter; other jobs stay plain), the controller's HTTP SD, the children's writes to the masters (Thanos Receive's TLS
is not rendered: plain with thanos.enabled), the Alertmanagers and the relay */ -}}
{{- $hops := dict "scrape" (ternary (list "gpu" "node") (list "gpu") (and .Values.nodeExporter.enabled true)) "http_sd" true "remote_write" (not .Values.thanos.enabled) "long_term" false "alertmanager" (and .Values.alertmanager.enabled true) "relay" (and .Values.dingtalk.enabled true) -}}
{{- $serve := dict "cert_file" (printf "%s/tls.crt" $m) "key_file" (printf "%s/tls.key" $m) "client_auth_type" .Values.tls.clientAuthType -}}
{{- $_ := set $spec "tls" (dict "ca_file" (printf "%s/ca.crt" $m) "cert_file" (printf "%s/%s" $m .Values.tls.clientCertFile) "key_file" (printf "%s/%s" $m .Values.tls.clientKeyFile) "server_name" (include "gpufed.exporterServerName" .) "hops" $hops "serve" $serve) -}}
{{- end -}}
{{- if and .Values.grafana.server.enabled (hasKey $spec "grafana") -}}
{{- $grafana := deepCopy ($spec.grafana | default dict) -}}
{{- $prom := ternary (printf "http://%s-thanos-query.%s.svc:10904" $fullname $ns) (printf "http://%s-master.%s.svc:9090" $fullname $ns) .Values.thanos.enabled -}}
{{- $_ := set $grafana "prometheus_url" ($grafana.prometheus_url | default $prom) -}}
{{- if .Values.logs.enabled -}}
{{- $_ := set $grafana "loki_url" ($grafana.loki_url | default (printf "http://%s-loki-read.%s.svc:3100" $fullname $ns)) -}}
{{- end -}}
{{- $_ := set $spec "grafana" $grafana -}}
{{- end -}}
{{- toYaml $spec -}}
{{- end -}}

{{/* Name prefix of the controller state's ConfigMaps (store.type kubernetes). */}}
{{- define "gpufed.statePrefix" -}}
{{- .Values.controller.store.configMapPrefix | default (printf "%s-state" (include "gpufed.fullname" .)) -}}
{{- end }}

{{/* The Prometheus line the spec names (federation.prometheus.version, default 3): flags that
changed in 3.0 follow it, as gpufed's own renderers do (sharder/kernel/prometheus_versions.py). */}}
{{- define "gpufed.prometheusMajor" -}}
{{- (((.Values.federation.prometheus | default dict).version | default "3") | toString | trimPrefix "v" | splitList ".") | first -}}
{{- end }}

{{- define "gpufed.agentFlag" -}}
{{- if eq (include "gpufed.prometheusMajor" .) "2" }}--enable-feature=agent{{ else }}--agent{{ end -}}
{{- end }}

{{/* A pod's placement from a component's values: nodeSelector, tolerations, affinity,
priorityClassName (each left out when empty). Call with the component's values; indent
to the pod spec. */}}
{{- define "gpufed.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* TLS (values: tls): the Secret with tls.crt, tls.key and ca.crt, and the name the
children check in the exporters' certificate (they scrape pod IPs) */}}
{{- define "gpufed.tlsSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "gpufed.fullname" .)) -}}
{{- end -}}

{{- define "gpufed.exporterServerName" -}}
{{- printf "%s-exporter.%s.svc" (include "gpufed.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The tls volume (the Secret) for a pod spec's volumes; its mount for a container */}}
{{- define "gpufed.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret: {secretName: {{ include "gpufed.tlsSecret" . }}}
{{- end }}
{{- end -}}

{{- define "gpufed.tlsMount" -}}
{{- if .Values.tls.enabled }}
- {name: tls, mountPath: {{ .Values.tls.mountPath }}, readOnly: true}
{{- end }}
{{- end -}}

{{/* Where the <release>-web-config ConfigMap is mounted: web-config.yml (what every server of
the release serves, exporter-toolkit's format) and http-client.yml (Prometheus' http_config:
what gpufed's own clients and the probes present) */}}
{{- define "gpufed.webConfigDir" -}}
/etc/gpufed/web
{{- end -}}

{{/* The web-config volume and its mount (tls.enabled only) */}}
{{- define "gpufed.webConfigVolume" -}}
{{- if .Values.tls.enabled }}
- name: web-config
  configMap: {name: {{ include "gpufed.fullname" . }}-web-config}
{{- end }}
{{- end -}}

{{- define "gpufed.webConfigMount" -}}
{{- if .Values.tls.enabled }}
- {name: web-config, mountPath: {{ include "gpufed.webConfigDir" . }}, readOnly: true}
{{- end }}
{{- end -}}

{{/* A kubelet probe of a server that requires client certificates (the kubelet presents
none): the image's own client with http-client.yml. call with (dict "ctx" $ "kind"
"prometheus|alertmanager|gpufed" "port" 9090 "path" "/-/ready") */}}
{{- define "gpufed.tlsProbe" -}}
{{- $client := printf "%s/http-client.yml" (include "gpufed.webConfigDir" .ctx) -}}
exec:
  {{- if eq .kind "prometheus" }}
  command: [promtool, check, {{ ternary "healthy" "ready" (eq .path "/-/healthy") }}, "--url=https://127.0.0.1:{{ .port }}", "--http.config.file={{ $client }}"]
  {{- else if eq .kind "alertmanager" }}
  command: [amtool, "--alertmanager.url=https://127.0.0.1:{{ .port }}", "--http.config.file={{ $client }}", config, show]
  {{- else }}
  command: [python3, -c, "import pathlib, urllib.request; from webconfig import client; urllib.request.urlopen('https://127.0.0.1:{{ .port }}{{ .path }}', timeout=4, context=client.client_context(pathlib.Path('{{ $client }}')))"]
  {{- end }}
timeoutSeconds: 5
{{- end -}}

{{/* The files Alertmanager reads secrets from, as federation.alerting names them (WeCom
api_secret_file, a webhook's credentials_file, an e-mail's auth_password_file): a JSON list
of {field, path, key}, key being the Secret key the file comes from (its name under
alertmanager.secretFiles.mountPath). A path elsewhere fails the render, naming the field. */}}
{{- define "gpufed.alertmanagerSecretFiles" -}}
{{- $mount := trimSuffix "/" .Values.alertmanager.secretFiles.mountPath -}}
{{- $found := list -}}
{{- $alerting := .Values.federation.alerting | default dict -}}
{{- range $i, $r := ($alerting.receivers | default list) -}}
{{- $at := printf "federation.alerting.receivers[%d]" $i -}}
{{- range $j, $w := ($r.webhooks | default list) -}}
{{- with $w.credentials_file }}{{ $found = append $found (dict "field" (printf "%s.webhooks[%d].credentials_file" $at $j) "path" .) }}{{ end -}}
{{- end -}}
{{- range $j, $e := ($r.emails | default list) -}}
{{- with $e.auth_password_file }}{{ $found = append $found (dict "field" (printf "%s.emails[%d].auth_password_file" $at $j) "path" .) }}{{ end -}}
{{- end -}}
{{- range $j, $w := ($r.wecom | default list) -}}
{{- with $w.api_secret_file }}{{ $found = append $found (dict "field" (printf "%s.wecom[%d].api_secret_file" $at $j) "path" .) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- range $found -}}
{{- $key := trimPrefix (printf "%s/" $mount) .path -}}
{{- if or (eq $key .path) (not (regexMatch "^[-._a-zA-Z0-9]+$" $key)) (eq $key ".") (eq $key "..") -}}
{{- fail (printf "%s is %q; the chart mounts alertmanager.secretFiles at %s in every Alertmanager: write %s/%s (the Secret's key)" .field .path $mount $mount (base .path)) -}}
{{- end -}}
{{- $_ := set . "key" $key -}}
{{- end -}}
{{- toJson $found -}}
{{- end -}}
