{{/* The release's full name: the release name, or "<release>-cellplane" when the release name does not say cellplane. */}}
{{- define "cellplane.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the operators run as. */}}
{{- define "cellplane.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cellplane.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "cellplane.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "cellplane.releaseLabels" . }}
{{- end -}}

{{/* The labels beyond name and instance (a pod gets those from its selector). */}}
{{- define "cellplane.releaseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selects the operator pods of one region; called with (dict "root" $ "region" $region). */}}
{{- define "cellplane.regionSelector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: operator
cellplane.io/region: {{ .region.name }}
{{- end -}}

{{/* The regions' names, comma-separated (--regions); fails on a missing or invalid name. */}}
{{- define "cellplane.regionNames" -}}
{{- $names := list -}}
{{- range .Values.regions -}}
{{- $name := required "every entry of regions needs a name" .name -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "region name %q is not a DNS label (lower-case letters, digits, '-')" $name) -}}
{{- end -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- if not $names -}}
{{- fail "regions is empty: list at least one region" -}}
{{- end -}}
{{- if ne (len $names) (len (uniq $names)) -}}
{{- fail (printf "regions lists a name twice: %s" (join "," $names)) -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* Selects the router pods of one region; called with (dict "root" $ "region" $region). */}}
{{- define "cellplane.routerSelector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: router
cellplane.io/region: {{ .region.name }}
{{- end -}}

{{/* The image of the operators and the routers (one image for both). */}}
{{- define "cellplane.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The image the kubernetes site driver runs cells with: cells.image, else the operator's. */}}
{{- define "cellplane.cellImage" -}}
{{- $repository := .Values.cells.image.repository | default .Values.image.repository -}}
{{- $tag := .Values.cells.image.tag | default (ternary (.Values.image.tag | default .Chart.AppVersion) .Chart.AppVersion (not .Values.cells.image.repository)) -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/* The namespace of the kubernetes driver's site objects: cells.namespace, else the release's. */}}
{{- define "cellplane.cellNamespace" -}}
{{- .Values.cells.namespace | default .Release.Namespace -}}
{{- end -}}
