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

{{/* NVIDIA's chart's values (dra-driver-nvidia-gpu), for users who bring their values file.
Each one gpu-dra has is moved to gpu-dra's key (NVIDIA's wins over gpu-dra's there); each one it
has not is accepted only at NVIDIA's default (files/nvidia-values-defaults.yaml: what gpu-dra does
anyway, or a part gpu-dra does not install), anything else is refused naming the key. Included
first by every template; it removes what it handled, so a second run changes nothing. */}}
{{- define "gpu-dra.nvidiaValues" -}}
{{- $v := .Values -}}
{{- $defaults := .Files.Get "files/nvidia-values-defaults.yaml" | fromYaml -}}
{{- $nvidiaImage := "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu" -}}
{{- if hasPrefix $nvidiaImage (toString $v.image.repository) -}}
{{- fail (printf "image.repository %q is NVIDIA's driver's image; gpu-dra's chart runs gpu-dra (deploy/Dockerfile), so leave image.repository unset or point it at a gpu-dra image" $v.image.repository) -}}
{{- end -}}
{{- if eq (toString $v.consumableShares) "" -}}
{{- $_ := set $v "consumableShares" "off" -}}
{{- end -}}
{{- /* NVIDIA's plugin takes consumableShares only under its ConsumableShares gate; gpu-dra's value
needs no gate. The gate on (NVIDIA's values files set both) is the value alone; the gate off with a
mode set is what NVIDIA's plugin refuses to start with. */ -}}
{{- if and $v.featureGates (hasKey $v.featureGates "ConsumableShares") -}}
{{- if and (not (get $v.featureGates "ConsumableShares")) (not (has (toString $v.consumableShares) (list "off" "disabled"))) -}}
{{- fail (printf "featureGates.ConsumableShares false with consumableShares %q: NVIDIA's plugin refuses a mode without its gate; set the gate true or consumableShares off" (toString $v.consumableShares)) -}}
{{- end -}}
{{- $_ := unset $v.featureGates "ConsumableShares" -}}
{{- end -}}
{{- with $v.logVerbosity -}}
{{- $level := int . -}}
{{- $_ := set $v "logLevel" (ternary "info" (ternary "info,gpu_dra=debug" "info,gpu_dra=trace" (lt $level 5)) (lt $level 2)) -}}
{{- end -}}
{{- $_ := unset $v "logVerbosity" -}}
{{- with $v.nvidiaCDIHookPath -}}
{{- $_ := set $v "extraEnv" (append (default list $v.extraEnv) (dict "name" "NVIDIA_CDI_HOOK_PATH" "value" .)) -}}
{{- end -}}
{{- $_ := unset $v "nvidiaCDIHookPath" -}}
{{- $resources := default dict $v.resources -}}
{{- with $resources.gpus -}}
{{- if and (hasKey . "enabled") (not .enabled) -}}
{{- fail "resources.gpus.enabled false (NVIDIA's chart: the GPU plugin off): gpu-dra's node driver always serves the node's GPUs" -}}
{{- end -}}
{{- $_ := unset $resources "gpus" -}}
{{- end -}}
{{- with $resources.computeDomains -}}
{{- if hasKey . "enabled" -}}{{- $_ := set $v.computeDomains "enabled" .enabled -}}{{- end -}}
{{- with .imex -}}
{{- with .mode -}}{{- $_ := set $v.computeDomains.imex "mode" . -}}{{- end -}}
{{- with .hostSocketPath -}}{{- $_ := set $v.computeDomains.imex "hostSocket" . -}}{{- end -}}
{{- if and .isolation (ne .isolation "domain") -}}
{{- fail (printf "resources.computeDomains.imex.isolation %q: gpu-dra isolates IMEX channels per ComputeDomain (NVIDIA's \"domain\") only" .isolation) -}}
{{- end -}}
{{- end -}}
{{- $_ := unset $resources "computeDomains" -}}
{{- end -}}
{{- with $v.kubeletPlugin -}}
{{- range $key := list "priorityClassName" "podAnnotations" "nodeSelector" "tolerations" -}}
{{- if hasKey $v.kubeletPlugin $key -}}{{- $_ := set $v $key (get $v.kubeletPlugin $key) -}}{{- $_ := unset $v.kubeletPlugin $key -}}{{- end -}}
{{- end -}}
{{- with .affinity -}}
{{- if omit . "nodeAffinity" -}}
{{- fail (printf "kubeletPlugin.affinity: gpu-dra's chart takes nodeAffinity only (its value nodeAffinity), not %s" (keys (omit . "nodeAffinity") | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $_ := set $v "nodeAffinity" .nodeAffinity -}}
{{- $_ := unset $v.kubeletPlugin "affinity" -}}
{{- end -}}
{{- $plugins := trimSuffix "/plugins" (default "/var/lib/kubelet/plugins" .kubeletPluginsDirectoryPath) -}}
{{- $registry := trimSuffix "/plugins_registry" (default "/var/lib/kubelet/plugins_registry" .kubeletRegistrarDirectoryPath) -}}
{{- if or .kubeletPluginsDirectoryPath .kubeletRegistrarDirectoryPath -}}
{{- if ne $plugins $registry -}}
{{- fail (printf "kubeletPlugin.kubeletPluginsDirectoryPath and kubeletRegistrarDirectoryPath must be <kubelet root>/plugins and <kubelet root>/plugins_registry of one root (gpu-dra's value kubeletDir), not %s/plugins and %s/plugins_registry" $plugins $registry) -}}
{{- end -}}
{{- $_ := set $v "kubeletDir" $plugins -}}
{{- $_ := unset $v.kubeletPlugin "kubeletPluginsDirectoryPath" -}}
{{- $_ := unset $v.kubeletPlugin "kubeletRegistrarDirectoryPath" -}}
{{- end -}}
{{- with .metrics -}}
{{- if and (hasKey . "enabled") (not .enabled) -}}
{{- fail "kubeletPlugin.metrics.enabled false: gpu-dra always serves /metrics, on the port its probes use (its value metrics.port)" -}}
{{- end -}}
{{- $_ := unset . "enabled" -}}
{{- with .gpuHttpEndpoint -}}
{{- $port := regexReplaceAll "^.*:" (toString .) "" -}}
{{- if not (regexMatch "^[0-9]+$" $port) -}}
{{- fail (printf "kubeletPlugin.metrics.gpuHttpEndpoint %q: expected [HOST]:PORT" .) -}}
{{- end -}}
{{- $_ := set $v.metrics "port" (int $port) -}}
{{- with regexReplaceAll ":[0-9]+$" (toString .) "" -}}{{- $_ := set $v.metrics "bindAddress" . -}}{{- end -}}
{{- end -}}
{{- $_ := unset . "gpuHttpEndpoint" -}}
{{- end -}}
{{- with .containers -}}
{{- with .gpus -}}
{{- range .env -}}
{{- /* NVIDIA's plugin's own variables gpu-dra does not read: their settings are values here. */ -}}
{{- if has .name (list "NAMESPACE" "CDI_ROOT" "HOST_DRIVER_ROOT" "DRIVER_ROOT_CTR_PATH" "HOST_ROOT" "IMAGE_NAME" "IMAGE_PULL_SECRETS" "IMAGE_PULL_POLICY" "SERVICE_ACCOUNT_NAME" "KUBELET_REGISTRAR_DIRECTORY_PATH" "KUBELET_PLUGINS_DIRECTORY_PATH" "HEALTHCHECK_PORT" "HTTP_ENDPOINT" "METRICS_PATH" "CONSUMABLE_SHARES" "FEATURE_GATES") -}}
{{- fail (printf "kubeletPlugin.containers.gpus.env %s: a setting of NVIDIA's plugin that gpu-dra takes from its chart values (cdiRoot, nvidiaDriverRoot, kubeletDir, metrics.port, consumableShares, featureGates, ...), not from this variable" .name) -}}
{{- end -}}
{{- end -}}
{{- /* NVIDIA's sysfs root variable (its mock-NVML setups set it) is gpu-dra's GPU_DRA_SYSFS_ROOT. */ -}}
{{- $env := list -}}
{{- range .env -}}
{{- if eq .name "NVIDIA_DRA_SYSFS_ROOT" -}}{{- $env = append $env (merge (dict "name" "GPU_DRA_SYSFS_ROOT") (omit . "name")) -}}{{- else -}}{{- $env = append $env . -}}{{- end -}}
{{- end -}}
{{- with $env -}}{{- $_ := set $v "extraEnv" (concat (default list $v.extraEnv) .) -}}{{- end -}}
{{- $_ := unset . "env" -}}
{{- if hasKey . "resources" -}}{{- with .resources -}}{{- $_ := set $v "resources" . -}}{{- end -}}{{- $_ := unset . "resources" -}}{{- end -}}
{{- end -}}
{{- with .computeDomains -}}
{{- if hasKey . "gpuCliqueLabelEnabled" -}}{{- $_ := set $v.computeDomains "gpuCliqueLabel" .gpuCliqueLabelEnabled -}}{{- $_ := unset . "gpuCliqueLabelEnabled" -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $v.controller -}}
{{- range $key := list "replicas" "nodeSelector" "tolerations" -}}
{{- if hasKey $v.controller $key -}}{{- $_ := set $v.computeDomains.controller $key (get $v.controller $key) -}}{{- $_ := unset $v.controller $key -}}{{- end -}}
{{- end -}}
{{- with .containers -}}{{- with .computeDomain -}}{{- if hasKey . "resources" -}}
{{- with .resources -}}{{- $_ := set $v.computeDomains.controller "resources" . -}}{{- end -}}{{- $_ := unset . "resources" -}}
{{- end -}}{{- end -}}{{- end -}}
{{- end -}}
{{- if and $v.webhook (dig "enabled" false $v.webhook) -}}
{{- fail "webhook.enabled true (NVIDIA's admission webhook for opaque configs): gpu-dra installs no webhook; the node driver refuses a claim whose opaque config is invalid at prepare, naming the field, and `gpu-dra match`/`explain` check claims before they are applied" -}}
{{- end -}}
{{- $_ := unset $v "webhook" -}}
{{- /* NVIDIA's chart's two install guards, applied as it applies them when a values file sets them. */ -}}
{{- if and (hasKey $v "allowDefaultNamespace") (not $v.allowDefaultNamespace) (eq .Release.Namespace "default") -}}
{{- fail "allowDefaultNamespace false (NVIDIA's chart): the release is in the default namespace; install with --namespace (and --create-namespace), or set allowDefaultNamespace true" -}}
{{- end -}}
{{- if and (hasKey $v "gpuResourcesEnabledOverride") (not $v.gpuResourcesEnabledOverride) $v.extendedResources.enabled -}}
{{- fail "gpuResourcesEnabledOverride false (NVIDIA's chart: GPUs through DRA are not allowed beside the classic device plugin): set it true once the device plugin no longer serves nvidia.com/gpu on these nodes, or set extendedResources.enabled false so pods asking for nvidia.com/gpu keep the device plugin" -}}
{{- end -}}
{{- $_ := unset $v "gpuResourcesEnabledOverride" -}}
{{- $_ := unset $v "allowDefaultNamespace" -}}
{{- with $v.resourceApiVersion -}}
{{- if not (has . (list "v1" "resource.k8s.io/v1")) -}}
{{- fail (printf "resourceApiVersion %q: gpu-dra's chart installs resource.k8s.io/v1 objects only (Kubernetes 1.34 and later)" .) -}}
{{- end -}}
{{- end -}}
{{- $_ := unset $v "resourceApiVersion" -}}
{{- range $key, $default := $defaults -}}
{{- if hasKey $v $key -}}
{{- include "gpu-dra.nvidiaDefaultsOnly" (dict "path" $key "value" (get $v $key) "default" $default) -}}
{{- $_ := unset $v $key -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Refuses any leaf of an NVIDIA value that is not NVIDIA's default (dict path, value, default). */}}
{{- define "gpu-dra.nvidiaDefaultsOnly" -}}
{{- if and (kindIs "map" .value) (kindIs "map" .default) -}}
{{- $path := .path -}}
{{- $default := .default -}}
{{- range $key, $value := .value -}}
{{- include "gpu-dra.nvidiaDefaultsOnly" (dict "path" (printf "%s.%s" $path $key) "value" $value "default" (get $default $key)) -}}
{{- end -}}
{{- else if ne (toJson .value) (toJson .default) -}}
{{- fail (printf "%s: %s is a value of NVIDIA's chart (dra-driver-nvidia-gpu) that gpu-dra's chart has no equivalent for; only NVIDIA's default (%s) is accepted (docs/reference/chart-values.md, \"NVIDIA's values\")" .path (toJson .value) (toJson .default)) -}}
{{- end -}}
{{- end -}}
