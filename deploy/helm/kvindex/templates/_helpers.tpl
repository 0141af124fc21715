{{/* Names and labels. */}}
{{- define "kvindex.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvindex.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvindex.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvindex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: replica
{{- end -}}

{{/* Labels of everything but the agents' ConfigMap. */}}
{{- define "kvindex.labels" -}}
{{ include "kvindex.commonLabels" . }}
app.kubernetes.io/component: replica
{{- end -}}

{{- define "kvindex.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kvindex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kvindex.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvindex.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvindex.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* The models section of kvindex.yaml. */}}
{{- define "kvindex.models" -}}
{{- $models := list -}}
{{- range .Values.models -}}
{{- $m := dict "name" .name "block_size" (int .blockSize) -}}
{{- if .tokenizerURLs -}}{{- $_ := set $m "tokenizer_urls" .tokenizerURLs -}}{{- end -}}
{{- $models = append $models $m -}}
{{- end -}}
{{- toYaml $models -}}
{{- end -}}

{{/* The nats section, for replicas and agents. */}}
{{- define "kvindex.nats" -}}
{{- $n := dict "url" .Values.nats.url -}}
{{- if .Values.nats.credsSecret -}}
{{- $_ := set $n "creds_file" "/etc/kvindex/nats/creds" -}}
{{- end -}}
{{- $t := .Values.nats.tls -}}
{{- if $t.enabled -}}
{{- if not $t.secretName -}}{{- fail "nats.tls.enabled needs nats.tls.secretName" -}}{{- end -}}
{{- $tls := dict -}}
{{- if $t.ca -}}{{- $_ := set $tls "ca_file" "/etc/kvindex/nats-tls/ca.crt" -}}{{- end -}}
{{- if $t.clientCert -}}
{{- $_ := set $tls "cert_file" "/etc/kvindex/nats-tls/tls.crt" -}}
{{- $_ := set $tls "key_file" "/etc/kvindex/nats-tls/tls.key" -}}
{{- end -}}
{{- if $t.serverName -}}{{- $_ := set $tls "server_name" $t.serverName -}}{{- end -}}
{{- if not $tls -}}{{- fail "nats.tls.enabled needs nats.tls.ca, nats.tls.clientCert or nats.tls.serverName" -}}{{- end -}}
{{- $_ := set $n "tls" $tls -}}
{{- end -}}
{{- toYaml $n -}}
{{- end -}}

{{/* The replicas' kvindex.yaml (a dict, merged with .Values.config). */}}
{{- define "kvindex.config" -}}
{{- $c := dict "grpc_listen" (printf ":%d" (int .Values.service.grpcPort)) "metrics_listen" (printf ":%d" (int .Values.service.metricsPort)) -}}
{{- $_ := set $c "models" (include "kvindex.models" . | fromYamlArray) -}}
{{- if eq .Values.mode "fleet" -}}
{{- $_ := set $c "nats" (include "kvindex.nats" . | fromYaml) -}}
{{- else if eq .Values.mode "direct" -}}
{{- $model := (index .Values.models 0).name -}}
{{- if .Values.discovery.kubernetes.enabled -}}
{{- $k := .Values.discovery.kubernetes -}}
{{- $_ := set $c "discovery" (dict "kubernetes" (dict "namespace" (default .Release.Namespace $k.namespace) "selector" $k.selector "model" $model "port" (int $k.port) "replay_port" (int $k.replayPort) "metrics_port" (int $k.metricsPort) "dp_size" (int $k.dpSize))) -}}
{{- else if .Values.discovery.dns.enabled -}}
{{- $d := .Values.discovery.dns -}}
{{- $_ := set $c "discovery" (dict "dns" (dict "name" $d.name "interval" $d.interval "model" $model "port" (int $d.port) "replay_port" (int $d.replayPort) "metrics_port" (int $d.metricsPort) "dp_size" (int $d.dpSize))) -}}
{{- else -}}
{{- fail "mode direct needs discovery.kubernetes.enabled or discovery.dns.enabled" -}}
{{- end -}}
{{- else -}}
{{- fail (printf "mode %q: want fleet or direct" .Values.mode) -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $g := .Values.gateway -}}
{{- if not $g.inferencePool.name -}}{{- fail "gateway.enabled needs gateway.inferencePool.name" -}}{{- end -}}
{{- $pool := dict "name" $g.inferencePool.name "namespace" (default .Release.Namespace $g.inferencePool.namespace) "api_version" $g.inferencePool.apiVersion "dp_size" (int $g.inferencePool.dpSize) "model" (index .Values.models 0).name -}}
{{- $_ := set $c "gateway" (dict "listen" (printf ":%d" (int $g.port)) "body_mode" $g.bodyMode "inference_pool" $pool) -}}
{{- end -}}
{{- if .Values.http.enabled -}}
{{- $_ := set $c "http_listen" (printf ":%d" (int .Values.http.port)) -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $t := dict "cert_file" "/etc/kvindex/tls/tls.crt" "key_file" "/etc/kvindex/tls/tls.key" -}}
{{- if .Values.tls.clientCA -}}{{- $_ := set $t "client_ca_file" "/etc/kvindex/tls/ca.crt" -}}{{- end -}}
{{- if .Values.tls.metrics -}}{{- $_ := set $t "metrics" true -}}{{- end -}}
{{- $_ := set $c "tls" $t -}}
{{- end -}}
{{- if .Values.auth.tokens -}}
{{- $toks := list -}}
{{- range .Values.auth.tokens -}}
{{- $toks = append $toks (dict "name" .name "scopes" .scopes "file" (printf "/etc/kvindex/tokens/%s/%s" .name (default "token" .key))) -}}
{{- end -}}
{{- $_ := set $c "auth" (dict "tokens" $toks "open_health" true) -}}
{{- end -}}
{{- toYaml (mergeOverwrite $c (deepCopy .Values.config)) -}}
{{- end -}}

{{/* The agents' agent.yaml. */}}
{{- define "kvindex.agentConfig" -}}
{{- $a := .Values.agent -}}
{{- $model := (index .Values.models 0).name -}}
{{- $pod := dict "name" "vllm" "model" $model "endpoint" $a.endpoint "dp_size" (int $a.dpSize) -}}
{{- if $a.replayEndpoint -}}{{- $_ := set $pod "replay_endpoint" $a.replayEndpoint -}}{{- end -}}
{{- if $a.capacityBlocks -}}{{- $_ := set $pod "capacity_blocks" (int $a.capacityBlocks) -}}{{- end -}}
{{- $c := dict "metrics_listen" (printf ":%d" (int $a.metricsPort)) "models" (include "kvindex.models" . | fromYamlArray) "pods" (list $pod) "nats" (include "kvindex.nats" . | fromYaml) -}}
{{- if $a.checkpoint -}}{{- $_ := set $c "agent" (dict "checkpoint" $a.checkpoint) -}}{{- end -}}
{{- $_ := set $c "log" (dict "format" "json") -}}
{{- toYaml (mergeOverwrite $c (deepCopy $a.config)) -}}
{{- end -}}
