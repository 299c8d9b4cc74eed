# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a training job needs of its venv, checked with the venv's own interpreter in a subprocess (so an
ImportError or a hang is a finding, not a crash), every expectation compared and every failure reported
at once, with a diagnosis of the devices and of the venv's shared libraries when something is wrong.

Standard library only (the probe itself runs inside the venv, where torch is).
"""


import json
import os
import re
import stat
import subprocess
import time

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _devnodes, _files, _gpu, _venv, _venv_python

# Runs with the venv's interpreter; prints one JSON document on its last line. argv[1]: options as JSON.
PROBE = r'''
import json, os, re, sys, time, traceback
opts = json.loads(sys.argv[1])
def collective_rank(a):
    # one rank of the collective: an all_reduce of a.bytes of float32 across a.world ranks, warmed once (and checked:
    # each element the sum of the ranks' ones), then timed over a.iters; {ok, seconds, algbw_gbps, busbw_gbps}
    import datetime, torch
    import torch.distributed as dist
    dist.init_process_group(a["backend"], init_method="file://" + a["store"], rank=a["rank"], world_size=a["world"],
                            timeout=datetime.timedelta(seconds=a["timeout"]))
    try:
        dev = torch.device("cuda", a["rank"]) if a["backend"] == "nccl" else torch.device("cpu")
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        x = torch.ones(a["bytes"] // 4, dtype=torch.float32, device=dev)
        dist.all_reduce(x)
        sync()
        ok = float(x[0]) == a["world"] and float(x[-1]) == a["world"]
        t = time.monotonic()
        for _ in range(a["iters"]):
            dist.all_reduce(x)
        sync()
        took = (time.monotonic() - t) / a["iters"]
        algbw = a["bytes"] / took / 1e9
        return {"rank": a["rank"], "ok": ok, "seconds": round(took, 6), "algbw_gbps": round(algbw, 3),
                "busbw_gbps": round(algbw * 2 * (a["world"] - 1) / a["world"], 3)}
    finally:
        dist.destroy_process_group()
if "worker" in opts:
    sys.stdout.write("\n" + json.dumps(collective_rank(opts["worker"])) + "\n")
    sys.exit(0)
def said(e):
    return "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
out = {"timings": {}, "python_version": "%d.%d.%d" % sys.version_info[:3]}
def done():
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.exit(0)
t = time.monotonic()
try:
    import torch
except BaseException as e:
    out["import_error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
    done()
out["timings"]["import_s"] = round(time.monotonic() - t, 3)
out["torch_version"] = torch.__version__
out["torch_file"] = torch.__file__
out["cuda_version"] = torch.version.cuda
out["arch_list"] = []
try:
    out["cudnn_version"] = torch.backends.cudnn.version()
except Exception as e:
    out["cudnn_version"] = None
    out["cudnn_error"] = str(e)
out["nccl_version"] = None
if out["cuda_version"]:
    try:
        v = torch.cuda.nccl.version()
        out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:
        out["nccl_error"] = str(e)
t = time.monotonic()
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
except Exception as e:
    out["cuda_available"], out["device_count"], out["cuda_error"] = False, 0, str(e)
out["timings"]["cuda_init_s"] = round(time.monotonic() - t, 3)
# The userspace driver: the version in the file name of the libcuda.so.1 this process loads.
out["driver_version"] = None
try:
    import ctypes
    ctypes.CDLL("libcuda.so.1")
    with open("/proc/self/maps") as fh:
        for line in fh:
            m = re.search(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)\s*$", line)
            if m:
                out["driver_version"] = m.group(1)
                break
except OSError as e:
    out["driver_error"] = str(e)
devices = []
if out["cuda_available"]:
    out["arch_list"] = torch.cuda.get_arch_list()
    for i in range(out["device_count"]):
        p = torch.cuda.get_device_properties(i)
        cap = "{0}.{1}".format(p.major, p.minor)
        devices.append({"index": i, "name": p.name, "capability": cap, "memory_bytes": p.total_memory,
                        "arch_supported": any(a.endswith("_{0}{1}".format(p.major, p.minor)) for a in out["arch_list"])})
out["devices"] = devices
if opts.get("smoke") == "matmul" and devices:
    for d in devices:
        dev = torch.device("cuda", d["index"])
        g = torch.Generator().manual_seed(0)
        a = torch.randn(256, 256, generator=g)
        b = torch.randn(256, 256, generator=g)
        want = a @ b
        got = (a.to(dev, torch.bfloat16) @ b.to(dev, torch.bfloat16)).float().cpu()
        d["matmul_rel_error"] = float((got - want).norm() / want.norm())
        n = opts.get("bench_size", 4096)
        x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            x @ y
        torch.cuda.synchronize(dev)
        iters = opts.get("bench_iters", 20)
        t = time.monotonic()
        for _ in range(iters):
            x @ y
        torch.cuda.synchronize(dev)
        d["bf16_tflops"] = round(2.0 * n ** 3 * iters / (time.monotonic() - t) / 1e12, 1)
# Each library torch relies on beyond cuBLAS, at its first real call on each device: a named check with its status
# (ok, failed, not_applicable and why), its error and its time.
out["checks"] = []
def check(name, run, device=None, not_applicable=None):
    c = {"name": name}
    if device is not None:
        c["device"] = device
    if not_applicable:
        c.update(status="not_applicable", why=not_applicable)
        out["checks"].append(c)
        return
    t = time.monotonic()
    # what the library prints on the process's stderr (cuDNN names the sub-library it cannot load there) is kept
    # with the check that made it print
    import tempfile
    with tempfile.TemporaryFile() as printed:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(printed.fileno(), 2)
        try:
            c.update(run() or {})  # a run that finds it cannot check says why (not applicable)
            c["status"] = "failed" if c.get("error") else "not_applicable" if c.get("why") else "ok"
        except Exception as e:
            c["status"], c["error"] = "failed", said(e)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            printed.seek(0)
            text = printed.read().decode("utf-8", "replace").strip()
            if text:
                c["stderr"] = text[-4000:]
    if not c.get("error"):
        c.pop("error", None)
    c["seconds"] = round(time.monotonic() - t, 3)
    out["checks"].append(c)
def rel(got, want):
    got, want = got.detach().float().cpu(), want.detach().float()
    return float((got - want).norm() / want.norm())
def cudnn_conv(dev):
    # a convolution forward and backward through cuDNN (TF32 off), against the CPU's
    if not torch.backends.cudnn.is_available():
        return {"error": "torch.backends.cudnn.is_available() is False: torch does not load cuDNN"}
    F, g = torch.nn.functional, torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, 16, 16, generator=g), torch.randn(16, 8, 3, 3, generator=g)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    yc = F.conv2d(xc, wc, padding=1)
    yc.square().sum().backward()
    xd, wd = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yd = F.conv2d(xd, wd, padding=1)
        yd.square().sum().backward()
    torch.cuda.synchronize(dev)
    worst = max(rel(yd, yc), rel(xd.grad, xc.grad), rel(wd.grad, wc.grad))
    return {"rel_error": worst, "error": None if worst < 1e-3 else
            "the convolution or its gradients differ from the CPU's by {0:.2e} (relative)".format(worst)}
def cusparselt_24(dev):
    # a 2:4 sparse half-precision matmul through cuSPARSELt, against the dense one
    lt = getattr(torch.backends, "cusparselt", None)
    if lt is None or not lt.is_available():
        return {"error": "torch.backends.cusparselt.is_available() is False: torch does not load cuSPARSELt"}
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured
    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([0, 0, 1, 1], dtype=torch.float16).tile((128, 32))
    a = ((torch.rand(128, 128, generator=g) + 0.5).half() * mask).to(dev)
    b = torch.rand(128, 128, generator=g).half().to(dev)
    got = torch.mm(to_sparse_semi_structured(a), b)
    torch.cuda.synchronize(dev)
    err = rel(got, (a.float() @ b.float()).cpu())
    return {"rel_error": err, "error": None if err < 1e-2 else
            "the sparse matmul differs from the dense one by {0:.2e} (relative)".format(err)}
def has_distribution(prefix):
    try:
        from importlib import metadata
        return any((d.metadata["Name"] or "").lower().replace("_", "-").startswith(prefix)
                   for d in metadata.distributions())
    except Exception:
        return False
no_gpu = None if devices else ("no CUDA device: " + (out.get("cuda_error") or (
    "torch is a CPU build" if not out["cuda_version"] else "torch.cuda.is_available() is False")))
sparse_here = has_distribution("nvidia-cusparselt")
for d in devices or [None]:
    i = d["index"] if d else None
    dev = torch.device("cuda", i) if d else None
    check("cudnn_conv", lambda: cudnn_conv(dev), i, no_gpu)
    cap = tuple(int(x) for x in d["capability"].split(".")) if d else None
    check("cusparselt_24", lambda: cusparselt_24(dev), i, no_gpu or (
        None if sparse_here else "the venv has no cuSPARSELt (no nvidia-cusparselt distribution)") or (
        None if cap >= (8, 0) else "2:4 sparsity needs compute capability 8.0 or later; the device has {0}".format(
            d["capability"])))
def collective():
    # the container's GPUs talking: NCCL across every GPU, one process each (spawned: CUDA is initialised here), its
    # debug output kept for the transport it chose; without a GPU, gloo across two CPU processes (forked: cheap), so
    # that the path runs everywhere. Bounded by opts["collective_timeout"].
    import shutil, signal, tempfile
    nccl = bool(devices)
    world = len(devices) if nccl else 2
    limit = opts.get("collective_timeout") or 60
    work = tempfile.mkdtemp(prefix="gpufleet-collective-")
    c = {"name": "allreduce", "backend": "nccl" if nccl else "gloo", "world": world}
    try:
        args = [{"backend": c["backend"], "store": os.path.join(work, "store"), "rank": r, "world": world,
                 "bytes": opts.get("collective_bytes") or (64 << 20 if nccl else 8 << 20), "iters": 5,
                 "timeout": limit} for r in range(world)]
        logs = [os.path.join(work, "rank{0}.log".format(r)) for r in range(world)]
        procs = []
        t = time.monotonic()
        for a, log in zip(args, logs):
            if nccl:
                env = dict(os.environ, NCCL_DEBUG="INFO", CUDA_DEVICE_ORDER="PCI_BUS_ID")
                with open(log, "wb") as fh:
                    procs.append(subprocess.Popen([sys.executable, "-c", opts["self"], json.dumps({"worker": a})],
                                                  stdout=fh, stderr=subprocess.STDOUT, env=env))
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    torch.set_num_threads(1)  # the parent's OpenMP threads are not in the child
                    sys.stdout.write("\n" + json.dumps(collective_rank(a)) + "\n")
                    sys.stdout.flush()
                    code = 0
                except BaseException:
                    traceback.print_exc()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
            procs.append(pid)
        left = set(range(world))
        while left and time.monotonic() - t < limit:
            for r in sorted(left):
                p = procs[r]
                done_ = p.poll() is not None if nccl else os.waitpid(p, os.WNOHANG)[0] == p
                if done_:
                    left.discard(r)
            time.sleep(0.02)
        for r in left:
            if nccl:
                procs[r].kill()
                procs[r].wait()
            else:
                os.kill(procs[r], signal.SIGKILL)
                os.waitpid(procs[r], 0)
        c["seconds"] = round(time.monotonic() - t, 3)
        texts, results = [], []
        for log in logs:
            with open(log, "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
            texts.append(text)
            found = [line for line in text.splitlines() if line.startswith("{")]
            results.append(json.loads(found[-1]) if found else None)
        c["output"] = "\n".join(texts)[-20000:]
        if left:
            c["status"], c["error"] = "failed", "rank(s) {0} did not finish the collective in {1} s".format(
                ", ".join(str(r) for r in sorted(left)), limit)
        elif None in results:
            r = results.index(None)
            tail = [line for line in texts[r].strip().splitlines() if line.strip()][-1:] or ["no output"]
            c["status"], c["error"] = "failed", "rank {0} failed: {1}".format(r, tail[0][-1000:])
        elif not all(x["ok"] for x in results):
            c["status"], c["error"] = "failed", "the all_reduce gave wrong sums"
        else:
            c["status"] = "ok"
            c["algbw_gbps"] = min(x["algbw_gbps"] for x in results)
            c["busbw_gbps"] = min(x["busbw_gbps"] for x in results)
    except Exception as e:
        c["status"], c["error"] = "failed", said(e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["checks"].append(c)
def shm(floor):
    # NCCL's shared-memory transport and DataLoader's workers keep their buffers in /dev/shm
    st = os.statvfs(opts.get("shm_dir") or "/dev/shm")
    size = st.f_frsize * st.f_blocks
    return {"bytes": size, "floor_bytes": floor, "error": None if size >= floor else (
        "/dev/shm holds {0} MiB, under the {1} MiB asked for {2} GPU(s)".format(size >> 20, floor >> 20, len(devices)))}
if opts.get("min_shm_mb_per_gpu"):
    check("shm", lambda: shm(opts["min_shm_mb_per_gpu"] * max(1, len(devices)) << 20))
def device_order():
    # CUDA numbers the GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID (this process has what the venv's
    # activate exports): the numbers a job uses must be nvidia-smi's, which go by PCI bus id
    ids = []
    for d in devices:
        p = torch.cuda.get_device_properties(d["index"])
        if getattr(p, "pci_bus_id", None) is None:
            return {"error": None, "why": "this torch does not report the devices' PCI bus ids"}
        ids.append("{0:04x}:{1:02x}:{2:02x}.0".format(getattr(p, "pci_domain_id", 0) or 0, p.pci_bus_id,
                                                      getattr(p, "pci_device_id", 0) or 0))
    order = os.environ.get("CUDA_DEVICE_ORDER")
    return {"bus_ids": ids, "order": order, "error": None if ids == sorted(ids) else (
        "CUDA numbers the GPUs {0}, not in PCI bus order as nvidia-smi does (CUDA_DEVICE_ORDER is {1})".format(
            ", ".join(ids), order or "not set"))}
check("device_order", device_order, None, no_gpu or (
    None if len(devices) > 1 else "one GPU: there is no order to get wrong"))
def limits():
    # the container's ceilings: its init's limits, which LXC sets (lxc.prlimit.*) and which no process in the
    # container can raise its own above; NCCL over RDMA pins its buffers (memlock), DataLoader's workers pass file
    # descriptors (nofile)
    found = {}
    with open(opts.get("limits_file") or "/proc/1/limits") as fh:
        for line in fh:
            m = re.match(r"Max (open files|locked memory)\s+(\S+)\s+(\S+)", line)
            if m:
                found["nofile" if m.group(1) == "open files" else "memlock"] = {"soft": m.group(2), "hard": m.group(3)}
    wrong = []
    nofile = (found.get("nofile") or {}).get("hard")
    if opts.get("min_nofile") and nofile != "unlimited" and int(nofile or 0) < opts["min_nofile"]:
        wrong.append("the container's open files are limited to {0}, under {1}".format(nofile, opts["min_nofile"]))
    memlock = (found.get("memlock") or {}).get("hard")
    if opts.get("memlock_unlimited") and memlock != "unlimited":
        wrong.append("the container's locked memory is limited to {0} bytes where RDMA needs it unlimited".format(
            memlock))
    return {"init": found, "error": "; ".join(wrong) or None}
if opts.get("min_nofile") or opts.get("memlock_unlimited"):
    check("limits", limits)
if opts.get("collective"):
    import subprocess
    try:
        import torch.distributed as _dist
        usable = _dist.is_available() and (_dist.is_nccl_available() if devices else _dist.is_gloo_available())
    except Exception:
        usable = False
    if usable:
        collective()
    else:
        out["checks"].append({"name": "allreduce", "status": "failed", "error": "torch.distributed has no {0} "
                              "backend in this build".format("NCCL" if devices else "gloo")})
def train_step(dev):
    # a short, fixed training step of a small transformer (forward, backward, an SGD step): bf16 autocast on a GPU,
    # fp32 on one core of the CPU; tokens per second over 10 steps (20 on the CPU) after 2 to warm. It runs after
    # the collective: the gloo ranks are forked, and a fork after torch's CPU thread pool has run is not safe.
    import math
    torch.manual_seed(0)
    gpu = dev.type == "cuda"
    if not gpu:
        torch.set_num_threads(1)  # one core: OpenMP's threads spinning on a shared CPU would measure the neighbours
    d, layers, batch, seq, steps = (1024, 4, 16, 512, 10) if gpu else (64, 2, 4, 64, 20)
    layer = torch.nn.TransformerEncoderLayer(d, nhead=8 if gpu else 4, dim_feedforward=4 * d, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(dev)
    params = list(model.parameters())
    x = torch.randn(batch, seq, d, device=dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if gpu else (lambda: None)
    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=gpu):
            loss = model(x).float().square().mean()
        loss.backward()
        with torch.no_grad():  # plain SGD (torch.optim's import alone takes seconds)
            for p in params:
                p.add_(p.grad, alpha=-1e-3)
                p.grad = None
        return loss.item()
    for _ in range(2):
        step()
    sync()
    t = time.monotonic()
    for _ in range(steps):
        loss = step()
    sync()
    took = time.monotonic() - t
    return {"tokens_per_s": round(batch * seq * steps / took, 1), "step": "{0}: d={1} layers={2} batch={3} seq={4}".format(
        "bf16" if gpu else "fp32 cpu", d, layers, batch, seq), "error": None if math.isfinite(loss) else
        "the training step's loss is {0}".format(loss)}
if opts.get("train_step"):
    for d in devices or [None]:
        check("train_step", lambda: train_step(torch.device("cuda", d["index"]) if d else torch.device("cpu")),
              d["index"] if d else None)
if opts.get("compile_check"):
    t = time.monotonic()
    try:
        f = torch.compile(lambda v: torch.nn.functional.gelu(v) * 2 + 1, backend=opts.get("compile_backend", "inductor"))
        v = torch.randn(64, device="cuda" if devices else "cpu")
        ok = torch.allclose(f(v), torch.nn.functional.gelu(v) * 2 + 1, atol=1e-5)
        out["compile_ok"] = bool(ok)
        if not ok:
            out["compile_error"] = "the compiled function gave other results than eager mode"
    except Exception as e:
        out["compile_ok"] = False
        out["compile_error"] = said(e)
    out["timings"]["compile_s"] = round(time.monotonic() - t, 3)
done()
'''

ERRNO_WHY = {
    'EPERM': "the container's device cgroup denies it (passthrough or cgroup rules wrong)",
    'EACCES': 'permission denied (the node is not readable and writable by this user)',
    'ENXIO': 'no driver behind the node (the NVIDIA kernel module on the node is not loaded, or the GPU is gone)',
    'ENODEV': 'no driver behind the node (the NVIDIA kernel module on the node is not loaded, or the GPU is gone)',
}


def job_env(venv):
    """The environment a job has that sources the venv's activate: this one's, with what the activate script exports
    of _venv_python.JOB_ENV (and nothing of it where the script does not)."""
    env = dict((k, v) for k, v in os.environ.items() if k not in dict(_venv_python.JOB_ENV))
    activate = os.path.join(venv, 'bin', 'activate')
    if os.path.exists(activate):
        lacking = [pair for path, pairs, _lines in _venv_python.job_env_missing(venv) if path == activate
                   for pair in pairs]
        env.update(pair for pair in _venv_python.JOB_ENV if pair not in lacking)
    env['PYTHONDONTWRITEBYTECODE'] = '1'
    return env


def run_probe(venv, options, timeout):
    """(probe result dict or None, failure message or None)."""
    python = os.path.join(venv, 'bin', 'python')
    if not os.path.exists(python):
        return None, '{0} has no bin/python: not a venv'.format(venv)
    try:
        proc = subprocess.run([python, '-c', PROBE, json.dumps(options)], capture_output=True, text=True,
                              timeout=timeout, check=False, env=job_env(venv))
    except subprocess.TimeoutExpired:
        return None, ('the probe did not finish in {0} s (import torch, CUDA initialisation or the smoke test hung; '
                      'look for a stuck driver or a GPU in a bad state)').format(timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{')]
    try:
        return json.loads(lines[-1]), None
    except (IndexError, ValueError):
        return None, 'the probe died (exit {0}): {1}'.format(proc.returncode, _tail(proc.stderr or proc.stdout))


# What a library's first real call says when it fails, and why (each pattern from a real run's error or stderr).
LIBRARY_WHY = (
    (r'Unable to load any of \{([^,}]+)', "{0} does not load: a file of the venv's distribution that ships it is "
     'missing or unreadable (reinstall that distribution; a drift run repairs it)'),
    (r'CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED', "a sub-library of cuDNN does not load: the venv's nvidia-cudnn "
     'distribution is missing files (reinstall it; a drift run repairs it)'),
    (r'(\S+\.so(?:\.[\d.]+)?): cannot open shared object file', '{0} does not load: it is missing from the venv '
     'and the system (reinstall the distribution that ships it)'),
    (r'CUDNN_STATUS_NOT_INITIALIZED', 'cuDNN did not initialise: its sub-libraries are not found beside '
     "libcudnn.so, or the GPU's memory is exhausted"),
    (r'driver version is insufficient for CUDA runtime version|CUDA_ERROR_UNSUPPORTED_PTX_VERSION|'
     r'provided PTX was compiled with an unsupported toolchain', 'the library is built for a newer CUDA than the '
     "container's userspace driver supports: upgrade the node's driver or pin the library's CUDA build to the "
     "driver's"),
    (r'no kernel image is available for execution on the device|CUDNN_STATUS_ARCH_MISMATCH', 'the library has no '
     "code for this GPU's architecture: install a build that covers its compute capability"),
    (r'out of memory', "the GPU's memory is exhausted: another process holds it"),
)


def library_why(error, stderr=''):
    """Why a library's check failed, read from its error and what the probe printed on stderr; None if unknown."""
    for pattern, why in LIBRARY_WHY:
        m = re.search(pattern, '{0}\n{1}'.format(error or '', stderr or ''))
        if m:
            return why.format(*(g.strip() for g in m.groups()))
    return None


CHECKS = {'cudnn_conv': 'a cuDNN convolution forward and backward matches the CPU',
          'cusparselt_24': "a 2:4 sparse matmul through cuSPARSELt matches the dense one",
          'allreduce': "an all_reduce across the container's GPUs (NCCL; gloo on CPU without one) completes right",
          'shm': "/dev/shm as large as the container's GPUs need",
          'device_order': 'CUDA numbers the GPUs as nvidia-smi does (by PCI bus id)',
          'limits': "the container's open-file and locked-memory limits as its jobs need",
          'train_step': "a small transformer's training step runs"}

# NCCL_DEBUG=INFO's line for each channel's path between two ranks:
#   NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
#   NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0
NCCL_CHANNEL = re.compile(r'NCCL INFO Channel [\d/]+ ?: \S+ -> \S+ (?:\[\w+\] )?via (\S+(?: pointer)?)')
NCCL_SHM_FULL = re.compile(r'NCCL WARN .*failed to extend (/dev/shm/\S+) to (\d+) bytes')


def nccl_paths(output, world):
    """From NCCL's debug output: the transports it chose (P2P, SHM, NET/Socket, NET/IB, ...), its warnings, and notes
    on a fall back from the fast paths between GPUs of one container."""
    paths = sorted(set(m.group(1).split('/')[0] if not m.group(1).startswith('NET/') else '/'.join(
        m.group(1).split('/')[:2]) for m in NCCL_CHANNEL.finditer(output or '')))
    warnings = [line.strip() for line in (output or '').splitlines() if 'NCCL WARN' in line][:20]
    notes = []
    shm = NCCL_SHM_FULL.search(output or '')
    if shm:
        notes.append("/dev/shm is too small for NCCL's shared-memory transport (it could not grow {0} to {1} bytes): "
                     "give the container a larger /dev/shm".format(shm.group(1), shm.group(2)))
    if world > 1 and paths and 'P2P' not in paths:
        if 'SHM' in paths:
            notes.append('NCCL moved data between the GPUs through shared memory, not peer to peer: P2P is blocked '
                         "between them (PCIe ACS or the IOMMU on the node's path, or NCCL_P2P_DISABLE)")
        if any(p.startswith('NET/') for p in paths):
            notes.append('NCCL went through the network inside one container: neither peer to peer nor shared memory '
                         'worked between its GPUs (see /dev/shm and P2P)')
    return {'transports': paths, 'warnings': warnings, 'notes': notes}


def _tail(text, lines=15):
    return '\n'.join((text or '').strip().splitlines()[-lines:])


def device_paths(dev_dir='/dev'):
    """The GPU vendor's device nodes here (NVIDIA's: /dev/nvidia*, not the nvidia-caps directory)."""
    return _gpu.vendor().container_nodes(dev_dir)


def device_access(dev_dir, user):
    """Whether a user of the container may open its NVIDIA nodes: real PVE makes a devN node 0660 root:root where
    the entry gives no mode (LXC.pm), so root passes where a training job's user gets EACCES.
    ({user, nodes: {path: result}}, [failures])."""
    paths = device_paths(dev_dir)
    try:
        nodes = _devnodes.probe_open_as(paths, user) if paths else {}
    except KeyError:
        return {'user': user, 'nodes': {}}, [{'check': 'device_access', 'expected': 'a user {0} in the container'.format(
            user), 'actual': 'no such user'}]
    failures = []
    for path, result in sorted(nodes.items()):
        if result in ('EACCES', 'EPERM'):
            try:
                st = os.stat(path)
                seen = '{0} ({1:04o}, uid {2}, gid {3})'.format(result, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            except OSError:
                seen = result
            failures.append({'check': 'device_access', 'expected': '{0} can open {1}'.format(user, path),
                             'actual': seen, 'why': ERRNO_WHY.get(result, result) + (
                                 '; give the fleet a gpu_mode (0666) or a gpu_gid the user is in' if result == 'EACCES'
                                 else '')})
    return {'user': user, 'nodes': nodes}, failures


def diagnose_devices(dev_dir='/dev', expect_count=None, expect_driver=None, driver=None):
    """Which of the GPU vendor's device nodes exist here, what opening each gives and why, and what is missing."""
    vendor, nodes = _gpu.vendor(), []
    for path in device_paths(dev_dir):
        result = _devnodes.probe_open(path)
        item = {'path': path, 'open': result}
        if result in ERRNO_WHY:
            item['why'] = ERRNO_WHY[result]
        nodes.append(item)
    present = set(os.path.basename(n['path']) for n in nodes)
    gpus = [n for n in present if vendor.gpu_node.match('/dev/' + n)]
    missing = [name for name in vendor.required_nodes if name not in present]
    notes = []
    if not nodes:
        notes.append('no /dev/nvidia* device nodes: the container has no GPU passthrough')
    else:
        if missing:
            notes.append('missing {0}: CUDA needs them (pass them through, and load nvidia-uvm on the node)'.format(
                ', '.join('/dev/' + m for m in missing)))
        if expect_count is not None and len(gpus) < expect_count:
            notes.append('{0} GPU node(s) present, {1} expected: the container was given fewer GPUs'.format(
                len(gpus), expect_count))
        for why in sorted(set(n['why'] for n in nodes if 'why' in n)):
            notes.append('{0}: {1}'.format(', '.join(n['path'] for n in nodes if n.get('why') == why), why))
    if expect_driver and driver and driver != expect_driver:
        notes.append('userspace driver {0} but the node runs kernel module {1}: they must be equal'.format(
            driver, expect_driver))
    elif expect_driver and not driver:
        notes.append('no userspace driver (libcuda.so.1) loads in the container; the node runs {0}'.format(expect_driver))
    return {'nodes': nodes, 'missing': missing, 'notes': notes}


def expectations(params):
    """[(check name, expected, probe key)] for the expectations set."""
    out = []
    for key, probe_key in (('expect_torch_version', 'torch_version'), ('expect_cuda_version', 'cuda_version'),
                           ('expect_device_count', 'device_count'), ('expect_cudnn_version', 'cudnn_version'),
                           ('expect_nccl_version', 'nccl_version'), ('expect_driver_version', 'driver_version')):
        if params.get(key) is not None:
            out.append((probe_key, params[key], probe_key))
    return out


def same(expected, actual):
    if expected is None or actual is None:
        return expected == actual
    return str(expected) == str(actual)


def audit_into(result, venv):
    """The venv audit's findings that explain a probe that failed (why its Python did not start, requirements not
    installed, shared libraries that do not resolve, distributions missing files), into the result and its failures."""
    failures = result['failures']
    try:
        audit = _venv.audit(venv, imports=('torch',))
        result['unresolved_libraries'] = audit['findings']['unresolved_libraries']
        result['broken_distributions'] = audit['findings']['broken_distributions']
        result['missing_requirements'] = audit['findings']['missing_requirements']
        for f in audit['findings']['interpreter']:  # why the venv's Python did not start
            failures.append({'check': 'interpreter', 'expected': 'the venv starts', 'actual': f['msg'],
                             'fix': f['fix']})
        for m in result['missing_requirements']:
            failures.append({'check': 'requirement', 'expected': m['requirement'] + ' installed',
                             'actual': 'not installed (required by {0})'.format(', '.join(m['required_by']))})
        for u in result['unresolved_libraries']:
            failures.append({'check': 'library', 'expected': u['soname'] + ' resolves',
                             'actual': 'not found (needed by {0}; provided by {1})'.format(
                                 ', '.join(u['needed_by'][:3]), ', '.join(u['provided_by']) or 'no installed distribution')})
    except (ValueError, IOError, OSError) as e:
        result['audit_error'] = str(e)


SHM_WHY = ("NCCL's shared-memory transport between the container's GPUs and DataLoader's workers keep their buffers "
           'in /dev/shm; a small one makes NCCL fall back or fail and workers die with a bus error: give the container '
           "a larger /dev/shm (shm_mb in its fleet entry, which gpufleet writes into its config as a tmpfs mount entry; "
           'it takes effect when the container starts)')
# Why the other checks that are no library's call fail, and what to do.
CHECK_WHY = {
    'device_order': ("a job that picks GPU 1 (or CUDA_VISIBLE_DEVICES=1) gets another GPU than nvidia-smi's 1: "
                     "source the venv's activate, which exports CUDA_DEVICE_ORDER=PCI_BUS_ID (a drift run puts it "
                     'back where it is missing), or set it in the job\'s environment'),
    'limits': ("LXC sets the container's limits when it starts it (lxc.prlimit.* in its config): nofile and rdma in "
               'its fleet entry make gpufleet write them; they take effect when the container starts'),
}


def check_failures(result, venv):
    """A failure for each check that failed but the collective's (collective_findings): /dev/shm's with why; each other
    with why from its error, what the library printed on stderr during it and, when one failed, the venv audit: the
    distributions that lack files."""
    found = []
    for c in result.get('checks') or []:
        if c.get('name') == 'shm' and c.get('status') == 'failed':
            result['failures'].append({'check': 'shm', 'expected': '>= {0} MiB'.format(c['floor_bytes'] >> 20),
                                       'actual': '{0} MiB'.format(c['bytes'] >> 20), 'why': SHM_WHY})
        elif c.get('status') == 'failed' and c['name'] != 'allreduce':  # the collective's: collective_findings
            failure = {'check': c['name'], 'expected': CHECKS.get(c['name'], c['name']), 'actual': c.get('error')}
            if c.get('device') is not None:
                failure['device'] = c['device']
            if c['name'] in CHECK_WHY:  # the container's, not the venv's: no audit to read
                result['failures'].append(dict(failure, why=CHECK_WHY[c['name']]))
                continue
            found.append((failure, library_why(c.get('error'), c.get('stderr'))))
    if found:
        audit_into(result, venv)
    lacking = ['{0} {1} lacks {2}'.format(b['name'], b['version'], ', '.join(sorted(b['missing'] + b['modified'])[:3]))
               for b in result.get('broken_distributions') or []]
    for failure, why in found:
        why = '; '.join(([why] if why else []) + lacking)
        if why:
            failure['why'] = why
        result['failures'].append(failure)


def collective_findings(result, floor=None):
    """The collective's check read: NCCL's transports, warnings and notes in place of its raw output, and a failure
    when it failed or its bandwidth is under the floor (GB/s of algorithm bandwidth, as nccl-tests reports it)."""
    for c in result.get('checks') or []:
        if c.get('name') != 'allreduce':
            continue
        output = c.pop('output', '')
        if c.get('backend') == 'nccl':
            c.update(nccl_paths(output, c.get('world') or 0))
        why = '; '.join(c.get('notes') or []) or library_why(c.get('error'), output)
        if c.get('status') == 'failed':
            failure = {'check': 'allreduce', 'expected': CHECKS['allreduce'], 'actual': c.get('error')}
            if why:
                failure['why'] = why
            result['failures'].append(failure)
        elif floor and c.get('algbw_gbps') is not None and c['algbw_gbps'] < floor:
            failure = {'check': 'allreduce_gbps', 'expected': '>= {0} GB/s'.format(floor), 'actual': c['algbw_gbps']}
            if why:
                failure['why'] = why
            result['failures'].append(failure)


def _baseline(path):
    """The baseline kept at path, or None."""
    found = _files.read_json(path)
    return found if isinstance(found, dict) else None


def _comparable(base, now):
    """Whether a baseline was taken by the same step on the same device as now."""
    return bool(base) and (base.get('device'), base.get('step')) == (now['device'], now['step'])


def throughput_now(result):
    """What the training step measured, with what it ran on: {tokens_per_s (the slowest device's), step, device,
    torch_version, driver_version, venv (the venv's real path)}, or None where it did not run."""
    ran = [c for c in result.get('checks') or [] if c.get('name') == 'train_step' and c.get('status') == 'ok']
    if not ran:
        return None
    devices = result.get('devices') or []
    return {'tokens_per_s': min(c['tokens_per_s'] for c in ran), 'step': ran[0].get('step'),
            'device': devices[0].get('name') if devices else 'cpu', 'torch_version': result.get('torch_version'),
            'driver_version': result.get('driver_version'), 'venv': os.path.realpath(result['venv'])}


def throughput(result, path, drop=None):
    """The training step against the container's baseline at path (its first good result: record_baseline writes
    it): result['throughput'] {tokens_per_s, baseline, ratio}, and a failure where it fell more than drop (0.15) below
    it that names the drop and what changed since. A baseline of another device or step is not compared."""
    now = throughput_now(result)
    if now is None:
        return
    drop = 0.15 if drop is None else drop
    base = _baseline(path)
    result['throughput'] = {'tokens_per_s': now['tokens_per_s'], 'baseline': base, 'ratio': None}
    if not _comparable(base, now) or not base.get('tokens_per_s'):
        return
    ratio = now['tokens_per_s'] / float(base['tokens_per_s'])
    result['throughput']['ratio'] = round(ratio, 3)
    if ratio >= 1 - drop:
        return
    changed = ['{0} {1} -> {2}'.format(k.replace('_', ' '), base.get(k), now[k])
               for k in ('venv', 'torch_version', 'driver_version') if base.get(k) != now[k]]
    result['failures'].append({
        'check': 'throughput', 'expected': '>= {0:.0f} tokens/s ({1:.0%} below the baseline {2} of {3})'.format(
            base['tokens_per_s'] * (1 - drop), drop, base['tokens_per_s'], base.get('recorded_at')),
        'actual': now['tokens_per_s'],
        'why': '{0:.0%} below the baseline; since it: {1}'.format(1 - ratio, '; '.join(changed) if changed else (
            'nothing the verification sees changed (venv, torch, driver): look at the node (clocks, temperature, '
            'other jobs on its GPUs)'))})


def record_baseline(result, path, now=None):
    """Keep the training step of a passing verification as the container's baseline where it has none (or one of
    another device or step); True where written."""
    found = throughput_now(result)
    if found is None or _comparable(_baseline(path), found):
        return False
    found['recorded_at'] = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now or time.time()))
    _files.write_json(path, found)
    return True


def verify(venv, params, dev_dir='/dev'):
    """The facts and every failure ({check, expected, actual, why}); never changes anything."""
    started = time.time()
    options = dict((k, params.get(k)) for k in (
        'smoke', 'compile_check', 'compile_backend', 'collective', 'collective_timeout', 'collective_bytes',
        'min_shm_mb_per_gpu', 'shm_dir', 'train_step', 'min_nofile', 'memlock_unlimited', 'limits_file'))
    if params.get('collective'):
        options['self'] = PROBE  # a collective's NCCL ranks run the probe's own code
    probe, problem = run_probe(venv, options, params.get('timeout') or 300)
    result = {'venv': venv, 'failures': [], 'timings': {}}
    failures = result['failures']
    if problem:
        failures.append({'check': 'probe', 'expected': 'the probe runs', 'actual': problem})
    elif 'import_error' in probe:
        failures.append({'check': 'import', 'expected': 'import torch works', 'actual': probe['import_error']})
    if problem or 'import_error' in (probe or {}):
        audit_into(result, venv)
        probe = probe or {}
    result.update((k, v) for k, v in probe.items() if k != 'timings')
    result['timings'] = dict(probe.get('timings') or {})
    if not problem and 'import_error' not in probe:
        for check, expected, key in expectations(params):
            actual = probe.get(key)
            if not same(expected, actual):
                failures.append({'check': check, 'expected': expected, 'actual': actual})
        if params.get('require_cuda') and not probe.get('cuda_available'):
            failures.append({'check': 'cuda_available', 'expected': True, 'actual': False,
                             'why': probe.get('cuda_error') or (
                                 'torch {0} is a CPU build (torch.version.cuda is None)'.format(probe.get('torch_version'))
                                 if not probe.get('cuda_version') else 'torch.cuda.is_available() is False')})
        for d in probe.get('devices') or []:
            if not d.get('arch_supported', True):
                failures.append({'check': 'arch', 'expected': 'sm_{0} in torch.cuda.get_arch_list()'.format(
                    d['capability'].replace('.', '')), 'actual': probe.get('arch_list'), 'device': d['index']})
            if 'matmul_rel_error' in d and not d['matmul_rel_error'] < 0.02:
                failures.append({'check': 'matmul', 'expected': 'bf16 matmul within 2% of CPU', 'device': d['index'],
                                 'actual': 'relative error {0:.4f}'.format(d['matmul_rel_error'])})
            floor = params.get('min_tflops')
            if floor and 'bf16_tflops' in d and d['bf16_tflops'] < floor:
                failures.append({'check': 'tflops', 'expected': '>= {0}'.format(floor), 'actual': d['bf16_tflops'],
                                 'device': d['index']})
        if params.get('smoke') == 'matmul' and probe.get('cuda_available') and not probe.get('devices'):
            failures.append({'check': 'matmul', 'expected': 'a device to run on', 'actual': 'none'})
        check_failures(result, venv)
        collective_findings(result, params.get('min_allreduce_gbps'))
        if params.get('baseline_path'):
            throughput(result, params['baseline_path'], params.get('max_throughput_drop'))
        if params.get('compile_check') and not probe.get('compile_ok'):
            failures.append({'check': 'compile', 'expected': 'torch.compile works', 'actual': probe.get('compile_error')})
    if params.get('user') not in (None, ''):
        result['device_access'], denied = device_access(dev_dir, params['user'])
        failures.extend(denied)
    short = (params.get('require_cuda') and not probe.get('cuda_available')) or (
        params.get('expect_device_count') is not None and (probe.get('device_count') or 0) < params['expect_device_count'])
    driver_off = params.get('expect_driver_version') and probe.get('driver_version') != params['expect_driver_version']
    if short or driver_off:
        result['diagnosis'] = diagnose_devices(dev_dir, params.get('expect_device_count'),
                                               params.get('expect_driver_version'), probe.get('driver_version'))
    result['timings']['total_s'] = round(time.time() - started, 3)
    return result


def message(result):
    parts = []
    for f in result['failures']:
        text = '{0}: expected {1}, got {2}'.format(f['check'], f['expected'], f['actual'])
        if 'device' in f:
            text = 'device {0} {1}'.format(f['device'], text)
        parts.append(text)
    notes = (result.get('diagnosis') or {}).get('notes') or []
    return '; '.join(parts) + ('. Diagnosis: ' + '; '.join(notes) if notes else '')
