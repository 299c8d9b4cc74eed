# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The record a passing verification leaves in its venv (torch_verify writes it, venv_build reads it back): the
result, when it was made, and the fingerprint of what it depended on."""


import os
import time

from ansible_collections.gpufleet.proxmox.plugins.module_utils._files import read_json, write_json

RECORD = 'gpufleet-verified.json'


def write_record(venv, fingerprint, result, now=None):
    """Keep a passing verification in the venv (the link's target), under the caller's fingerprint of what it
    depended on: a later run that computes the same fingerprint may reuse it instead of importing torch."""
    kept = dict((k, v) for k, v in result.items() if k not in ('changed', 'failed', 'msg'))
    write_json(os.path.join(os.path.realpath(venv), RECORD),
               {'fingerprint': fingerprint, 'verified_at': int(now or time.time()), 'result': kept})


def read_record(venv, now=None):
    """The venv's record of its last passing verification, with age_s (its age on this clock), or None."""
    record = read_json(os.path.join(venv, RECORD))
    if not isinstance(record, dict) or not isinstance(record.get('verified_at'), (int, float)):
        return None
    return dict(record, age_s=int((now or time.time()) - record['verified_at']))
