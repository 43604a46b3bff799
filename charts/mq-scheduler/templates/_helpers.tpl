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

{{/* The two roles (docs/deploy.md, "Chart layout"): a daemon pod runs the engine and an edge
that share the run folder; an edge-only pod runs an edge alone. Their containers take the same
env and mounts, from the templates below: (dict "root" $ "runDir" bool). */}}
{{- define "mq-scheduler.runDir" -}}/run/mq-scheduler{{- end -}}

{{/* The label the Service, NetworkPolicy and ServiceMonitor select on: every pod with an edge. */}}
{{- define "mq-scheduler.servesApiLabel" -}}
mq-scheduler.dev/serves-api: "true"
{{- end -}}

{{- define "mq-scheduler.servesApiSelector" -}}
{{ include "mq-scheduler.selectorLabels" . }}
{{ include "mq-scheduler.servesApiLabel" . }}
{{- end -}}

{{- define "mq-scheduler.daemonEnv" -}}
{{- $root := .root -}}
- name: SCHEDULER_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: SCHEDULER_HTTP_HOST
  value: "0.0.0.0"
- name: SCHEDULER_HTTP_PORT
  value: {{ $root.Values.containerPorts.http | quote }}
- name: SCHEDULER_METRICS_PORT
  value: {{ $root.Values.containerPorts.metrics | quote }}
- name: SCHEDULER_SCHEDULES_DIR
  value: /etc/mq-scheduler/schedules
{{- if .runDir }}
# The pair's folder: the engine writes its status and metrics here, the edge serves them.
- name: SCHEDULER_RUN_DIR
  value: {{ include "mq-scheduler.runDir" $root }}
{{- end }}
{{- if and (include "mq-scheduler.auditInDaemons" $root) (not (hasKey $root.Values.config "audit_dir")) }}
- name: SCHEDULER_AUDIT_DIR
  value: /audit
{{- end }}
{{- if and (not $root.Values.api.tokens.existingSecret) (not (hasKey $root.Values.config "api_allowed_hosts")) }}
{{- $svc := include "mq-scheduler.fullname" $root }}
# Open mode (no tokens): the API answers only these Host names besides loopback and
# the pod's own address (DNS rebinding guard); config.api_allowed_hosts replaces them.
- name: SCHEDULER_API_ALLOWED_HOSTS
  value: "{{ $svc }},{{ $svc }}.{{ $root.Release.Namespace }},{{ $svc }}.{{ $root.Release.Namespace }}.svc,{{ $svc }}.{{ $root.Release.Namespace }}.svc.cluster.local"
{{- end }}
- name: SCHEDULER_SHUTDOWN_GRACE
  value: "{{ $root.Values.shutdownGraceSeconds }}s"
- name: SCHEDULER_LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
- name: SCHEDULER_LOG_FORMAT
  value: {{ $root.Values.logFormat | quote }}
{{ include "mq-scheduler.connectionEnv" $root }}
- name: SCHEDULER_DATABASE_URL
  {{- include "mq-scheduler.secretEnv" (dict "secret" (include "mq-scheduler.databaseSecret" $root) "key" $root.Values.database.urlKey) | nindent 2 }}
{{- with include "mq-scheduler.databaseFileEnv" (dict "root" $root "password" true) | trim }}
{{ . }}
{{- end }}
{{- with $root.Values.api.tokens.existingSecret }}
- name: SCHEDULER_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $root.Values.api.tokens.adminTokenKey }}
      optional: true
- name: SCHEDULER_READ_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $root.Values.api.tokens.readTokenKey }}
      optional: true
{{- end }}
{{- range $key, $value := $root.Values.config }}
- name: SCHEDULER_{{ upper $key }}
  value: {{ if kindIs "slice" $value }}{{ join "," $value | quote }}{{ else }}{{ $value | toString | quote }}{{ end }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mq-scheduler.daemonMounts" -}}
{{- $root := .root -}}
- name: tmp
  mountPath: /tmp
- name: schedules
  mountPath: /etc/mq-scheduler/schedules
  readOnly: true
{{- if .runDir }}
- name: run
  mountPath: {{ include "mq-scheduler.runDir" $root }}
{{- end }}
{{- with include "mq-scheduler.natsMounts" $root | trim }}
{{ . }}
{{- end }}
{{- with include "mq-scheduler.databaseMounts" (dict "root" $root "password" true) | trim }}
{{ . }}
{{- end }}
{{- if include "mq-scheduler.auditInDaemons" $root }}
- name: audit
  mountPath: /audit
  readOnly: true
{{- end }}
{{- end -}}

{{- define "mq-scheduler.daemonVolumes" -}}
{{- $root := .root -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
- name: schedules
  configMap:
    name: {{ include "mq-scheduler.schedulesConfigMap" $root }}
{{- if .runDir }}
# Small and in memory: engine.json (~1 KB) and engine.prom (the engine's metrics).
- name: run
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- end }}
{{- with include "mq-scheduler.natsVolumes" $root | trim }}
{{ . }}
{{- end }}
{{- with include "mq-scheduler.databaseVolumes" (dict "root" $root "password" true) | trim }}
{{ . }}
{{- end }}
{{- if include "mq-scheduler.auditInDaemons" $root }}
- name: audit
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-audit" (include "mq-scheduler.fullname" $root)) $root.Values.audit.output.pvc.existingClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{/* The edge container: the HTTP API, console and /metrics on their ports, the NATS verbs. */}}
{{- define "mq-scheduler.edgeContainer" -}}
{{- $root := .root -}}
- name: edge
  image: {{ include "mq-scheduler.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args: ["run", "--role", "edge"]
  ports:
    - name: http
      containerPort: {{ $root.Values.containerPorts.http }}
      protocol: TCP
    - name: metrics
      containerPort: {{ $root.Values.containerPorts.metrics }}
      protocol: TCP
  env:
    {{- include "mq-scheduler.daemonEnv" . | nindent 4 }}
  {{- with $root.Values.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.startupProbe }}
  {{- if .enabled }}
  startupProbe:
    httpGet:
      path: /healthz
      port: http
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with $root.Values.readinessProbe }}
  {{- if .enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: http
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with $root.Values.livenessProbe }}
  {{- if .enabled }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: http
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  lifecycle:
    preStop:
      # Endpoints drop the pod while its edge still serves; SIGTERM then stops the edge.
      exec:
        command: ["sleep", "{{ $root.Values.preStopSleepSeconds }}"]
  resources:
    {{- toYaml $root.Values.edge.resources | nindent 4 }}
  securityContext:
    {{- toYaml $root.Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    {{- include "mq-scheduler.daemonMounts" . | nindent 4 }}
{{- end -}}

{{/* The engine container: leadership, intake, firing, cron. No port: nothing an outsider sends
reaches it; its probes read the status it writes to the run folder. */}}
{{- define "mq-scheduler.engineContainer" -}}
{{- $root := .root -}}
- name: engine
  image: {{ include "mq-scheduler.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args: ["run", "--role", "engine"]
  env:
    {{- include "mq-scheduler.daemonEnv" . | nindent 4 }}
  {{- with $root.Values.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.startupProbe }}
  {{- if .enabled }}
  startupProbe:
    exec:
      command: ["scheduler", "probe", "engine"]
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ $root.Values.engine.probeTimeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with $root.Values.livenessProbe }}
  {{- if .enabled }}
  livenessProbe:
    exec:
      command: ["scheduler", "probe", "engine"]
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ $root.Values.engine.probeTimeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  # No preStop wait: SIGTERM hands the lease over at once (a standby takes office).
  resources:
    {{- toYaml $root.Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml $root.Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    {{- include "mq-scheduler.daemonMounts" . | nindent 4 }}
{{- end -}}

{{/* The pod spec's placement and identity, shared by the daemon and edge-only pods:
(dict "root" $ "component" "daemon"). */}}
{{- define "mq-scheduler.podPlacement" -}}
{{- $root := .root -}}
serviceAccountName: {{ include "mq-scheduler.serviceAccountName" $root }}
automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ include "mq-scheduler.terminationGrace" $root }}
{{- if $root.Values.topologySpread.enabled }}
{{- $selector := include "mq-scheduler.componentSelector" (dict "ctx" $root "component" .component) }}
topologySpreadConstraints:
  - topologyKey: topology.kubernetes.io/zone
    maxSkew: {{ $root.Values.topologySpread.zone.maxSkew }}
    whenUnsatisfiable: {{ $root.Values.topologySpread.zone.whenUnsatisfiable }}
    {{- if and $root.Values.topologySpread.zone.minDomains (eq $root.Values.topologySpread.zone.whenUnsatisfiable "DoNotSchedule") }}
    minDomains: {{ $root.Values.topologySpread.zone.minDomains }}
    {{- end }}
    labelSelector:
      matchLabels:
        {{- $selector | nindent 8 }}
    matchLabelKeys: [pod-template-hash]
  - topologyKey: kubernetes.io/hostname
    maxSkew: {{ $root.Values.topologySpread.node.maxSkew }}
    whenUnsatisfiable: {{ $root.Values.topologySpread.node.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- $selector | nindent 8 }}
    matchLabelKeys: [pod-template-hash]
{{- end }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The pod template's metadata: (dict "root" $ "component" "daemon"). */}}
{{- define "mq-scheduler.podMetadata" -}}
{{- $root := .root -}}
labels:
  {{- include "mq-scheduler.componentLabels" (dict "ctx" $root "component" .component) | nindent 2 }}
  {{- include "mq-scheduler.servesApiLabel" $root | nindent 2 }}
  {{- with $root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $roll := and (eq $root.Values.schedules.reload "roll") (not $root.Values.schedules.existingConfigMap) }}
{{- if or $roll $root.Values.podAnnotations }}
annotations:
  {{- if $roll }}
  checksum/schedules: {{ include "mq-scheduler.schedulesData" $root | sha256sum }}
  {{- end }}
  {{- with $root.Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}
