"""The verification probe (torch_verify's work) without torch: a venv whose probe cannot run, or dies, is a failure
named 'probe' with what happened, never a verification without failures; a venv without torch fails its import."""

import os

from ansible_collections.gpufleet.proxmox.plugins.module_utils import _torch_probe

from fixtures import make_venv

PARAMS = {'expect_torch_version': '2.11.0+cu128', 'expect_device_count': 1, 'require_cuda': True, 'timeout': 60}


def test_a_path_that_is_no_venv_is_a_probe_failure(tmp_path):
    result = _torch_probe.verify(str(tmp_path / 'none'), PARAMS, dev_dir=str(tmp_path))
    assert result['failures'][0] == {'check': 'probe', 'expected': 'the probe runs',
                                     'actual': '{0} has no bin/python: not a venv'.format(tmp_path / 'none')}


def test_a_probe_that_dies_is_a_probe_failure_with_its_last_words(tmp_path):
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True)
    python = venv / 'bin' / 'python'
    python.write_text('#!/bin/sh\necho "Segmentation fault" >&2\nexit 139\n')
    python.chmod(0o755)
    result = _torch_probe.verify(str(venv), PARAMS, dev_dir=str(tmp_path))
    assert result['failures'][0] == {'check': 'probe', 'expected': 'the probe runs',
                                     'actual': 'the probe died (exit 139): Segmentation fault'}
    assert 'torch_version' not in result


def test_a_venv_without_torch_fails_its_import(tmp_path):
    venv, _site = make_venv(tmp_path / 'venv')
    result = _torch_probe.verify(venv, PARAMS, dev_dir=str(tmp_path))
    assert [f['check'] for f in result['failures']][:1] == ['import']
    assert "No module named 'torch'" in result['failures'][0]['actual']
    assert os.path.isdir(venv)
