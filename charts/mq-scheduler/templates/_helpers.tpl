{{/* Names and labels. */}}
{{- define "mq-scheduler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mq-scheduler.fullname" -}}
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

{{- define "mq-scheduler.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mq-scheduler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mq-scheduler
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mq-scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mq-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component: (dict "ctx" $ "component" "daemon"). */}}
{{- define "mq-scheduler.componentLabels" -}}
{{ include "mq-scheduler.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mq-scheduler.componentSelector" -}}
{{ include "mq-scheduler.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mq-scheduler.annotations" -}}
{{- with .Values.commonAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mq-scheduler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mq-scheduler.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference from (dict "image" .Values.image "tag" default-tag). */}}
{{- define "mq-scheduler.imageRef" -}}
{{- $repo := .image.repository -}}
{{- if .image.registry -}}{{- $repo = printf "%s/%s" .image.registry .image.repository -}}{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .tag .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "mq-scheduler.image" -}}
{{- include "mq-scheduler.imageRef" (dict "image" .Values.image "tag" .Chart.AppVersion) -}}
{{- end -}}

{{/* The audit image: registry and repository default to the daemon's, the tag to its + "-audit". */}}
{{- define "mq-scheduler.auditImage" -}}
{{- $a := .Values.audit.image -}}
{{- $image := dict "registry" (default .Values.image.registry $a.registry) "repository" (default .Values.image.repository $a.repository) "tag" $a.tag "digest" $a.digest -}}
{{- include "mq-scheduler.imageRef" (dict "image" $image "tag" (printf "%s-audit" (default .Chart.AppVersion .Values.image.tag))) -}}
{{- end -}}

{{/* Secrets and ConfigMaps this release refers to. */}}
{{- define "mq-scheduler.databaseSecret" -}}
{{- default (printf "%s-database" (include "mq-scheduler.fullname" .)) .Values.database.existingSecret -}}
{{- end -}}

{{- define "mq-scheduler.schedulesConfigMap" -}}
{{- default (printf "%s-schedules" (include "mq-scheduler.fullname" .)) .Values.schedules.existingConfigMap -}}
{{- end -}}

{{/* The schedules ConfigMap's data: the chart's files, then values' files (same name wins). */}}
{{- define "mq-scheduler.schedulesData" -}}
{{- $data := dict -}}
{{- if .Values.schedules.fromChart -}}
{{- range $path, $_ := .Files.Glob "schedules/*.yaml" -}}
{{- $_ := set $data (base $path) ($.Files.Get $path) -}}
{{- end -}}
{{- end -}}
{{- range $name, $text := .Values.schedules.files -}}
{{- $_ := set $data $name $text -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/* Shutdown timing: the pod's grace must cover the preStop wait and the daemon's handover. */}}
{{- define "mq-scheduler.terminationGrace" -}}
{{- $floor := add .Values.preStopSleepSeconds .Values.shutdownGraceSeconds -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add $floor 10 -}}
{{- else if le (int .Values.terminationGracePeriodSeconds) (int $floor) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + shutdownGraceSeconds (%v): the kubelet would SIGKILL the daemon in the middle of its handover" .Values.terminationGracePeriodSeconds $floor) -}}
{{- else -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* The database URL env var from a Secret: (dict "secret" name "key" key). */}}
{{- define "mq-scheduler.secretEnv" -}}
valueFrom:
  secretKeyRef:
    name: {{ .secret }}
    key: {{ .key }}
{{- end -}}

{{/* Env of the NATS and database connection, shared by the daemon and the migration Job. */}}
{{- define "mq-scheduler.connectionEnv" -}}
- name: SCHEDULER_NATS_URL
  value: {{ .Values.nats.url | quote }}
{{- if .Values.nats.credentials.existingSecret }}
- name: SCHEDULER_NATS_CREDS
  value: /etc/mq-scheduler/nats/{{ .Values.nats.credentials.key }}
{{- end }}
{{- if .Values.nats.auth.existingSecret }}
- name: SCHEDULER_NATS_USER
  {{- include "mq-scheduler.secretEnv" (dict "secret" .Values.nats.auth.existingSecret "key" .Values.nats.auth.userKey) | nindent 2 }}
- name: SCHEDULER_NATS_PASSWORD
  {{- include "mq-scheduler.secretEnv" (dict "secret" .Values.nats.auth.existingSecret "key" .Values.nats.auth.passwordKey) | nindent 2 }}
{{- end }}
{{- if .Values.nats.token.existingSecret }}
- name: SCHEDULER_NATS_TOKEN
  {{- include "mq-scheduler.secretEnv" (dict "secret" .Values.nats.token.existingSecret "key" .Values.nats.token.key) | nindent 2 }}
{{- end }}
{{- if .Values.nats.nkey.existingSecret }}
- name: SCHEDULER_NATS_NKEY_SEED
  value: /etc/mq-scheduler/nats-nkey/{{ .Values.nats.nkey.key }}
{{- end }}
{{- if or .Values.nats.tls.ca.existingSecret .Values.nats.tls.ca.existingConfigMap }}
- name: SCHEDULER_NATS_TLS_CA
  value: /etc/mq-scheduler/tls/{{ .Values.nats.tls.ca.key }}
{{- end }}
{{- if .Values.nats.tls.client.existingSecret }}
- name: SCHEDULER_NATS_TLS_CERT
  value: /etc/mq-scheduler/nats-client/{{ .Values.nats.tls.client.certKey }}
- name: SCHEDULER_NATS_TLS_KEY
  value: /etc/mq-scheduler/nats-client/{{ .Values.nats.tls.client.keyKey }}
{{- end }}
{{- end -}}

{{/* A volume of files from a Secret: (dict "name" volume "secret" name "keys" (list key...)). */}}
{{- define "mq-scheduler.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
    items:
      {{- range .keys }}
      - key: {{ . }}
        path: {{ . }}
      {{- end }}
{{- end -}}

{{/* The daemon's database password file and the PostgreSQL CA: env, volumes and mounts.
(dict "root" $ "password" bool): the password only where the daemon's role connects. */}}
{{- define "mq-scheduler.databaseFileEnv" -}}
{{- if and .password .root.Values.database.password.existingSecret }}
- name: SCHEDULER_DATABASE_PASSWORD_FILE
  value: /etc/mq-scheduler/database-password/{{ .root.Values.database.password.key }}
{{- end }}
{{- end -}}

{{- define "mq-scheduler.databaseVolumes" -}}
{{- $db := .root.Values.database }}
{{- if and .password $db.password.existingSecret }}
{{ include "mq-scheduler.secretVolume" (dict "name" "database-password" "secret" $db.password.existingSecret "keys" (list $db.password.key)) }}
{{- end }}
{{- if $db.tls.ca.existingSecret }}
{{ include "mq-scheduler.secretVolume" (dict "name" "postgres-ca" "secret" $db.tls.ca.existingSecret "keys" (list $db.tls.ca.key)) }}
{{- end }}
{{- end -}}

{{- define "mq-scheduler.databaseMounts" -}}
{{- $db := .root.Values.database }}
{{- if and .password $db.password.existingSecret }}
- name: database-password
  mountPath: /etc/mq-scheduler/database-password
  readOnly: true
{{- end }}
{{- if $db.tls.ca.existingSecret }}
- name: postgres-ca
  mountPath: /etc/mq-scheduler/postgres-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Volumes and mounts of the NATS credentials file, NKey seed, CA and client certificate. */}}
{{- define "mq-scheduler.natsVolumes" -}}
{{- if .Values.nats.credentials.existingSecret }}
- name: nats-credentials
  secret:
    secretName: {{ .Values.nats.credentials.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.nats.credentials.key }}
        path: {{ .Values.nats.credentials.key }}
{{- end }}
{{- if .Values.nats.tls.ca.existingSecret }}
- name: nats-ca
  secret:
    secretName: {{ .Values.nats.tls.ca.existingSecret }}
    items:
      - key: {{ .Values.nats.tls.ca.key }}
        path: {{ .Values.nats.tls.ca.key }}
{{- else if .Values.nats.tls.ca.existingConfigMap }}
- name: nats-ca
  configMap:
    name: {{ .Values.nats.tls.ca.existingConfigMap }}
    items:
      - key: {{ .Values.nats.tls.ca.key }}
        path: {{ .Values.nats.tls.ca.key }}
{{- end }}
{{- with .Values.nats.nkey }}
{{- if .existingSecret }}
{{ include "mq-scheduler.secretVolume" (dict "name" "nats-nkey" "secret" .existingSecret "keys" (list .key)) }}
{{- end }}
{{- end }}
{{- with .Values.nats.tls.client }}
{{- if .existingSecret }}
{{ include "mq-scheduler.secretVolume" (dict "name" "nats-client-tls" "secret" .existingSecret "keys" (list .certKey .keyKey)) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "mq-scheduler.natsMounts" -}}
{{- if .Values.nats.credentials.existingSecret }}
- name: nats-credentials
  mountPath: /etc/mq-scheduler/nats
  readOnly: true
{{- end }}
{{- if or .Values.nats.tls.ca.existingSecret .Values.nats.tls.ca.existingConfigMap }}
- name: nats-ca
  mountPath: /etc/mq-scheduler/tls
  readOnly: true
{{- end }}
{{- if .Values.nats.nkey.existingSecret }}
- name: nats-nkey
  mountPath: /etc/mq-scheduler/nats-nkey
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.client.existingSecret }}
- name: nats-client-tls
  mountPath: /etc/mq-scheduler/nats-client
  readOnly: true
{{- end }}
{{- end -}}

{{/* NetworkPolicy egress rules: DNS, then (dict "rule" .Values.networkPolicy.egress.X). */}}
{{- define "mq-scheduler.egressRule" -}}
- ports:
  {{- range .ports }}
    - protocol: TCP
      port: {{ . }}
  {{- end }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "mq-scheduler.dnsEgress" -}}
- ports:
  {{- range .Values.networkPolicy.egress.dns.ports }}
    - protocol: UDP
      port: {{ . }}
    - protocol: TCP
      port: {{ . }}
  {{- end }}
  to:
  {{- if .Values.networkPolicy.egress.dns.to }}
    {{- toYaml .Values.networkPolicy.egress.dns.to | nindent 4 }}
  {{- else }}
    - namespaceSelector: {}
      podSelector:
        matchLabels:
          k8s-app: kube-dns
  {{- end }}
{{- end -}}

{{/* "true" when the daemon pods mount the audit's claim read-only at /audit (empty otherwise). */}}
{{- define "mq-scheduler.auditInDaemons" -}}
{{- $out := .Values.audit.output -}}
{{- if and .Values.audit.enabled $out.pvc.enabled $out.pvc.mountInDaemons (not $out.objectStorePath) -}}true{{- end -}}
{{- end }}
