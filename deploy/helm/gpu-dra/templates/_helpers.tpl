{{/* Name of cluster- and namespace-scoped objects: the release name, prefixed with the chart
name unless it already contains it; 63 characters at most (DNS label). */}}
{{- define "gpu-dra.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Chart.Name .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpu-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-dra.labels" -}}
{{ include "gpu-dra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpu-dra.serviceAccountName" -}}
{{- default (include "gpu-dra.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The user name the API server gives the driver's service account tokens. */}}
{{- define "gpu-dra.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpu-dra.serviceAccountName" .) -}}
{{- end -}}

{{/* The IMEX mode flags of the plugin and the controller (computeDomains.imex). */}}
{{- define "gpu-dra.imexArgs" -}}
{{- $imex := .Values.computeDomains.imex }}
{{- if eq $imex.mode "hostManaged" }}
{{- if not $imex.hostSocket }}
{{- fail "computeDomains.imex.mode hostManaged needs computeDomains.imex.hostSocket: the host nvidia-imex's IMEX_CMD_UNIX_DOMAIN_PATH" }}
{{- end }}
- --imex-mode=host-managed
- --imex-host-socket={{ $imex.hostSocket }}
{{- else if eq $imex.mode "driverManaged" }}
- --imex-mode=driver-managed
{{- else }}
{{- fail (printf "computeDomains.imex.mode %q: use driverManaged or hostManaged" $imex.mode) }}
{{- end }}
{{- end }}
