{{/*
Autoscaling the sinks workers on their consumer group's lag with KEDA (workers.autoscaling.metric
keda): a ScaledObject with the Kafka scaler, and a TriggerAuthentication that hands KEDA the same
credentials the workers use, from the same Secrets. KEDA reads Secret values as they are: the SASL
user and password given by value are kept for it in the chart's Secret unencoded (keda-kafka-*).
The scaler measures the lag over every topic the group consumes: per partition, the broker's latest
offset minus the group's committed offset. The workers commit a record only once it is stored (spans:
up to the oldest record of a trace not stored), so that lag already counts records read but not
stored, and a dead worker's partitions; it is ragmon_kafka_backlog_records as the broker sees it.
(On a broker whose ListOffsets answers short of the high watermark, as tansu does, it reads up to a
batch per partition low.) Its own cap (allowIdleConsumers false) counts the partitions of all three
topics, so the chart caps maxReplicaCount at kafka.partitions itself (ragmon.validate).
Call with (list $ name role autoscaling-values).
*/}}
{{- define "ragmon.kedaScaledObject" -}}
{{- $root := index . 0 }}{{- $name := index . 1 }}{{- $role := index . 2 }}{{- $autoscaling := index . 3 }}
{{- $k := $root.Values.kafka }}
{{- $own := include "ragmon.secretName" $root }}
{{- $refs := list }}
{{- $sasl := hasPrefix "SASL_" $k.securityProtocol }}
{{- $tls := has $k.securityProtocol (list "SSL" "SASL_SSL") }}
{{- if $sasl }}
{{- if and $k.existingSecret $k.existingSecretUserKey }}
{{- $refs = append $refs (dict "parameter" "username" "name" $k.existingSecret "key" $k.existingSecretUserKey) }}
{{- else }}
{{- $refs = append $refs (dict "parameter" "username" "name" $own "key" "keda-kafka-username") }}
{{- end }}
{{- if $k.existingSecret }}
{{- $refs = append $refs (dict "parameter" "password" "name" $k.existingSecret "key" $k.existingSecretPasswordKey) }}
{{- else }}
{{- $refs = append $refs (dict "parameter" "password" "name" $own "key" "keda-kafka-password") }}
{{- end }}
{{- end }}
{{- if $tls }}
{{- with $k.caSecret }}{{ if .name }}
{{- $refs = append $refs (dict "parameter" "ca" "name" .name "key" .key) }}
{{- end }}{{ end }}
{{- with $k.clientCertSecret }}{{ if .name }}
{{- $refs = append $refs (dict "parameter" "cert" "name" .name "key" .certKey) }}
{{- $refs = append $refs (dict "parameter" "key" "name" .name "key" .keyKey) }}
{{- if .passwordKey }}
{{- $refs = append $refs (dict "parameter" "keyPassword" "name" .name "key" .passwordKey) }}
{{- end }}
{{- end }}{{ end }}
{{- end }}
{{- if $refs }}
---
apiVersion: keda.sh/v1alpha1
kind: TriggerAuthentication
metadata:
  name: {{ $name }}
  labels:
    {{- include "ragmon.labels" (list $root $role) | nindent 4 }}
spec:
  secretTargetRef:
    {{- toYaml $refs | nindent 4 }}
{{- end }}
---
# KEDA owns the replica count (through an HPA of its own): lag / replicas near lagPerReplica
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $name }}
  labels:
    {{- include "ragmon.labels" (list $root $role) | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicaCount: {{ $autoscaling.minReplicas }}
  maxReplicaCount: {{ $autoscaling.maxReplicas }}
  pollingInterval: {{ ($autoscaling.keda | default dict).pollingInterval | default 15 }}
  cooldownPeriod: {{ ($autoscaling.keda | default dict).cooldownPeriod | default 300 }}
  triggers:
    - type: kafka
      metadata:
        bootstrapServers: {{ join "," $k.bootstrapServers | quote }}
        consumerGroup: {{ include "ragmon.sinksGroup" $root | quote }}
        lagThreshold: {{ $autoscaling.lagPerReplica | default 10000 | quote }}
        # the workers read a partition they have no offset for from its start (auto_offset_reset)
        offsetResetPolicy: earliest
        allowIdleConsumers: "false"
        {{- if $sasl }}
        sasl: {{ get (dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512") $k.saslMechanism | quote }}
        {{- end }}
        {{- if $tls }}
        tls: enable
        {{- end }}
      {{- if $refs }}
      authenticationRef:
        name: {{ $name }}
      {{- end }}
{{- end }}
