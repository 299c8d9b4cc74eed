#!/bin/bash
# The whole verification a container of the fleet gets, on one real GPU machine, in under five minutes: torch_verify
# with every check (versions, each GPU counted and opened as nobody, the bf16 matmul, cuDNN's convolution,
# cuSPARSELt's 2:4 matmul, the NCCL all_reduce across all GPUs with the transport NCCL chose, /dev/shm, the training
# step), twice: the first keeps the training step's baseline, the second is held to it. Run it wherever a GPU machine
# is lent (no Ansible, nothing downloaded there; the modules run as Ansible runs them, `python3 MODULE.py ARGS.json`):
#   bench/gpu_preflight.sh prepare   here: .devcheck/ gets ansible's module_utils and the collection's plugins
#   bench/gpu_preflight.sh run       there, with .devcheck carried: a line per check, the results in $OUT
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
prepare) exec bash "$HERE/bench/device_check.sh" prepare ;;
run) ;;
*) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
started=$(date +%s)
D=$HERE/.devcheck
export PYTHONUNBUFFERED=1 PYTHONPATH=$D/py
M=$D/py/ansible_collections/gpufleet/proxmox/plugins/modules
OUT=${OUT:-/tmp/preflight}; mkdir -p "$OUT"
. "$HERE/bench/device_venv.sh"
rm -f /tmp/preflight-baseline.json
ARGS="\"venv\": \"/tmp/v\", \"expect_torch_version\": \"$TV\", \"expect_cuda_version\": \"$CV\", \"require_cuda\": true,
  \"expect_device_count\": $NGPU, \"expect_cudnn_version\": $CUDNN, \"expect_nccl_version\": \"$NCCL\",
  \"expect_driver_version\": \"$DRV\", \"smoke\": \"matmul\", \"user\": \"nobody\", \"collective\": true,
  \"collective_timeout\": 120, \"train_step\": true, \"baseline_path\": \"/tmp/preflight-baseline.json\",
  \"min_shm_mb_per_gpu\": 256, \"timeout\": 280"
rc=0
for round in first second; do
  echo "{\"ANSIBLE_MODULE_ARGS\": {$ARGS}}" > /tmp/preflight-args.json
  t0=$(date +%s)
  timeout 290 python3 "$M/torch_verify.py" /tmp/preflight-args.json > "$OUT/preflight-$round.json" 2> "$OUT/preflight-$round.err"
  echo "== torch_verify, $round round (exit $?, $(( $(date +%s) - t0 )) s)"
  python3 - "$OUT/preflight-$round.json" <<'PY' || rc=1
import json, sys
r = json.load(open(sys.argv[1]))
print('torch {0} CUDA {1} cuDNN {2} NCCL {3} driver {4}, {5} device(s)'.format(
    r.get('torch_version'), r.get('cuda_version'), r.get('cudnn_version'), r.get('nccl_version'),
    r.get('driver_version'), r.get('device_count')))
for d in r.get('devices') or []:
    print('  device {0} {1} sm_{2}: bf16 {3} TFLOPS'.format(d['index'], d['name'], d['capability'].replace('.', ''),
                                                          d.get('bf16_tflops')))
for c in r.get('checks') or []:
    extra = dict((k, v) for k, v in c.items() if k not in ('name', 'device', 'status', 'stderr'))
    print('  {0:<14} {1:<7} {2:<15} {3}'.format(c['name'], '' if c.get('device') is None else 'dev ' + str(c['device']),
                                               c['status'], json.dumps(extra, sort_keys=True)[:300]))
print('  throughput: {0}'.format(json.dumps(r.get('throughput'), sort_keys=True)))
for f in r.get('failures') or []:
    print('  FAILURE {0}'.format(json.dumps(f, sort_keys=True)[:600]))
sys.exit(1 if r.get('failed') or r.get('failures') else 0)
PY
done
took=$(( $(date +%s) - started ))
echo "== gpu_preflight: $took s in all (the bound: 300 s), $([ $rc -eq 0 ] && echo passed || echo FAILED)"
[ $rc -eq 0 ] && [ $took -lt 300 ]
