# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r'''
name: venv_profile
short_description: Read a venv profile on the controller (its profile.yml and its lock)
version_added: 0.2.0
description:
  - Reads a torch_venv profile directory, the one the role builds a container's venv from.
  - Fails before anything is changed, naming the directory, the files that are missing and the command
    that makes the lock, when the directory is not a complete profile (C(profile.yml) and
    C(requirements.lock)), and when C(profile.yml) is not a mapping.
author:
  - gpufleet maintainers (@gpufleet)
options:
  _terms:
    description: Profile directories (a relative one is looked for in the role's C(files/) and the playbook's).
    required: true
    type: list
    elements: path
'''

EXAMPLES = r'''
- name: What the default profile expects of torch
  ansible.builtin.debug:
    msg: "{{ lookup('gpufleet.proxmox.venv_profile', role_path ~ '/files/profiles/default').meta.expect }}"
'''

RETURN = r'''
_raw:
  description: One entry a directory.
  type: list
  elements: dict
  contains:
    name:
      description: The profile's name (the directory's name).
    dir:
      description: The directory.
    meta:
      description: C(profile.yml) (overrides, install_args, imports, expect, python, platform).
    lock:
      description: The text of C(requirements.lock), as it is on disk.
'''

import copy
import os

from ansible.errors import AnsibleLookupError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.lookup import LookupBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.proxmox.plugins.plugin_utils import _profile

display = Display()

FILES = _profile.FILES
_READ = {}


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [self._read(term, variables) for term in terms]

    def _read(self, term, variables):
        found = self.find_file_in_search_path(variables, 'files', term, ignore_missing=True) or term
        have = sorted(os.listdir(found)) if os.path.isdir(found) else []
        missing = [f for f in FILES if f not in have]
        if missing:
            raise AnsibleLookupError(
                'torch_venv_profile: {0} is not a complete venv profile (it needs {1}; {2} missing; found {3}). '
                'Make its lock with: gpufleet profile lock {0}'.format(term, ' and '.join(FILES), ', '.join(missing),
                                                                       have))
        # A role refers to its profile several times in one task, and each reference reads it again: read each
        # version of the files once per process (the key changes when either file does).
        key = (found,) + tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in
                               (os.stat(os.path.join(found, f)) for f in FILES))
        if key not in _READ:
            _READ[key] = self._load(term, found)
        return copy.deepcopy(_READ[key])

    @staticmethod
    def _load(term, found):
        try:
            meta = _profile.read_meta(found)
        except ValueError:
            raise AnsibleLookupError('torch_venv_profile: {0}/profile.yml is not a mapping'.format(term))
        with open(os.path.join(found, 'requirements.lock'), 'rb') as fh:
            lock = to_text(fh.read())
        display.vvvv('venv_profile: read {0}'.format(found))
        return {'name': os.path.basename(os.path.normpath(term)), 'dir': found, 'meta': meta, 'lock': lock}
