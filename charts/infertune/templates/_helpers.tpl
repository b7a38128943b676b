{{/* Names. Kubernetes names are limited to 63 characters. */}}
{{- define "infertune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "infertune.fullname" -}}
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

{{- define "infertune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "infertune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infertune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infertune.labels" -}}
helm.sh/chart: {{ include "infertune.chart" . }}
{{ include "infertune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: infertune
{{- end -}}

{{/* Service accounts. */}}
{{- define "infertune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "infertune.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "infertune.tunerServiceAccountName" -}}
{{- if .Values.tuner.serviceAccount.create -}}
{{- default (printf "%s-tuner" (include "infertune.fullname" .)) .Values.tuner.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.tuner.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An image reference from {repository, tag, digest}: the digest wins, an empty tag means the chart's
appVersion, and global.imageRegistry is prefixed when set.
Usage: include "infertune.image" (dict "image" .Values.operator.image "root" .)
*/}}
{{- define "infertune.image" -}}
{{- $repo := .image.repository -}}
{{- with .root.Values.global.imageRegistry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the operator watches ("" alone = cluster-wide). */}}
{{- define "infertune.clusterWide" -}}
{{- if not .Values.operator.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the study-storage URL, and its key ("" when storage is sqlite). */}}
{{- define "infertune.storageSecretName" -}}
{{- if eq .Values.storage.type "external" -}}
{{- .Values.storage.url.secretName -}}
{{- else if eq .Values.storage.type "postgresql" -}}
{{- printf "%s-postgresql" (include "infertune.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "infertune.storageSecretKey" -}}
{{- if eq .Values.storage.type "external" -}}
{{- .Values.storage.url.secretKey -}}
{{- else if eq .Values.storage.type "postgresql" -}}
url
{{- end -}}
{{- end -}}

{{/* PodDisruptionBudget API: policy/v1 from Kubernetes 1.21, policy/v1beta1 before. */}}
{{- define "infertune.pdbApiVersion" -}}
{{- if semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}

{{/* kopf peering object name ("" when peering is off). */}}
{{- define "infertune.peeringName" -}}
{{- if .Values.operator.peering.enabled -}}
{{- default (include "infertune.fullname" .) .Values.operator.peering.name -}}
{{- end -}}
{{- end -}}
