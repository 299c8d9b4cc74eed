# -*- coding: utf-8 -*-
# Copyright: gpufleet.proxmox contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over the fleet definition and its reports (the logic lives in module_utils/_fleet, plugin_utils/_drift and plugin_utils/_verdict).
Each filter imports its module_utils when it is called: Ansible loads this file in every worker that uses any of
its filters, and most use one."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib


def _utils(name):
    where = 'module_utils' if name == '_fleet' else 'plugin_utils'
    return importlib.import_module('ansible_collections.gpufleet.proxmox.plugins.{0}.{1}'.format(where, name))


def fleet_hosts(running, fleet, devices=None):
    return _utils('_fleet').hosts(running, fleet, devices)


def fleet_raw(fleet, nodes, majors):
    return _utils('_fleet').raw(fleet, nodes, majors)


def fleet_power(specs, restart):
    return _utils('_fleet').power(specs, restart)


def fleet_verify_summary(reports, containers, reconcile, run=None, check_mode=False):
    return _utils('_verdict').fleet(reports, containers, reconcile, run, check_mode)


def fleet_drift(data, kind, *args):
    """kind node: data = gpu_devices facts; containers: data = lxc_container result,
    args = (fleet,); container: data = a container's variables (hostvars[name]: its driver, build and report);
    unverified: data = the verify role's verify_fleet; summary: data = {nodes, containers},
    args = (check_mode,); reports: data = a summary, the files of the drift run (one per host, and the summary)."""
    if kind == 'node':
        return _utils('_drift').node(data, *args)
    if kind == 'containers':
        return _utils('_drift').containers(data, *args)
    if kind == 'container':
        return _utils('_drift').container(driver=data.get('gpu_container_driver'), build=data.get('torch_venv_build'),
                                          report=(data.get('ansible_facts') or {}).get('verify_report'))
    if kind == 'unverified':
        return _utils('_drift').unverified(data)
    if kind == 'summary':
        return _utils('_drift').summary(data.get('nodes'), data.get('containers'), *args)
    if kind == 'reports':
        return _utils('_drift').reports(data)
    raise ValueError('fleet_drift: kind must be node, containers, container, unverified, summary or reports, got {0!r}'.format(kind))


class FilterModule(object):
    def filters(self):
        return {'fleet_raw': fleet_raw, 'fleet_power': fleet_power,
                'fleet_hosts': fleet_hosts, 'fleet_verify_summary': fleet_verify_summary, 'fleet_drift': fleet_drift}
