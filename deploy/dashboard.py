#!/usr/bin/env python3
"""Writes the chart's Grafana dashboard (deploy/helm/gpu-dra/files/dashboard.json, the ConfigMap
of `metrics.dashboard`). Edit the panels here, run it, commit both; `--check` fails when the JSON
differs from what this writes (e2e/alerts.sh runs it, then checks every query with promtool).

Usage: deploy/dashboard.py [--check]
"""
import json
import os
import sys
def panel(id, title, kind, exprs, x, y, w=12, h=8, legend=None, fmt=None, desc=""):
    targets=[]
    for i,e in enumerate(exprs):
        t={"refId":chr(65+i),"expr":e,"datasource":{"type":"prometheus","uid":"${datasource}"}}
        if legend: t["legendFormat"]=legend
        if fmt=="table": t.update({"format":"table","instant":True})
        targets.append(t)
    p={"id":id,"title":title,"type":kind,"datasource":{"type":"prometheus","uid":"${datasource}"},
       "gridPos":{"x":x,"y":y,"w":w,"h":h},"targets":targets}
    if desc: p["description"]=desc
    if kind=="table":
        p["transformations"]=[{"id":"organize","options":{"excludeByName":{"Time":True,"__name__":True,"Value":True}}}]
    return p
info='gpu_dra_prepared_device_info{Hostname=~"$node"}'
mig='gpu_dra_prepared_device_info{Hostname=~"$node",GPU_I_PROFILE!=""}'
by='Hostname, UUID, GPU_I_ID, namespace, claim, pods, dra_device'
def join(metric):
    return 'max by (%s) (%s * on (Hostname, UUID, GPU_I_ID) group_left (namespace, claim, pods, dra_device) max by (%s) (%s))' % (by, metric, by, info)
panels=[
 panel(1,"Prepared claims","stat",['sum(gpu_dra_prepared_claims)'],0,0,6,4),
 panel(2,"Published devices","stat",['sum(gpu_dra_published_devices)'],6,0,6,4),
 panel(3,"Devices tainted by faults","stat",['count(gpu_dra_device_taint) or vector(0)'],12,0,6,4),
 panel(4,"Prepare p95 latency","stat",['histogram_quantile(0.95, sum by (le) (rate(gpu_dra_prepare_duration_seconds_bucket[5m])))'],18,0,6,4),
 panel(5,"Published devices by health","timeseries",['sum by (state) (gpu_dra_device_health)'],0,4,legend="{{state}}"),
 panel(6,"Prepared devices by sharing mode","timeseries",['count by (sharing) (%s)' % info],12,4,legend="{{sharing}}"),
 panel(7,"MIG devices in use by profile","bargauge",['count by (GPU_I_PROFILE) (%s)' % mig],0,12,legend="{{GPU_I_PROFILE}}"),
 panel(8,"Fault taints by kind","timeseries",['sum by (key) (gpu_dra_device_taint)'],12,12,legend="{{key}}"),
 panel(9,"XIDs per second","timeseries",['sum by (gpu, xid) (rate(gpu_dra_gpu_xid_errors_total[5m]))'],0,20,legend="GPU {{gpu}} XID {{xid}}"),
 panel(10,"Prepare and unprepare failures per second","timeseries",['sum(rate(gpu_dra_prepare_errors_total[5m]))','sum(rate(gpu_dra_unprepare_errors_total[5m]))'],12,20),
 panel(14,"GPU memory in use per claim (NVML)","timeseries",['sum by (namespace, claim, dra_device) (gpu_dra_claim_device_memory_used_bytes{Hostname=~"$node"})'],0,28,legend="{{namespace}}/{{claim}} {{dra_device}}",
   desc="From the driver's own NVML reads every --usage-interval: a full GPU's memory in use, a MIG device's as its processes' sum."),
 panel(15,"Full-GPU utilization per claim (NVML)","timeseries",['max by (namespace, claim, dra_device) (gpu_dra_claim_device_utilization_ratio{Hostname=~"$node"})'],12,28,legend="{{namespace}}/{{claim}} {{dra_device}}"),
 panel(16,"GPU memory in use per pod (NVML, by process cgroup)","timeseries",['sum by (namespace, pod, dra_device) (gpu_dra_pod_device_memory_used_bytes{Hostname=~"$node"})'],0,52,24,8,legend="{{namespace}}/{{pod}} {{dra_device}}",
   desc="Each pod's compute processes on its claims' devices, mapped to the pod through the process's cgroup; a shared GPU is split by pod."),
 panel(11,"Which pod holds which GPU slice","table",[info],0,36,24,8,fmt="table",
   desc="One row per prepared device of each claim: the pods its reservedFor names, the GPU (UUID) and MIG device (GPU_I_ID, GPU_I_PROFILE) as DCGM exporter labels them, and how it is shared."),
 panel(12,"GPU memory used per claim (DCGM exporter)","table",[join('DCGM_FI_DEV_FB_USED')],0,44,12,8,fmt="table",
   desc="DCGM's framebuffer memory in use (MiB) of each claim's GPU or MIG device; empty without DCGM exporter."),
 panel(13,"GPU engine activity per claim (DCGM exporter)","table",[join('DCGM_FI_PROF_GR_ENGINE_ACTIVE')],12,44,12,8,fmt="table",
   desc="DCGM's graphics engine activity (0-1, per MIG device too) of each claim's device; empty without DCGM exporter."),
]
dash={"title":"gpu-dra: GPUs, claims and pods","uid":"gpu-dra","schemaVersion":39,"version":1,"editable":True,
 "time":{"from":"now-6h","to":"now"},"refresh":"30s","tags":["gpu","dra","nvidia"],
 "templating":{"list":[
   {"name":"datasource","type":"datasource","query":"prometheus","label":"Data source"},
   {"name":"node","type":"query","label":"Node","datasource":{"type":"prometheus","uid":"${datasource}"},
    "query":"label_values(gpu_dra_prepared_device_info, Hostname)","includeAll":True,"allValue":".*","multi":True,"refresh":2}]},
 "panels":panels}
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helm/gpu-dra/files/dashboard.json")
text = json.dumps(dash, indent=2) + "\n"
if sys.argv[1:] == ["--check"]:
    with open(OUT) as f:
        if f.read() != text:
            sys.exit(f"{OUT} is not what deploy/dashboard.py writes: run it and commit the result")
else:
    with open(OUT, "w") as f:
        f.write(text)
