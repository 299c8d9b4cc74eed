#!/bin/bash
# torch_verify and venv_audit against a real CUDA torch and GPU (a machine whose Python holds torch and the NVIDIA
# wheels, with nothing to download), then the incident: the four nvidia cu13 runtime wheels uninstalled.
#   bench/device_check.sh prepare   here: .devcheck/ gets ansible's module_utils (from .venv) and the collection's plugins
#   bench/device_check.sh run       there (with .devcheck carried): each module run as Ansible runs it, on a copy of
#                                   the machine's torch venv; a line per run, every result in $OUT/results.tar.gz
# The modules run as `python3 MODULE.py ARGS.json`, which AnsibleModule reads: no Ansible is needed there.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
D=$HERE/.devcheck
case "${1:-}" in
prepare)
  rm -rf "$D" && mkdir -p "$D/py/ansible_collections/gpufleet/proxmox"
  cp -a "$HERE"/.venv/lib/python3*/site-packages/ansible "$D/py/"
  cp -a "$HERE/plugins" "$D/py/ansible_collections/gpufleet/proxmox/"
  find "$D" -name __pycache__ -prune -exec rm -rf {} +
  echo "prepared $D ($(du -sh "$D" | cut -f1)): carry .devcheck and run: bash bench/device_check.sh run"
  exit 0 ;;
run) ;;
*) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1 PYTHONPATH=$D/py
M=$D/py/ansible_collections/gpufleet/proxmox/plugins/modules
R=/tmp/results; mkdir -p $R
. "$HERE/bench/device_venv.sh"  # PY, /tmp/v (a copy of its torch venv), TV CV CUDNN NCCL DRV, /tmp/lock.txt
echo "== lock: $(wc -l < /tmp/lock.txt) pins"

mod() {  # module, result name, args (JSON)
  echo "{\"ANSIBLE_MODULE_ARGS\": $3}" > /tmp/args.json
  local t0 t1 rc
  t0=$(date +%s.%N)
  timeout 120 python3 "$M/$1.py" /tmp/args.json > "$R/$2.json" 2> "$R/$2.err"
  rc=$?
  t1=$(date +%s.%N)
  python3 "$HERE/bench/device_summary.py" "$R/$2.json" "$1" "$2" "$rc" "$t0" "$t1"
}

EXPECT="\"venv\": \"/tmp/v\", \"expect_torch_version\": \"$TV\", \"expect_cuda_version\": \"$CV\", \"require_cuda\": true, \"expect_device_count\": 1, \"expect_cudnn_version\": $CUDNN, \"expect_nccl_version\": \"$NCCL\", \"expect_driver_version\": \"$DRV\""
mod torch_verify verify_healthy "{$EXPECT, \"smoke\": \"matmul\", \"min_tflops\": 300, \"user\": \"nobody\"}"
mod torch_verify verify_wrong "{\"venv\": \"/tmp/v\", \"expect_torch_version\": \"2.11.0+cu128\", \"expect_cuda_version\": \"12.8\", \"require_cuda\": true, \"expect_device_count\": 8, \"expect_driver_version\": \"580.95.05\"}"
mod venv_audit audit_fast_healthy "{\"venv\": \"/tmp/v\", \"imports\": [\"torch\"]}"
mod venv_audit audit_full_healthy "{\"venv\": \"/tmp/v\", \"lock\": \"/tmp/lock.txt\", \"mode\": \"full\", \"imports\": [\"torch\", \"torchvision\", \"torchaudio\"]}"
echo "== the incident: uninstall the four nvidia cu13 runtime wheels"
/tmp/v/bin/python -m pip uninstall -y nvidia-cudnn-cu13 nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvshmem-cu13 2>&1 | grep -c Successfully
/tmp/v/bin/python -c 'import torch' 2>&1 | tail -1
mod venv_audit audit_fast_broken_nolock "{\"venv\": \"/tmp/v\", \"imports\": [\"torch\"]}"
mod venv_audit audit_fast_broken_lock "{\"venv\": \"/tmp/v\", \"lock\": \"/tmp/lock.txt\", \"imports\": [\"torch\"]}"
mod torch_verify verify_broken "{$EXPECT}"
tar -C $R -czf "$OUT/results.tar.gz" . && echo "== results in results.tar.gz"
