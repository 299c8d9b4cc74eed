# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Venv profiles on the controller: where a profile is, the Pythons its lock is for, and the Python each PVE
template brings, so that a container whose Python no lock covers is refused before anything changes (the fleet
plan, the doctor) rather than found by its build."""

import os
import re

import yaml

FILES = ('profile.yml', 'requirements.lock')
# The collection's own profiles (roles/torch_venv/files/profiles), beside this file in an installed collection too.
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'roles',
                       'torch_venv', 'files', 'profiles')

# The python3 of PVE's system templates, by the name pveam gives them (proxmox/dab-pve-appliances: each template
# is its Debian or Ubuntu release's standard system; python3 is the release's python3-defaults).
TEMPLATE_PYTHONS = (
    (re.compile(r'^debian-11-standard_'), '3.9'),
    (re.compile(r'^debian-12-standard_'), '3.11'),
    (re.compile(r'^debian-13-standard_'), '3.13'),
    (re.compile(r'^ubuntu-22\.04-standard_'), '3.10'),
    (re.compile(r'^ubuntu-24\.04-standard_'), '3.12'),
    (re.compile(r'^ubuntu-25\.04-standard_'), '3.13'),
)


def template_python(volid):
    """The Python (X.Y) a PVE template brings, from its volume id (local:vztmpl/debian-13-standard_13.1-2_amd64...),
    or None for a template this table does not know."""
    name = str(volid or '').rsplit('/', 1)[-1]
    return next((python for pattern, python in TEMPLATE_PYTHONS if pattern.match(name)), None)


def pythons(meta):
    """The Pythons (X.Y) a profile's lock is for: profile.yml's python, one version or a list of them."""
    given = (meta or {}).get('python')
    listed = [given] if isinstance(given, (str, int, float)) else list(given or [])
    return [str(v) for v in listed]


def directory(profile, profiles_dir=''):
    """A profile's directory: profile itself where it is a path, else the shipped (or profiles_dir's) one of that
    name."""
    profile = str(profile)
    return profile if '/' in profile else os.path.join(profiles_dir or SHIPPED, profile)


def read_meta(path):
    """A profile directory's profile.yml (a dict); raises ValueError where it is missing or not a mapping."""
    try:
        with open(os.path.join(path, 'profile.yml'), 'rb') as fh:
            meta = yaml.safe_load(fh) or {}
    except (IOError, OSError) as e:
        raise ValueError('{0} is not a venv profile: {1}'.format(path, e))
    if not isinstance(meta, dict):
        raise ValueError('{0}/profile.yml is not a mapping'.format(path))
    return meta


def relock_fix(profile, python, path):
    """What makes a profile's lock cover one more Python."""
    return 'add "{0}" to python in {1}/profile.yml, then: gpufleet profile lock {1}'.format(python, path)
