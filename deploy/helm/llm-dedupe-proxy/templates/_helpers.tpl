{{/* Names, labels, and the values the templates share. */}}

{{- define "llm-dedupe-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, at most 57 characters so that "-admin" and "-redis" fit in 63. */}}
{{- define "llm-dedupe-proxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 57 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llm-dedupe-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; the component (proxy, admin, redis, …) is added by each. */}}
{{- define "llm-dedupe-proxy.labels" -}}
helm.sh/chart: {{ include "llm-dedupe-proxy.chart" . }}
app.kubernetes.io/name: {{ include "llm-dedupe-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The proxy's pods. */}}
{{- define "llm-dedupe-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-dedupe-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: proxy
{{- end }}

{{/* The in-chart Redis's pod. */}}
{{- define "llm-dedupe-proxy.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-dedupe-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "llm-dedupe-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llm-dedupe-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llm-dedupe-proxy.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "llm-dedupe-proxy.fullname" .) }}
{{- end }}

{{/* The image: by digest when one is set (the tag is then only a label). */}}
{{- define "llm-dedupe-proxy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* image.pullPolicy, or: IfNotPresent for an image by digest, which never changes; else Always. */}}
{{- define "llm-dedupe-proxy.pullPolicy" -}}
{{- .Values.image.pullPolicy | default (ternary "IfNotPresent" "Always" (ne .Values.image.digest "")) }}
{{- end }}

{{/*
A Kubernetes quantity in its base unit, as a float: 512Mi, 1.5Gi, 500M, 100m, 2, or a plain
number. Fails naming the value when it cannot read it.
*/}}
{{- define "llm-dedupe-proxy.quantity" -}}
{{- $name := index . 0 }}
{{- $q := index . 1 }}
{{- if or (kindIs "float64" $q) (kindIs "int64" $q) (kindIs "int" $q) }}
{{- float64 $q }}
{{- else }}
{{- $q = toString $q }}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|m|k|M|G|T)?$" $q) }}
{{- fail (printf "%s: %q is not a quantity the chart can read (e.g. 512Mi, 1.5Gi, 500m)" $name $q) }}
{{- end }}
{{- $units := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 }}
{{- $n := regexReplaceAll "[A-Za-z]+$" $q "" }}
{{- $u := trimPrefix $n $q }}
{{- mulf (float64 $n) (get $units $u) }}
{{- end }}
{{- end }}

{{/*
GOMEMLIMIT, in bytes: goRuntime.memoryLimitPercent of resources.limits.memory; empty
without either. See ADR 0072.
*/}}
{{- define "llm-dedupe-proxy.goMemLimit" -}}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- $pct := .Values.goRuntime.memoryLimitPercent | default 0 }}
{{- if and $limit (gt (int $pct) 0) }}
{{- $bytes := include "llm-dedupe-proxy.quantity" (list "resources.limits.memory" $limit) | float64 }}
{{- printf "%d" (int64 (floor (divf (mulf $bytes $pct) 100))) }}
{{- end }}
{{- end }}

{{/*
GOMAXPROCS: goRuntime.maxProcs; else unset with a CPU limit (Go 1.25+ follows it), else the
CPU request rounded up, at least 2. See ADR 0072.
*/}}
{{- define "llm-dedupe-proxy.goMaxProcs" -}}
{{- $r := .Values.resources | default dict }}
{{- if not (kindIs "invalid" .Values.goRuntime.maxProcs) }}
{{- int .Values.goRuntime.maxProcs }}
{{- else if not (dig "limits" "cpu" "" $r) }}
{{- $cpu := include "llm-dedupe-proxy.quantity" (list "resources.requests.cpu" (dig "requests" "cpu" "0" $r)) | float64 }}
{{- max 2 (int64 (ceil $cpu)) }}
{{- end }}
{{- end }}

{{/* Where the pod reads its configuration. */}}
{{- define "llm-dedupe-proxy.configDir" -}}/etc/llm-dedupe-proxy/config{{- end }}
{{- define "llm-dedupe-proxy.redisCADir" -}}/etc/llm-dedupe-proxy/redis-ca{{- end }}

{{/* The in-chart Redis's Service and port. */}}
{{- define "llm-dedupe-proxy.redisHost" -}}
{{- printf "%s-redis" (include "llm-dedupe-proxy.fullname" .) }}
{{- end }}

{{/* redis.addrs of the configuration, as a JSON list. */}}
{{- define "llm-dedupe-proxy.redisAddrs" -}}
{{- if .Values.redis.inChart.enabled }}
{{- list (printf "%s:6379" (include "llm-dedupe-proxy.redisHost" .)) | toJson }}
{{- else }}
{{- .Values.redis.addrs | toJson }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: at least shutdown_delay + shutdown_timeout + 5 s, so that the
kubelet's SIGKILL never comes before the proxy has drained, finished its requests and handed
its flights over (5 s: the handover and the last answers' writes). See ADR 0053.
*/}}
{{- define "llm-dedupe-proxy.gracePeriodFloor" -}}
{{- add (int .Values.shutdown.delaySeconds) (int .Values.shutdown.timeoutSeconds) 5 }}
{{- end }}

{{- define "llm-dedupe-proxy.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- include "llm-dedupe-proxy.gracePeriodFloor" . }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
The configuration file: .Values.config with the keys the chart owns set from its own values.
Secrets are not in it: they come from the Secret as LLM_DEDUPE_* variables.
*/}}
{{- define "llm-dedupe-proxy.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $_ := set $cfg "listen" (printf ":%d" (int .Values.ports.http)) }}
{{- $r := deepCopy (get $cfg "redis" | default dict) }}
{{- $_ = set $r "addrs" (include "llm-dedupe-proxy.redisAddrs" . | fromJsonArray) }}
{{- $_ = set $r "master_name" (ternary .Values.redis.masterName "" (eq .Values.redis.mode "sentinel")) }}
{{- $_ = set $r "username" .Values.redis.username }}
{{- $_ = set $r "db" (int .Values.redis.db) }}
{{- $_ = set $r "tls" .Values.redis.tls.enabled }}
{{- $_ = set $r "tls_ca_file" (ternary (printf "%s/%s" (include "llm-dedupe-proxy.redisCADir" .) .Values.redis.tls.caKey) "" (ne .Values.redis.tls.caSecret "")) }}
{{- $_ = set $cfg "redis" $r }}
{{- $_ = set $cfg "admin" (dict "listen" (ternary (printf ":%d" (int .Values.ports.admin)) "" .Values.admin.enabled)) }}
{{- $_ = set $cfg "shutdown_delay" (printf "%ds" (int .Values.shutdown.delaySeconds)) }}
{{- $_ = set $cfg "shutdown_timeout" (printf "%ds" (int .Values.shutdown.timeoutSeconds)) }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The rules between values that values.schema.json cannot state. Each failure names the value
and the rule, and stops the install before anything is applied.
*/}}
{{- define "llm-dedupe-proxy.validate" -}}
{{- $r := .Values.redis }}
{{- if $r.inChart.enabled }}
  {{- if $r.addrs }}
    {{- fail "redis.addrs: leave it empty with redis.inChart.enabled (the in-chart Redis is used)" }}
  {{- end }}
  {{- if ne $r.mode "standalone" }}
    {{- fail "redis.mode: the in-chart Redis is standalone" }}
  {{- end }}
  {{- if $r.tls.enabled }}
    {{- fail "redis.tls.enabled: the in-chart Redis serves no TLS" }}
  {{- end }}
  {{- if .Values.secrets.redisPassword }}
    {{- fail "secrets.redisPassword: the in-chart Redis has no password; leave it empty" }}
  {{- end }}
{{- else }}
  {{- if not $r.addrs }}
    {{- fail "redis.addrs: set the address (host:port) of the Redis the instances share, or redis.inChart.enabled=true to try the chart with a Redis of its own (not for production)" }}
  {{- end }}
  {{- if and (eq $r.mode "standalone") (gt (len $r.addrs) 1) }}
    {{- fail "redis.addrs: a standalone Redis has one address; for a Redis Cluster set redis.mode=cluster" }}
  {{- end }}
  {{- if and (eq $r.mode "cluster") (lt (len $r.addrs) 2) }}
    {{- fail "redis.addrs: redis.mode=cluster needs two or more node addresses (with one the client takes it for a standalone server)" }}
  {{- end }}
{{- end }}
{{- if and (eq $r.mode "sentinel") (not $r.masterName) }}
  {{- fail "redis.masterName: redis.mode=sentinel needs the name of the master the Sentinels watch" }}
{{- end }}
{{- if and $r.masterName (ne $r.mode "sentinel") }}
  {{- fail "redis.masterName: set only with redis.mode=sentinel" }}
{{- end }}
{{- if and (eq $r.mode "cluster") (ne (int $r.db) 0) }}
  {{- fail "redis.db: a Redis Cluster has database 0 only" }}
{{- end }}
{{- if and $r.tls.caSecret (not $r.tls.enabled) }}
  {{- fail "redis.tls.caSecret: needs redis.tls.enabled=true" }}
{{- end }}

{{- if .Values.admin.enabled }}
  {{- if eq (int .Values.ports.admin) (int .Values.ports.http) }}
    {{- fail "ports.admin: must differ from ports.http" }}
  {{- end }}
  {{- if and (not .Values.secrets.existingSecret) (lt (len .Values.secrets.adminToken) 16) }}
    {{- fail "secrets.adminToken: admin.enabled needs a token of at least 16 characters (or secrets.existingSecret holding it)" }}
  {{- end }}
{{- end }}

{{- $readiness := mul (int .Values.probes.readiness.periodSeconds) (int .Values.probes.readiness.failureThreshold) }}
{{- if lt (int .Values.shutdown.delaySeconds) (int $readiness) }}
  {{- fail (printf "shutdown.delaySeconds: must be at least probes.readiness.periodSeconds × failureThreshold (%ds), the time the readiness probe takes to see a draining instance, got %ds" (int $readiness) (int .Values.shutdown.delaySeconds)) }}
{{- end }}
{{- $floor := include "llm-dedupe-proxy.gracePeriodFloor" . | int }}
{{- if lt (include "llm-dedupe-proxy.terminationGracePeriodSeconds" . | int) $floor }}
  {{- fail (printf "terminationGracePeriodSeconds: must be at least shutdown.delaySeconds + shutdown.timeoutSeconds + 5 (%ds), or empty, got %d" $floor (int .Values.terminationGracePeriodSeconds)) }}
{{- end }}

{{- $replicas := ternary .Values.autoscaling.minReplicas .Values.replicaCount .Values.autoscaling.enabled | int }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
  {{- fail "autoscaling.minReplicas: must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- with .Values.podDisruptionBudget }}
{{- if .enabled }}
  {{- if and (not (kindIs "invalid" .minAvailable)) (not (kindIs "invalid" .maxUnavailable)) }}
    {{- fail "podDisruptionBudget: set maxUnavailable or minAvailable, not both (set the other to null)" }}
  {{- end }}
  {{- if and (kindIs "invalid" .minAvailable) (kindIs "invalid" .maxUnavailable) }}
    {{- fail "podDisruptionBudget: set maxUnavailable or minAvailable" }}
  {{- end }}
  {{- if and (not (kindIs "invalid" .minAvailable)) (not (kindIs "string" .minAvailable)) }}
    {{- if ge (int .minAvailable) $replicas }}
      {{- fail (printf "podDisruptionBudget.minAvailable: must be below the replica count (%d), or no pod could ever be evicted and node drains would hang" $replicas) }}
    {{- end }}
  {{- end }}
  {{- if and (kindIs "string" .minAvailable) (ge (trimSuffix "%" .minAvailable | int) 100) }}
    {{- fail (printf "podDisruptionBudget.minAvailable: %s would let no pod ever be evicted, and node drains would hang; stay below 100%%" .minAvailable) }}
  {{- end }}
{{- end }}
{{- end }}

{{- range .Values.extraEnv }}
  {{- if hasPrefix "LLM_DEDUPE_" .name }}
    {{- fail (printf "extraEnv: %s: set the proxy's configuration in config (checked by the schema) and its secrets in secrets, not as LLM_DEDUPE_ variables" .name) }}
  {{- end }}
{{- end }}
{{- range .Values.envFrom }}
  {{- if hasPrefix "LLM_DEDUPE_" (.prefix | default "") }}
    {{- fail "envFrom: a prefix LLM_DEDUPE_ would set the proxy's configuration: set it in config (checked by the schema) and its secrets in secrets" }}
  {{- end }}
{{- end }}

{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.api.from) }}
  {{- fail "networkPolicy.api.from: name the peers that may reach the API (clients, the ingress controller, Prometheus); empty would let every pod of the cluster in. [{\"namespaceSelector\": {}}] says every pod on purpose" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
  {{- fail "ingress.hosts: name the host names the Ingress routes to the proxy" }}
{{- end }}
{{- if and .Values.httpRoute.enabled (not .Values.httpRoute.parentRefs) }}
  {{- fail "httpRoute.parentRefs: name the Gateway the route attaches to" }}
{{- end }}
{{- $_ := include "llm-dedupe-proxy.goMemLimit" . }}
{{- $_ = include "llm-dedupe-proxy.goMaxProcs" . }}
{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES: the release's namespace, then tracing.resourceAttributes. */}}
{{- define "llm-dedupe-proxy.resourceAttributes" -}}
{{- $attrs := list (printf "k8s.namespace.name=%s" .Release.Namespace) }}
{{- range $k, $v := .Values.tracing.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $attrs }}
{{- end }}
