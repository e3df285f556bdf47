{{/*
Named templates shared by every object of the chart.
*/}}

{{- define "ragmon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, at most 63 characters (a DNS label), used as every object's name prefix. */}}
{{- define "ragmon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's object name: <fullname>-<component>, shortened so the suffix always survives. */}}
{{- define "ragmon.componentName" -}}
{{- $root := index . 0 }}{{- $component := index . 1 }}
{{- printf "%s-%s" (include "ragmon.fullname" $root | trunc (int (sub 62 (len $component))) | trimSuffix "-") $component }}
{{- end }}

{{- define "ragmon.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "ragmon.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
{{- if gt (len .) 1 }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}
{{- end }}

{{/* Labels of every object; call with (list $ "component") or (list $) for release-wide objects. */}}
{{- define "ragmon.labels" -}}
{{- $root := index . 0 -}}
{{ include "ragmon.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: ragmon
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "ragmon.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "ragmon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ragmon.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ragmon.distributed" -}}
{{- if eq .Values.mode "distributed" }}true{{ end }}
{{- end }}

{{/* The chart-managed Secret holding every secret given by value (and the generated ones). */}}
{{- define "ragmon.secretName" -}}
{{- include "ragmon.fullname" . }}
{{- end }}

{{/*
Refuse values that would put a secret in a ConfigMap, or that cannot work. Rendered (as nothing)
by configmap.yaml, so every install and template run passes through here.
*/}}
{{- define "ragmon.validate" -}}
{{- $secretKeys := list (list "auth" "api_keys") (list "judge" "api_key") (list "review" "reviewers") (list "review" "session_secret") (list "kafka" "sasl_password") (list "kafka" "ssl_password") (list "metrics" "scrape_token") (list "store" "url") }}
{{- range $secretKeys }}
{{- $section := index $.Values.config (index . 0) | default dict }}
{{- if and (kindIs "map" $section) (hasKey $section (index . 1)) }}
{{- fail (printf "config.%s.%s would land in a ConfigMap; set it through the chart's secret values (auth, judge, review, metrics.scrapeToken, postgresql, kafka) instead" (index . 0) (index . 1)) }}
{{- end }}
{{- end }}
{{- if include "ragmon.distributed" . }}
{{- $partitions := int .Values.kafka.partitions }}
{{- $autoscaling := .Values.workers.autoscaling }}
{{- $most := ternary (int $autoscaling.maxReplicas) (int .Values.workers.replicas) $autoscaling.enabled }}
{{- $from := ternary (printf "workers.autoscaling.maxReplicas (metric %s)" ($autoscaling.metric | default "cpu")) "workers.replicas" $autoscaling.enabled }}
{{- if gt $most $partitions }}
{{- fail (printf "workers: up to %d sinks workers (%s) but kafka.partitions is %d; the extra workers would get no partition and sit idle (set kafka.partitions to the topics' partition count, or lower %s)" $most $from $partitions $from) }}
{{- end }}
{{- if and $autoscaling.enabled (gt (int $autoscaling.minReplicas) (int $autoscaling.maxReplicas)) }}
{{- fail (printf "workers.autoscaling.minReplicas (%d) is above maxReplicas (%d)" (int $autoscaling.minReplicas) (int $autoscaling.maxReplicas)) }}
{{- end }}
{{- end }}
{{- range $component := list "ingest" "workers" "judgeWorkers" "driftScheduler" }}
{{- $pdb := (index $.Values $component).podDisruptionBudget }}
{{- if and $pdb.enabled (eq (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable)) }}
{{- fail (printf "%s.podDisruptionBudget: set one of minAvailable and maxUnavailable (the other null)" $component) }}
{{- end }}
{{- end }}
{{- $kafka := .Values.kafka }}
{{- if and (include "ragmon.distributed" .) $kafka.clientCertSecret.name (not (has $kafka.securityProtocol (list "SSL" "SASL_SSL"))) }}
{{- fail (printf "kafka.clientCertSecret is a TLS client certificate: kafka.securityProtocol must be SSL or SASL_SSL, not %s" $kafka.securityProtocol) }}
{{- end }}
{{- $scaling := .Values.workers.autoscaling }}
{{- if and (include "ragmon.distributed" .) $scaling.enabled (eq $scaling.metric "keda") (hasPrefix "SASL_" $kafka.securityProtocol) }}
{{- if not (or $kafka.saslPassword $kafka.existingSecret) }}
{{- fail "workers.autoscaling.metric keda with SASL: KEDA needs the SASL password too (kafka.saslPassword or kafka.existingSecret)" }}
{{- end }}
{{- if not (or $kafka.saslUsername (and $kafka.existingSecret $kafka.existingSecretUserKey)) }}
{{- fail "workers.autoscaling.metric keda with SASL: KEDA needs the SASL user (kafka.saslUsername or kafka.existingSecretUserKey)" }}
{{- end }}
{{- end }}
{{- $pg := .Values.postgresql }}
{{- if and (include "ragmon.distributed" .) $pg.caSecret.name $pg.caConfigMap.name }}
{{- fail "postgresql: set caSecret or caConfigMap, not both" }}
{{- end }}
{{- if and (include "ragmon.distributed" .) (hasPrefix "verify-" $pg.sslmode) (not (include "ragmon.postgresqlCa" .)) }}
{{- fail (printf "postgresql.sslmode %s checks the server's certificate: set postgresql.caSecret or postgresql.caConfigMap to the CA that signed it (the image has no ~/.postgresql/root.crt)" $pg.sslmode) }}
{{- end }}
{{- if .Values.ingress.enabled }}
{{- range .Values.ingress.tls }}
{{- range .hosts }}
{{- if and $.Values.ingress.hosts (not (has . $.Values.ingress.hosts)) }}
{{- fail (printf "ingress.tls names host %s, which is not in ingress.hosts" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (include "ragmon.distributed" .) (le (int .Values.ingest.terminationGracePeriodSeconds) (add (int .Values.kafka.shutdownGraceSeconds) 10)) }}
{{- fail (printf "ingest.terminationGracePeriodSeconds (%d) must exceed kafka.shutdownGraceSeconds (%d) by more than 10: a pod killed before the broker acknowledged would drop what it promised" (int .Values.ingest.terminationGracePeriodSeconds) (int .Values.kafka.shutdownGraceSeconds)) }}
{{- end }}
{{- if and (include "ragmon.distributed" .) (hasPrefix "SASL_" .Values.kafka.securityProtocol) (not .Values.kafka.saslMechanism) }}
{{- fail "kafka.securityProtocol is SASL_*: set kafka.saslMechanism" }}
{{- end }}
{{- end }}

{{/*
One env var from a Secret: (list name secretName key).
*/}}
{{- define "ragmon.secretEnv" -}}
- name: {{ index . 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ index . 1 | quote }}
      key: {{ index . 2 | quote }}
{{- end }}

{{/* Where the scrape token is: the existing Secret named, else the chart's; and its key there. */}}
{{- define "ragmon.scrapeTokenSecret" -}}
{{ default (include "ragmon.secretName" .) .Values.metrics.scrapeTokenExistingSecret }}
{{- end }}
{{- define "ragmon.scrapeTokenKey" -}}
{{ ternary .Values.metrics.scrapeTokenExistingSecretKey "scrape-token" (ne .Values.metrics.scrapeTokenExistingSecret "") }}
{{- end }}

{{/*
The secret environment of a process: (list $ needs) where needs names the secret groups it uses:
auth, judge, review, metrics (it serves /metrics), postgresql, kafka. Each secret comes from its existing Secret when one is
named, else from the chart's Secret.
*/}}
{{- define "ragmon.secretEnvs" -}}
{{- $root := index . 0 }}{{- $needs := index . 1 }}
{{- $v := $root.Values }}
{{- $own := include "ragmon.secretName" $root }}
{{- if has "auth" $needs }}
{{ include "ragmon.secretEnv" (list "RAGMON_AUTH__API_KEYS" (default $own $v.auth.existingSecret) (ternary $v.auth.existingSecretKey "api-keys" (ne $v.auth.existingSecret ""))) }}
{{- end }}
{{- if and (has "judge" $needs) (or $v.judge.apiKey $v.judge.existingSecret) }}
{{ include "ragmon.secretEnv" (list "RAGMON_JUDGE__API_KEY" (default $own $v.judge.existingSecret) (ternary $v.judge.existingSecretKey "judge-api-key" (ne $v.judge.existingSecret ""))) }}
{{- end }}
{{- if has "review" $needs }}
{{- if or $v.review.reviewers $v.review.existingSecret }}
{{ include "ragmon.secretEnv" (list "RAGMON_REVIEW__REVIEWERS" (default $own $v.review.existingSecret) (ternary $v.review.existingSecretKey "reviewers" (ne $v.review.existingSecret ""))) }}
{{- end }}
{{ include "ragmon.secretEnv" (list "RAGMON_REVIEW__SESSION_SECRET" (default $own $v.review.sessionSecretExistingSecret) (ternary $v.review.sessionSecretExistingSecretKey "session-secret" (ne $v.review.sessionSecretExistingSecret ""))) }}
{{- end }}
{{- if and (has "metrics" $needs) (or $v.metrics.scrapeToken $v.metrics.scrapeTokenExistingSecret) }}
{{ include "ragmon.secretEnv" (list "RAGMON_METRICS__SCRAPE_TOKEN" (include "ragmon.scrapeTokenSecret" $root) (include "ragmon.scrapeTokenKey" $root)) }}
{{- end }}
{{- if and (has "postgresql" $needs) (include "ragmon.distributed" $root) }}
{{- if $v.postgresql.existingSecret }}
{{- if $v.postgresql.existingSecretUserKey }}
{{ include "ragmon.secretEnv" (list "PGUSER" $v.postgresql.existingSecret $v.postgresql.existingSecretUserKey) }}
{{- end }}
{{ include "ragmon.secretEnv" (list "PGPASSWORD" $v.postgresql.existingSecret $v.postgresql.existingSecretPasswordKey) }}
{{- else if $v.postgresql.password }}
{{ include "ragmon.secretEnv" (list "PGPASSWORD" $own "postgresql-password") }}
{{- end }}
{{- end }}
{{- if and (has "kafka" $needs) (include "ragmon.distributed" $root) }}
{{- if or $v.kafka.saslPassword $v.kafka.existingSecret }}
{{ include "ragmon.secretEnv" (list "RAGMON_KAFKA__SASL_PASSWORD" (default $own $v.kafka.existingSecret) (ternary $v.kafka.existingSecretPasswordKey "kafka-sasl-password" (ne $v.kafka.existingSecret ""))) }}
{{- end }}
{{- if and $v.kafka.existingSecret $v.kafka.existingSecretUserKey }}
{{ include "ragmon.secretEnv" (list "RAGMON_KAFKA__SASL_USERNAME" $v.kafka.existingSecret $v.kafka.existingSecretUserKey) }}
{{- end }}
{{- with $v.kafka.clientCertSecret }}
{{- if .name }}
{{- /* not secrets, but only the processes that talk to Kafka mount the client certificate */}}
- name: RAGMON_KAFKA__SSL_CERTFILE
  value: {{ include "ragmon.kafkaClientDir" $root | printf "%s/tls.crt" | quote }}
- name: RAGMON_KAFKA__SSL_KEYFILE
  value: {{ include "ragmon.kafkaClientDir" $root | printf "%s/tls.key" | quote }}
{{- if .passwordKey }}
{{ include "ragmon.secretEnv" (list "RAGMON_KAFKA__SSL_PASSWORD" .name .passwordKey) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The container environment of a process: (list $ needs extraEnv). Plain settings come from the
env ConfigMap, secrets from Secrets (ragmon.secretEnvs), then the component's extraEnv.
*/}}
{{- define "ragmon.containerEnv" -}}
{{- $root := index . 0 -}}
envFrom:
  - configMapRef:
      name: {{ include "ragmon.componentName" (list $root "env") }}
{{- $secrets := include "ragmon.secretEnvs" (list $root (index . 1)) | trim }}
{{- $extra := index . 2 }}
{{- if or $secrets $extra }}
env:
{{- with $secrets }}
{{ . | indent 2 }}
{{- end }}
{{- with $extra }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod template annotations that roll the pods when their configuration changes. */}}
{{- define "ragmon.configChecksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}

{{/* The pod-level part shared by every ragmon pod. */}}
{{- define "ragmon.podCommon" -}}
serviceAccountName: {{ include "ragmon.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.automountServiceAccountToken }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Scheduling of a component: (list values-of-the-component). */}}
{{- define "ragmon.scheduling" -}}
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
{{- end }}

{{/* The container-level part shared by every ragmon container. */}}
{{- define "ragmon.containerCommon" -}}
image: {{ include "ragmon.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end }}

{{/* Mounts every process has: /tmp, the config file and the Kafka CA when one is given. */}}
{{- define "ragmon.commonMounts" -}}
- name: tmp
  mountPath: /tmp
- name: config
  mountPath: /etc/ragmon/config
  readOnly: true
{{- if and (include "ragmon.distributed" .) .Values.kafka.caSecret.name }}
- name: kafka-ca
  mountPath: /etc/ragmon/kafka-ca
  readOnly: true
{{- end }}
{{- if include "ragmon.postgresqlCa" . }}
- name: postgresql-ca
  mountPath: /etc/ragmon/postgresql-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "ragmon.commonVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
- name: config
  configMap:
    name: {{ include "ragmon.componentName" (list . "config") }}
{{- if and (include "ragmon.distributed" .) .Values.kafka.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.caSecret.name }}
    items:
      - key: {{ .Values.kafka.caSecret.key }}
        path: ca.crt
{{- end }}
{{- with .Values.postgresql }}
{{- if and (include "ragmon.distributed" $) .caSecret.name }}
- name: postgresql-ca
  secret:
    secretName: {{ .caSecret.name }}
    items:
      - key: {{ .caSecret.key }}
        path: ca.crt
{{- else if and (include "ragmon.distributed" $) .caConfigMap.name }}
- name: postgresql-ca
  configMap:
    name: {{ .caConfigMap.name }}
    items:
      - key: {{ .caConfigMap.key }}
        path: ca.crt
{{- end }}
{{- end }}
{{- end }}

{{/* Whether the pods mount a CA bundle for PostgreSQL (distributed mode). */}}
{{- define "ragmon.postgresqlCa" -}}
{{- if and (include "ragmon.distributed" .) (or .Values.postgresql.caSecret.name .Values.postgresql.caConfigMap.name) }}true{{ end }}
{{- end }}

{{/* Where the Kafka client certificate is mounted. */}}
{{- define "ragmon.kafkaClientDir" -}}
/etc/ragmon/kafka-client
{{- end }}

{{/* The Kafka client certificate's mount, for the pods that talk to Kafka (ingest, sinks). */}}
{{- define "ragmon.kafkaClientMounts" -}}
{{- if and (include "ragmon.distributed" .) .Values.kafka.clientCertSecret.name }}
- name: kafka-client
  mountPath: {{ include "ragmon.kafkaClientDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "ragmon.kafkaClientVolumes" -}}
{{- with .Values.kafka.clientCertSecret }}
{{- if and (include "ragmon.distributed" $) .name }}
- name: kafka-client
  secret:
    secretName: {{ .name }}
    defaultMode: 0400
    items:
      - key: {{ .certKey }}
        path: tls.crt
      - key: {{ .keyKey }}
        path: tls.key
{{- end }}
{{- end }}
{{- end }}

{{/*
A PodDisruptionBudget for a component's pods: (list $ component podDisruptionBudget-values).
*/}}
{{- define "ragmon.podDisruptionBudget" -}}
{{- $root := index . 0 }}{{- $component := index . 1 }}{{- $pdb := index . 2 }}
{{- if $pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "ragmon.componentName" (list $root $component) }}
  labels:
    {{- include "ragmon.labels" (list $root $component) | nindent 4 }}
spec:
  {{- if not (kindIs "invalid" $pdb.minAvailable) }}
  minAvailable: {{ $pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "ragmon.selectorLabels" (list $root $component) | nindent 6 }}
{{- end }}
{{- end }}

{{/* The consumer group of the sinks workers (kafka.sinks_group, default ragmon-sinks). */}}
{{- define "ragmon.sinksGroup" -}}
{{- (.Values.config.kafka | default dict).sinks_group | default "ragmon-sinks" }}
{{- end }}

{{- define "ragmon.configArgs" -}}
- --config
- /etc/ragmon/config/config.yaml
{{- end }}

{{/* The PVC name of embedded mode's data volume. */}}
{{- define "ragmon.dataClaim" -}}
{{- default (include "ragmon.componentName" (list . "data")) .Values.persistence.existingClaim }}
{{- end }}

{{/* The PVC name of distributed mode's report volume. */}}
{{- define "ragmon.reportClaim" -}}
{{- default (include "ragmon.componentName" (list . "reports")) .Values.report.persistence.existingClaim }}
{{- end }}

{{/* Whether the ingest pods mount the report claim (distributed mode, ReadWriteMany). */}}
{{- define "ragmon.ingestServesReports" -}}
{{- if and (include "ragmon.distributed" .) .Values.report.enabled .Values.report.persistence.enabled (has "ReadWriteMany" .Values.report.persistence.accessModes) }}true{{ end }}
{{- end }}

{{/* storageClassName of a PVC: "" keeps the cluster default, "-" asks for none. */}}
{{- define "ragmon.storageClass" -}}
{{- if . }}
{{- if eq . "-" }}
storageClassName: ""
{{- else }}
storageClassName: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
