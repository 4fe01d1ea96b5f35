{{/*
The production profile with the values applied: what serveConfigV2 holds and what every pod
group is sized from. A type named in .Values.types that the profile lacks stops the render.
*/}}
{{- define "serviceai.profile" -}}
{{- $config := .Files.Get "files/serve_config.production.yaml" | fromYaml -}}
{{- $names := list -}}
{{- range $app := $config.applications -}}
{{- $names = append $names $app.name -}}
{{- $t := index $.Values.types $app.name | default dict -}}
{{- if and (eq $app.import_path "app.builder:build_model_type") $t -}}
{{- include "serviceai.applyType" (dict "args" $app.args "type" $t) -}}
{{- end -}}
{{- end -}}
{{- range $name, $_ := .Values.types -}}
{{- if not (has $name $names) -}}
{{- fail (printf "types.%s: the production profile has no such type (it has %s)" $name (join ", " $names)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* One type's values over its application's args. */}}
{{- define "serviceai.applyType" -}}
{{- $args := .args -}}
{{- $t := .type -}}
{{- if $t.model -}}
{{- $_ := set $args "model" $t.model -}}
{{- if ne (get $args "task" | default "generate") "embed" -}}
{{- $_ := unset $args "tool_call_parser" -}}
{{- $_ := unset $args "reasoning_parser" -}}
{{- if or (hasKey $t "toolCallParser") (hasKey $t "reasoningParser") -}}
{{- with $t.toolCallParser }}{{ $_ := set $args "tool_call_parser" . }}{{ end -}}
{{- with $t.reasoningParser }}{{ $_ := set $args "reasoning_parser" . }}{{ end -}}
{{- else -}}
{{- $_ := set $args "parsers_from_family" true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $t.accelerator }}{{ $_ := set $args "accelerator_type" . }}{{ end -}}
{{- with $t.gpusPerReplica -}}
{{- $_ := set $args "tensor_parallel_size" (int .) -}}
{{- $_ := set $args "num_gpus_per_shard" 1 -}}
{{- end -}}
{{- if or (hasKey $t "minReplicas") (hasKey $t "maxReplicas") -}}
{{- $scaling := get $args "autoscaling_config" | default dict -}}
{{- if hasKey $t "minReplicas" }}{{ $_ := set $scaling "min_replicas" (int $t.minReplicas) }}{{ end -}}
{{- with $t.maxReplicas }}{{ $_ := set $scaling "max_replicas" (int .) }}{{ end -}}
{{- $_ := set $args "autoscaling_config" $scaling -}}
{{- end -}}
{{- with $t.engineArgs -}}
{{- $_ := set $args "engine_args" (mergeOverwrite (get $args "engine_args" | default dict) .) -}}
{{- end -}}
{{- end -}}

{{/* NVIDIA GPU feature discovery's nvidia.com/gpu.product for Ray's accelerator types. */}}
{{- define "serviceai.gpuProduct" -}}
{{- $products := dict "L4" "NVIDIA-L4" "L40S" "NVIDIA-L40S" "A10G" "NVIDIA-A10G" "A100" "NVIDIA-A100-SXM4-80GB" "H100" "NVIDIA-H100-80GB-HBM3" "H200" "NVIDIA-H200" -}}
{{- .product | default (get $products .accelerator) | required (printf "types.%s.gpuProduct: no product label known for accelerator %s; set it" .name .accelerator) -}}
{{- end -}}

{{- define "serviceai.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "serviceai.labels" -}}
app.kubernetes.io/name: serviceai
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Every pod's metadata: the labels, and the Secrets' revision that rolls them. */}}
{{- define "serviceai.podMetadata" -}}
labels:
  {{- include "serviceai.labels" . | nindent 2 }}
{{- with .Values.secretsRevision }}
annotations:
  serviceai/secrets-revision: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "serviceai.modelCacheClaim" -}}
{{ .Values.modelCache.existingClaim | default (printf "%s-model-cache" .Release.Name) }}
{{- end -}}

{{/* A container's image, secrets and extra variables: the same in every pod. */}}
{{- define "serviceai.container" -}}
image: {{ include "serviceai.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
envFrom:
  - secretRef:
      name: {{ .Values.secrets.env }}
{{- end -}}
