"""The repair of an active venv through deploy, as venv_build runs it in `gpufleet drift --fix` (audit and repair
on) and in a check run (only said): on a venv laid out here (tests/unit/fixtures.py) that lost a library of its
NVIDIA wheel, with an installer at req.uv that records what it is asked and puts the wheel's files back, as
`uv pip install` does from its cache (the lab's tests run the real uv)."""

import json
import os
import shutil
import sys

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _venv_build

from fixtures import torch_like_venv

LOCK = ('nvidia-cudnnx==9.19.0 --hash=sha256:' + 'a' * 64 + '\ntorchlike==2.11.0 --hash=sha256:' + 'b' * 64 + '\n')
LIBRARY = 'nvidia/cudnnx/lib/libcudnnx.so.9'


def lose_the_library(site):
    os.remove(os.path.join(site, LIBRARY))


def active_venv(tmp_path, breaks=lose_the_library):
    """A Store whose active venv is the lock's (nothing to build or switch), broken by breaks(site) (its library
    gone, by default); the request that audits and repairs it with the recording installer, whose install puts the
    venv's files back as they were installed; where that installer logs its calls."""
    lock = tmp_path / 'requirements.lock'
    lock.write_text(LOCK)
    store = _venv_build.Store(str(tmp_path / 'venvs'), str(tmp_path / 'venv'))
    vid = _venv_build.venv_id(LOCK, (), _venv_build.python_version(sys.executable))
    _venv, site = torch_like_venv(store.path(vid))
    with open(os.path.join(store.path(vid), _venv_build.MARKER), 'w') as fh:
        json.dump({'id': vid, 'meta': {'profile': 'p'}}, fh)
    shutil.copy(str(lock), os.path.join(store.path(vid), _venv_build.LOCK_COPY))
    os.symlink(store.path(vid), store.link)
    store.record([vid])
    saved = tmp_path / 'installed'
    shutil.copytree(site, str(saved), symlinks=True)
    breaks(site)
    calls = tmp_path / 'calls'
    uv = tmp_path / 'uv'
    uv.write_text('#!/bin/sh\necho "$*" >> {0}\ncase "$2" in install) cp -a {1}/. {2}/ ;; esac\n'.format(
        calls, saved, site))
    uv.chmod(0o755)

    def request(check):
        return _venv_build.Request(root=store.root, link=store.link, lock_path=str(lock), python=sys.executable,
                                   uv=str(uv), imports=('torchlike',), audit=True, repair=True, check=check)
    return store, site, request, calls


def test_drift_fix_repairs_the_active_venv_and_audits_it_again(tmp_path):
    store, site, request, calls = active_venv(tmp_path)
    result = _venv_build.deploy(request(check=False))
    assert result['audit']['healthy'] is False
    assert [u['soname'] for u in result['audit']['findings']['unresolved_libraries']] == ['libcudnnx.so.9']
    assert result['changed'] is True and result['repaired'] is True and result['rebuilt'] is False
    assert result['repair_audit']['healthy'] is True
    assert os.path.exists(os.path.join(site, LIBRARY))
    python = os.path.join(store.link, 'bin', 'python')
    assert calls.read_text().splitlines() == [
        'pip uninstall --python {0} nvidia-cudnnx'.format(python),
        'pip install --python {0} --no-deps nvidia-cudnnx==9.19.0'.format(python)]


def test_a_check_run_says_it_would_repair_and_changes_nothing(tmp_path):
    _store, site, request, calls = active_venv(tmp_path)
    result = _venv_build.deploy(request(check=True))
    assert result['audit']['healthy'] is False
    assert result['changed'] is True and result['repaired'] is False and 'repair_audit' not in result
    assert not calls.exists() and not os.path.exists(os.path.join(site, LIBRARY))


def test_a_dist_info_without_its_record_is_removed_and_its_distribution_installed_again(tmp_path):
    # no installer uninstalls a distribution whose RECORD is gone ("RECORD file not found"): its dist-info goes first
    def lose_the_record(site):
        os.remove(os.path.join(site, 'torchlike-2.11.0.dist-info', 'RECORD'))
    store, site, request, calls = active_venv(tmp_path, lose_the_record)
    result = _venv_build.deploy(request(check=False))
    assert result['audit']['findings']['broken_distributions'] == [
        {'name': 'torchlike', 'version': '2.11.0', 'missing': ['torchlike-2.11.0.dist-info/RECORD'], 'modified': []}]
    # (the audit reads the venv through the link the container uses)
    assert result['audit']['plan'][0] == ['rm', '-rf', '--', os.path.join(result['audit']['site_packages'],
                                                                          'torchlike-2.11.0.dist-info')]
    python = os.path.join(store.link, 'bin', 'python')
    assert calls.read_text().splitlines() == ['pip install --python {0} --no-deps torchlike==2.11.0'.format(python)]
    assert result['repair_audit']['healthy'] is True
    assert os.path.exists(os.path.join(site, 'torchlike-2.11.0.dist-info', 'RECORD'))
