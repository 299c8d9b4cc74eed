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

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _devnodes, _gpu, _venv

# Runs with the venv's interpreter; prints one JSON document on its last line. argv[1]: options as JSON.
PROBE = r'''
import json, os, re, sys, time, traceback
opts = json.loads(sys.argv[1])
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
    with tempfile.TemporaryFile() as said:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(said.fileno(), 2)
        try:
            c.update(run() or {})
            c["status"] = "failed" if c.get("error") else "ok"
        except Exception as e:
            c["status"], c["error"] = "failed", "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            said.seek(0)
            text = said.read().decode("utf-8", "replace").strip()
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
        out["compile_error"] = "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
    out["timings"]["compile_s"] = round(time.monotonic() - t, 3)
done()
'''

ERRNO_WHY = {
    'EPERM': "the container's device cgroup denies it (passthrough or cgroup rules wrong)",
    'EACCES': 'permission denied (the node is not readable and writable by this user)',
    'ENXIO': 'no driver behind the node (the NVIDIA kernel module on the node is not loaded, or the GPU is gone)',
    'ENODEV': 'no driver behind the node (the NVIDIA kernel module on the node is not loaded, or the GPU is gone)',
}


def run_probe(venv, options, timeout):
    """(probe result dict or None, failure message or None)."""
    python = os.path.join(venv, 'bin', 'python')
    if not os.path.exists(python):
        return None, '{0} has no bin/python: not a venv'.format(venv)
    try:
        proc = subprocess.run([python, '-c', PROBE, json.dumps(options)], capture_output=True, text=True,
                              timeout=timeout, check=False, env=dict(os.environ, PYTHONDONTWRITEBYTECODE='1'))
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
          'cusparselt_24': "a 2:4 sparse matmul through cuSPARSELt matches the dense one"}


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


def library_failures(result, venv):
    """A failure for each library check that failed, with why (from its error, what the library printed on stderr
    during the check and, when one failed, the venv audit: the distributions that lack files)."""
    found = []
    for c in result.get('checks') or []:
        if c.get('status') == 'failed':
            failure = {'check': c['name'], 'expected': CHECKS.get(c['name'], c['name']), 'actual': c.get('error')}
            if c.get('device') is not None:
                failure['device'] = c['device']
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


def verify(venv, params, dev_dir='/dev'):
    """The facts and every failure ({check, expected, actual, why}); never changes anything."""
    started = time.time()
    options = dict((k, params.get(k)) for k in ('smoke', 'compile_check', 'compile_backend'))
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
        library_failures(result, venv)
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
