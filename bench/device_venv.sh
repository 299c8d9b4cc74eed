# shellcheck shell=bash disable=SC2034
# Sourced by the device scripts (device_check.sh, gpu_preflight.sh) on a machine whose Python holds a CUDA torch and
# the NVIDIA wheels: PY (that Python), /tmp/v (a venv with a copy of its site-packages, as a node's venv would be),
# TV CV CUDNN NCCL (torch's versions), DRV (the driver nvidia-smi reports), NGPU, and /tmp/lock.txt (its pins).
PY=
for p in /opt/torch/.venv/bin/python3 python3 python /usr/bin/python3; do
  if command -v $p >/dev/null && $p -c 'import torch' 2>/dev/null; then PY=$(command -v $p); break; fi
done
echo "== python with torch: $PY"
[ -n "$PY" ] || exit 2
NGPU=$(nvidia-smi -L | grep -c "^GPU ")
DRV=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
SP=$($PY -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
t0=$(date +%s)
"$PY" -m venv /tmp/v
VSP=$(/tmp/v/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
cp -a "$SP"/. "$VSP"/
for f in "$(dirname "$PY")"/*; do case $(basename "$f") in python*|activate*|Activate*) ;; *) cp -a "$f" /tmp/v/bin/ ;; esac; done
echo "== venv /tmp/v made and filled in $(( $(date +%s) - t0 )) s (its share/ is not copied: a few files of it missing are the copy's)"
read -r TV CV CUDNN NCCL <<<"$(/tmp/v/bin/python -c "
import torch
try:
    nccl = '.'.join(map(str, torch.cuda.nccl.version()))
except Exception:
    nccl = 'none'
print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version() or 0, nccl)" 2>/dev/null)"
/tmp/v/bin/python -m pip freeze 2>/dev/null | grep '==' > /tmp/lock.txt
